package kubeclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// ConfigFlags say where the cluster is, the way kubectl users expect:
// --kubeconfig, then $KUBECONFIG and ~/.kube/config, then the in-cluster
// service account.
type ConfigFlags struct {
	Kubeconfig string
	Master     string
}

// AddFlags registers the flags on fs.
func (c *ConfigFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Defaults to $KUBECONFIG, then ~/.kube/config, then the in-cluster configuration.")
	fs.StringVar(&c.Master, "master", "", "The address of the API server. Overrides the server in the kubeconfig.")
}

// RESTConfig loads the client configuration.
func (c *ConfigFlags) RESTConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{}
	overrides.ClusterInfo.Server = c.Master
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading client configuration: %w", err)
	}
	return cfg, nil
}

// ClusterID returns the cluster identity: the UID of the kube-system
// namespace, which every cluster has, which never changes, and which
// differs between clusters. The API server makes the namespace right after
// it starts, so a fresh one gets a few seconds.
func ClusterID(ctx context.Context, kube kubernetes.Interface) (string, error) {
	var uid string
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ns, err := kube.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
		switch {
		case err == nil:
			uid = string(ns.UID)
			return true, nil
		case apierrors.IsNotFound(err):
			lastErr = err
			return false, nil
		default:
			return false, err
		}
	})
	if err != nil {
		return "", fmt.Errorf("cluster identity: reading the UID of namespace %s (or set --cluster-id): %w", metav1.NamespaceSystem, errors.Join(err, lastErr))
	}
	klog.FromContext(ctx).V(1).Info("Cluster identity", "cluster", uid)
	return uid, nil
}

// Options are the flags of netop's API clients.
type Options struct {
	// QPS and Burst limit the API requests. client-go's defaults (5 and
	// 10) would make 2,000 status writes take 400 s.
	QPS   float32
	Burst int
	// ContentType is the encoding of requests for built-in resources
	// (Protobuf or JSON); Networks are always JSON.
	ContentType string
}

// NewOptions returns the defaults of an operator.
func NewOptions() Options { return Options{QPS: 100, Burst: 200, ContentType: Protobuf} }

// AddFlags registers the client's flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Queries per second the operator may send to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of queries the operator may send to the API server above --kube-api-qps.")
	fs.StringVar(&o.ContentType, "kube-api-content-type", o.ContentType, "Encoding of the requests for built-in resources (pods, deployments, configmaps, events, leases, nodes): application/vnd.kubernetes.protobuf or application/json. Networks and other custom resources are always JSON.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	switch {
	case o.QPS <= 0:
		return fmt.Errorf("--kube-api-qps must be positive, got %v", o.QPS)
	case o.Burst < 1:
		return fmt.Errorf("--kube-api-burst must be at least 1, got %d", o.Burst)
	case ValidContentType(o.ContentType) != nil:
		return fmt.Errorf("--kube-api-content-type: %w", ValidContentType(o.ContentType))
	}
	return nil
}
