package operator

import (
	"context"
	"fmt"
	"net"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/envoy"
	"github.com/netop-dev/netop/internal/pki"
	"github.com/netop-dev/netop/internal/webhook"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v1"
)

// admission is the webhook server and what it reads.
type admission struct {
	opts     *Options
	kube     kubernetes.Interface
	certs    *webhook.CertManager
	server   *webhook.Server
	webhooks webhook.Set
	listener net.Listener
}

// newAdmission opens the webhook listener and prepares the handlers. The
// envoy templates are the only ConfigMaps cached.
func newAdmission(ctx context.Context, o *Options, kube kubernetes.Interface,
	templates kubeinformers.SharedInformerFactory, networkLister samplecrdlisters.NetworkLister, recorder record.EventRecorder) (*admission, error) {
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
	a.webhooks = webhooks(webhookDeps{
		networks:          networkLister,
		templates:         templates.Core().V1().ConfigMaps().Lister(),
		recorder:          recorder,
		decoder:           webhook.NewDecoder(scheme),
		operatorNamespace: o.OperatorNamespace,
	})
	a.server.Mount(ctx, a.webhooks)
	return a, nil
}

// templateInformers caches only the ConfigMaps named envoy-initializer.
func templateInformers(kube kubernetes.Interface, resync time.Duration) kubeinformers.SharedInformerFactory {
	return kubeinformers.NewSharedInformerFactoryWithOptions(kube, resync,
		kubeinformers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", envoy.ConfigMapName).String()
		}),
		kubeinformers.WithTransform(dropManagedFields))
}

// run waits for the caches the webhooks answer from (synced is closed),
// gets the certificate, serves, and registers the webhooks. A stop at any
// point is a clean stop.
func (a *admission) run(ctx context.Context, synced <-chan struct{}) error {
	defer func() { _ = a.listener.Close() }()
	select {
	case <-ctx.Done():
		return nil
	case <-synced:
	}
	if err := a.certs.Ensure(ctx); err != nil {
		return stopped(ctx, err)
	}
	// The server and the renewal loop stop with ctx, and run returns only
	// after both did, so that nothing writes after the operator stopped.
	var wg wait.Group
	defer wg.Wait() // after the cancel below: defers run last first
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	wg.Start(func() { errc <- a.server.Run(ctx, a.listener) })
	target := webhook.Target{Service: &admissionregistrationv1.ServiceReference{
		Namespace: a.opts.OperatorNamespace, Name: a.opts.WebhookService, Port: ptr.To[int32](443),
	}}
	if a.opts.WebhookLocal {
		target = webhook.Target{URL: "https://" + a.listener.Addr().String()}
	}
	register := func(ctx context.Context, caBundle []byte) error {
		return webhook.Register(ctx, a.kube, a.webhooks, target, caBundle)
	}
	if err := register(ctx, a.certs.CABundle()); err != nil {
		return stopped(ctx, err)
	}
	klog.FromContext(ctx).Info("Admission webhooks registered", "target", target.URL, "service", a.opts.WebhookService)
	wg.StartWithContext(ctx, func(ctx context.Context) { a.certs.RenewLoop(ctx, time.Hour, register) })
	return <-errc
}

// stopped is nil when ctx is done: an error caused by the stop is no
// failure.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
