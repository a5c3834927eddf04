package operator

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/pki"
	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/conversion"
	"github.com/netop-dev/netop/internal/webhook/networks"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// admission is the webhook server and what it reads.
type admission struct {
	opts     *Options
	kube     kubernetes.Interface
	crds     apiextensionsclient.Interface
	certs    *webhook.CertManager
	server   *webhook.Server
	webhooks webhook.Set
	listener net.Listener
	// cidrs is what the overlap check reads; the webhooks wait for it.
	cidrs *networks.CIDRs
	// synced is closed once the caches the admission handlers read are;
	// they hold requests until then.
	synced chan struct{}
	// serving is set once the server presents its certificate: /readyz
	// waits for it.
	serving atomic.Bool
	// conversionRegistered is closed once the conversion webhook is
	// registered with this server's address and CA.
	conversionRegistered chan struct{}
}

// admissionStartWait is how long an admission request that arrives before
// the caches are synced waits for them; then it fails, and the webhook's
// failurePolicy applies. Below the webhooks' timeouts (the API server's
// 10 s default, the pod webhook's shorter one).
const admissionStartWait = 2 * time.Second

// newAdmission opens the webhook listener and prepares the handlers. The
// envoy templates are the only ConfigMaps cached.
func newAdmission(ctx context.Context, o *Options, cfg *rest.Config, kube kubernetes.Interface,
	templates kubeinformers.SharedInformerFactory, networkInformer cache.SharedIndexInformer, addresses networks.AddressHolders,
	recorder record.EventRecorder, m *metrics.Metrics) (*admission, error) {
	crds, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("apiextensions client: %w", err)
	}
	l, err := net.Listen("tcp", o.WebhookAddr)
	if err != nil {
		return nil, fmt.Errorf("--webhook-addr: %w", err)
	}
	serving := pki.ServingCert{CommonName: "netop-webhook"}
	if o.WebhookLocal {
		serving.IPs = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		for _, name := range []string{o.WebhookService, o.ConversionService} {
			svc := name + "." + o.OperatorNamespace + ".svc"
			serving.DNSNames = append(serving.DNSNames, svc, svc+".cluster.local")
		}
	}
	var store webhook.CertStore = webhook.SecretStore{Client: kube, Namespace: o.OperatorNamespace, Name: "netop-webhook-cert"}
	if o.WebhookCertDir != "" {
		store = webhook.FileStore{Dir: o.WebhookCertDir}
	}
	a := &admission{opts: o, kube: kube, crds: crds, certs: webhook.NewCertManager(store, serving), listener: l, cidrs: networks.NewCIDRs(), synced: make(chan struct{}), conversionRegistered: make(chan struct{})}
	if err := a.cidrs.Watch(networkInformer); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("watching Networks for the overlap check: %w", err)
	}
	a.server = webhook.NewServer(a.certs, webhook.Limits{
		MaxInFlight:          o.WebhookMaxInflight,
		MaxBodyBytesInFlight: o.WebhookMaxInflightBytes.Value(),
		Rejected:             func(limit string) { m.WebhookRejected.WithLabelValues(limit).Inc() },
	})
	a.webhooks = webhooks(webhookDeps{
		cidrs:             a.cidrs,
		templates:         templates.Core().V1().ConfigMaps().Lister(),
		recorder:          recorder,
		decoder:           webhook.NewDecoder(scheme),
		operatorNamespace: o.OperatorNamespace,
		allowReserved:     o.AllowReservedPrefixes,

		allowPrivilegedTemplates: o.AllowPrivilegedTemplates,
		addresses:                addresses,
		networks:                 samplecrdlisters.NewNetworkLister(networkInformer.GetIndexer()),
		deploymentNetworks:       o.DeploymentNetworks,
	})
	a.server.MountGated(ctx, a.webhooks, a.synced, admissionStartWait)
	a.server.HandleHTTP(PathConvert, conversion.Converter{Scheme: scheme}.Handler(ctx))
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

