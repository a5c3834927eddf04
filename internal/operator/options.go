// Package operator wires netop's controllers to a cluster: client
// configuration, informers and the controllers' options. Both binaries,
// netop (any cluster) and netop-standalone (embedded control plane), run it,
// so the operator behaves the same in either.
package operator

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options are the operator's settings, each a command-line flag.
type Options struct {
	// QPS and Burst limit the operator's API requests. client-go's defaults
	// (5 and 10) would make 2,000 status writes take 400 s.
	QPS   float32
	Burst int
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		QPS:   100,
		Burst: 200,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Queries per second the operator may send to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of queries the operator may send to the API server above --kube-api-qps.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	if o.QPS <= 0 {
		return fmt.Errorf("--kube-api-qps must be positive, got %v", o.QPS)
	}
	if o.Burst < 1 {
		return fmt.Errorf("--kube-api-burst must be at least 1, got %d", o.Burst)
	}
	return nil
}

// ClientConfigFlags say where the cluster is, the way kubectl users expect:
// --kubeconfig, then $KUBECONFIG and ~/.kube/config, then the in-cluster
// service account.
type ClientConfigFlags struct {
	Kubeconfig string
	Master     string
}

// AddFlags registers the flags on fs.
func (c *ClientConfigFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Defaults to $KUBECONFIG, then ~/.kube/config, then the in-cluster configuration.")
	fs.StringVar(&c.Master, "master", "", "The address of the API server. Overrides the server in the kubeconfig.")
}

// RESTConfig loads the client configuration.
func (c *ClientConfigFlags) RESTConfig() (*rest.Config, error) {
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
