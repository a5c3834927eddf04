package operator

import (
	"context"
	"fmt"
	"net"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/envoy"
	"github.com/netop-dev/netop/internal/pki"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/networks"
	"github.com/netop-dev/netop/internal/webhook/pods"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v1"
)

// admission is the webhook server and what it reads.
type admission struct {
	opts     *Options
	kube     kubernetes.Interface
	certs    *webhook.CertManager
	server   *webhook.Server
	listener net.Listener
}

// newAdmission opens the webhook listener and prepares the handlers. The
// envoy templates are the only ConfigMaps cached.
func newAdmission(ctx context.Context, o *Options, kube kubernetes.Interface,
	templates informers.SharedInformerFactory, networkLister samplecrdlisters.NetworkLister, recorder record.EventRecorder) (*admission, error) {
	l, err := net.Listen("tcp", o.WebhookAddr)
	if err != nil {
		return nil, fmt.Errorf("--webhook-addr: %w", err)
	}
	serving := pki.ServingCert{CommonName: "netop-webhook"}
	if o.WebhookLocal {
		serving.IPs = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		svc := o.WebhookService + "." + o.OperatorNamespace + ".svc"
		serving.DNSNames = []string{svc, svc + ".cluster.local"}
	}
	var store webhook.CertStore = webhook.SecretStore{Client: kube, Namespace: o.OperatorNamespace, Name: "netop-webhook-cert"}
	if o.WebhookCertDir != "" {
		store = webhook.FileStore{Dir: o.WebhookCertDir}
	}
	a := &admission{opts: o, kube: kube, certs: webhook.NewCertManager(store, serving), listener: l}
	a.server = webhook.NewServer(a.certs)
	netAdmission := &networks.Admission{Networks: networkLister}
	a.server.Handle(ctx, webhook.PathValidateNetwork, webhook.HandlerFunc(netAdmission.Validate))
	a.server.Handle(ctx, webhook.PathMutateNetwork, webhook.HandlerFunc(netAdmission.Default))
	injector := pods.Injector{
		ConfigMaps:        templates.Core().V1().ConfigMaps().Lister(),
		OperatorNamespace: o.OperatorNamespace,
		Recorder:          recorder,
	}
	a.server.Handle(ctx, webhook.PathInjectEnvoy, &injector)
	namespaceInjector := injector
	namespaceInjector.NamespaceOptIn = true
	a.server.Handle(ctx, webhook.PathInjectEnvoyNamespace, &namespaceInjector)
	return a, nil
}

// templateInformers caches only the ConfigMaps named envoy-initializer.
func templateInformers(kube kubernetes.Interface, resync time.Duration) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(kube, resync,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", envoy.ConfigMapName).String()
		}),
		informers.WithTransform(dropManagedFields))
}

// run gets the certificate, serves, and registers the webhooks once the
// server answers; the caches must be synced before requests arrive, which
// Run ensures by starting the server after WaitForCacheSync.
func (a *admission) run(ctx context.Context) error {
	if err := a.certs.Ensure(ctx); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- a.server.Run(ctx, a.listener) }()
	target := webhook.Target{Service: &admissionregistrationv1.ServiceReference{
		Namespace: a.opts.OperatorNamespace, Name: a.opts.WebhookService, Port: ptr.To[int32](443),
	}}
	if a.opts.WebhookLocal {
		target = webhook.Target{URL: "https://" + a.listener.Addr().String()}
	}
	register := func(ctx context.Context, caBundle []byte) error {
		return webhook.Register(ctx, a.kube, target, a.opts.OperatorNamespace, caBundle)
	}
	if err := register(ctx, a.certs.CABundle()); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Admission webhooks registered", "target", target.URL, "service", a.opts.WebhookService)
	go a.certs.RenewLoop(ctx, time.Hour, register)
	return <-errc
}