// run gets the certificate, serves, and registers the conversion webhook
// at once, since converting needs no cache and the API server needs it to
// serve v1 at all, and v2 for objects still stored as v1, which netop's own
// caches read; it registers the admission webhooks once the caches
// they answer from are synced (synced is closed), and from then on renews
// the certificate, registering both again. A stop at any point is a clean
// stop.
func (a *admission) run(ctx context.Context, synced <-chan struct{}) error {
	defer func() { _ = a.listener.Close() }()
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
	a.serving.Store(true)
	service := func(name string) webhook.Target {
		if a.opts.WebhookLocal {
			return webhook.Target{URL: "https://" + a.listener.Addr().String()}
		}
		return webhook.Target{Service: &admissionregistrationv1.ServiceReference{
			Namespace: a.opts.OperatorNamespace, Name: name, Port: ptr.To[int32](443),
		}}
	}
	target, conversionTarget := service(a.opts.WebhookService), service(a.opts.ConversionService)
	if err := webhook.RegisterConversion(ctx, a.crds, NetworkCRD, conversionTarget, PathConvert, a.certs.CABundle()); err != nil {
		return stopped(ctx, err)
	}
	close(a.conversionRegistered)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	case <-synced:
	}
	close(a.synced)
	register := func(ctx context.Context, caBundle []byte) error {
		if err := webhook.Register(ctx, a.kube, a.webhooks, target, caBundle); err != nil {
			return err
		}
		return webhook.RegisterConversion(ctx, a.crds, NetworkCRD, conversionTarget, PathConvert, caBundle)
	}
	if err := register(ctx, a.certs.CABundle()); err != nil {
		return stopped(ctx, err)
	}
	klog.FromContext(ctx).Info("Admission and conversion webhooks registered", "target", target.URL, "service", a.opts.WebhookService)
	wg.StartWithContext(ctx, func(ctx context.Context) { a.certs.RenewLoop(ctx, time.Hour, register) })
	return <-errc
}

// removeWebhooks deletes the webhook configurations that a netop with
// webhooks registered, for a netop started with them off (--webhook-addr=0):
// left behind they point at a server that is not there, and the API server
// then refuses every Network and every pod of a labelled namespace (their
// failurePolicy is Fail). Only netop's are deleted (named
// WebhookConfigurationName and written by netop's field manager; see
// webhook.Unregister). The configurations are cluster-wide, one netop's
// admission per cluster: this netop's "off" holds for the whole cluster.
//
// A stop with webhooks on leaves the configurations in place, on purpose:
// in a rolling update, or with several replicas, the replica that stops is
// not the last one serving, and removing them would let Networks and pods
// through unchecked (or uninjected) until the next replica registers again.
// A netop that is uninstalled takes them with it only when started once
// with --webhook-addr=0, or by `kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration netop`.
//
// Failures are retried with capped backoff until ctx ends; they are logged,
// not fatal: the Network controller runs on. Forbidden is not retried:
// the RBAC of the manifests allows it, so it means a netop installed
// without it.
func removeWebhooks(ctx context.Context, kube kubernetes.Interface) error {
	logger := klog.FromContext(ctx)
	for delay := time.Second; ; delay = min(2*delay, time.Minute) {
		removed, foreign, err := webhook.Unregister(ctx, kube, WebhookConfigurationName)
		if len(removed) > 0 {
			logger.Info("Admission webhooks are off: removed their configurations", "removed", removed)
		}
		if len(foreign) > 0 {
			logger.Info("Admission webhooks are off: left configurations of the same name that netop did not make", "kept", foreign)
		}
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case apierrors.IsForbidden(err):
			logger.Error(err, "Admission webhooks are off, but their configurations could not be removed; remove them by hand unless another netop serves them")
			return nil
		}
		logger.Error(err, "Removing the admission webhook configurations failed; retrying", "after", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// stopped is nil when ctx is done: an error caused by the stop is no
// failure.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
