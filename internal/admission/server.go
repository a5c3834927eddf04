// Package admission is netop's webhook server as one component: the table
// of admission webhooks (Networks, Envoy injection into pods and
// workloads, Deployment networks) on the generic core of package webhook,
// the Network CRD's conversion webhook, the serving certificate, and the
// registration of both with the API server.
package admission

import (
	"context"
	"errors"
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
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/pki"
	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/conversion"
	"github.com/netop-dev/netop/internal/webhook/networks"
	"github.com/netop-dev/netop/internal/webhook/podnetworks"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// Deps is what the webhooks read: the operator's shared clients and
// caches, and the policies of its flags.
type Deps struct {
	Config *rest.Config
	Kube   kubernetes.Interface
	// Networks is the Network informer; Templates the envoy-initializer
	// ConfigMaps (TemplateListOptions).
	Networks  cache.SharedIndexInformer
	Templates corelisters.ConfigMapLister
	// Addresses says who holds Networks' addresses; Pins checks the
	// addresses pods pin (both the allocation controller's allocator).
	Addresses networks.AddressHolders
	Pins      podnetworks.Pins
	// Namespaces is the namespace cache: their labels say which Networks
	// their pods may join.
	Namespaces corelisters.NamespaceLister
	Recorder   record.EventRecorder
	Metrics    *metrics.Metrics
	// Synced is closed once the operator's caches are: the admission
	// webhooks, which answer from them, are registered then.
	Synced <-chan struct{}

	OperatorNamespace string
	// AllowReservedPrefixes: --allow-reserved-prefixes;
	// AllowPrivilegedTemplates: --allow-privileged-templates; with
	// DeploymentNetworks (--deployment-networks) annotated Deployments
	// join their Network.
	AllowReservedPrefixes, AllowPrivilegedTemplates, DeploymentNetworks bool
}

// Server is the webhook server and what it reads.
type Server struct {
	opts     Options
	deps     Deps
	crds     apiextensionsclient.Interface
	certs    *webhook.CertManager
	server   *webhook.Server
	webhooks webhook.Set
	listener net.Listener
	// cidrs is what the overlap check reads; the webhooks wait for it.
	cidrs *networks.CIDRs
	// gate is closed once the caches the admission handlers read are
	// synced; they hold requests until then.
	gate chan struct{}
	// serving is set once the server presents its certificate: /readyz
	// waits for it.
	serving atomic.Bool
	// conversionRegistered is closed once the conversion webhook is
	// registered with this server's address and CA.
	conversionRegistered chan struct{}
	// probe tells when the API server calls the admission webhooks;
	// inForce is closed then: /readyz waits for it.
	probe   *inForceProbe
	inForce chan struct{}
}

// admissionStartWait is how long an admission request that arrives before
// the caches are synced waits for them; then it fails, and the webhook's
// failurePolicy applies. Below the webhooks' timeouts (the API server's
// 10 s default, the pod webhook's shorter one).
const admissionStartWait = 2 * time.Second

// New opens the webhook listener and prepares the handlers.
func New(ctx context.Context, o Options, d Deps) (*Server, error) {
	crds, err := apiextensionsclient.NewForConfig(d.Config)
	if err != nil {
		return nil, fmt.Errorf("apiextensions client: %w", err)
	}
	l, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("--webhook-addr: %w", err)
	}
	serving := pki.ServingCert{CommonName: "netop-webhook"}
	if o.Local {
		serving.IPs = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		for _, name := range []string{o.Service, o.ConversionService} {
			svc := name + "." + d.OperatorNamespace + ".svc"
			serving.DNSNames = append(serving.DNSNames, svc, svc+".cluster.local")
		}
	}
	var store webhook.CertStore = webhook.SecretStore{Client: d.Kube, Namespace: d.OperatorNamespace, Name: "netop-webhook-cert"}
	if o.CertDir != "" {
		store = webhook.FileStore{Dir: o.CertDir}
	}
	s := &Server{opts: o, deps: d, crds: crds, certs: webhook.NewCertManager(store, serving), listener: l,
		cidrs: networks.NewCIDRs(), gate: make(chan struct{}), conversionRegistered: make(chan struct{}), inForce: make(chan struct{})}
	if err := s.cidrs.Watch(d.Networks); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("watching Networks for the overlap check: %w", err)
	}
	client, err := versioned.NewForConfig(d.Config)
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("netop client: %w", err)
	}
	s.cidrs.Live = func(ctx context.Context, namespace, name string) (*samplecrdv2.Network, error) {
		return client.SamplecrdV2().Networks(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	s.server = webhook.NewServer(s.certs, webhook.Limits{
		MaxInFlight:          o.MaxInflight,
		MaxBodyBytesInFlight: o.MaxInflightBytes.Value(),
		Rejected:             func(limit string) { d.Metrics.WebhookRejected.WithLabelValues(limit).Inc() },
	})
	s.webhooks = Webhooks(d, s.cidrs)
	if s.probe, err = newInForceProbe(client, s.webhooks, d.OperatorNamespace, o.Local); err != nil {
		_ = l.Close()
		return nil, err
	}
	for i, w := range s.webhooks.Webhooks {
		s.webhooks.Webhooks[i].Handler = s.probe.observe(w)
	}
	s.server.MountGated(ctx, s.webhooks, s.gate, admissionStartWait)
	s.server.HandleHTTP(PathConvert, conversion.Converter{Scheme: kubeclient.Scheme()}.Handler(ctx))
	return s, nil
}

// TemplateListOptions selects the only ConfigMaps the webhooks and the
// workload initializer read: the envoy templates.
func TemplateListOptions(lo *metav1.ListOptions) {
	lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", envoy.ConfigMapName).String()
}

// HasSyncedChecker is done once the overlap check has every Network.
func (s *Server) HasSyncedChecker() cache.DoneChecker { return s.cidrs.HasSyncedChecker() }

// Ready says why the server does not serve yet, or nil.
func (s *Server) Ready() error {
	if !s.serving.Load() {
		return errors.New("the webhook server is not serving yet")
	}
	select {
	case <-s.inForce:
		return nil
	default:
		return errors.New("the API server does not call the admission webhooks yet")
	}
}

// InForce is closed once the API server calls the admission webhooks:
// from then on what they refuse is refused.
func (s *Server) InForce() <-chan struct{} { return s.inForce }

// ConversionRegistered is closed once the conversion webhook is
// registered on the Network CRD: from then on v1 clients are served.
func (s *Server) ConversionRegistered() <-chan struct{} { return s.conversionRegistered }

// Run gets the certificate, serves, and registers the conversion webhook
// at once, since converting needs no cache and the API server needs it to
// serve v1 at all, and v2 for objects still stored as v1, which netop's own
// caches read; it registers the admission webhooks once the caches
// they answer from are synced (Deps.Synced is closed), probes them until
// the API server calls them (InForce), and from then on renews the
// certificate, registering both again. A stop at any point is a clean
// stop.
func (s *Server) Run(ctx context.Context) error {
	defer func() { _ = s.listener.Close() }()
	if err := s.certs.Ensure(ctx); err != nil {
		return stopped(ctx, err)
	}
	// The server and the renewal loop stop with ctx, and run returns only
	// after both did, so that nothing writes after the operator stopped.
	var wg wait.Group
	defer wg.Wait() // after the cancel below: defers run last first
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	wg.Start(func() { errc <- s.server.Run(ctx, s.listener) })
	s.serving.Store(true)
	service := func(name string) webhook.Target {
		if s.opts.Local {
			return webhook.Target{URL: "https://" + s.listener.Addr().String()}
		}
		return webhook.Target{Service: &admissionregistrationv1.ServiceReference{
			Namespace: s.deps.OperatorNamespace, Name: name, Port: ptr.To[int32](443),
		}}
	}
	target, conversionTarget := service(s.opts.Service), service(s.opts.ConversionService)
	if err := webhook.RegisterConversion(ctx, s.crds, NetworkCRD, conversionTarget, PathConvert, s.certs.CABundle()); err != nil {
		return stopped(ctx, err)
	}
	close(s.conversionRegistered)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	case <-s.deps.Synced:
	}
	close(s.gate)
	register := func(ctx context.Context, caBundle []byte) error {
		if err := webhook.Register(ctx, s.deps.Kube, s.webhooks, target, caBundle); err != nil {
			return err
		}
		return webhook.RegisterConversion(ctx, s.crds, NetworkCRD, conversionTarget, PathConvert, caBundle)
	}
	if err := register(ctx, s.certs.CABundle()); err != nil {
		return stopped(ctx, err)
	}
	klog.FromContext(ctx).Info("Admission and conversion webhooks registered", "target", target.URL, "service", s.opts.Service)
	wg.StartWithContext(ctx, func(ctx context.Context) {
		if s.probe.wait(ctx) {
			close(s.inForce)
		}
	})
	wg.StartWithContext(ctx, func(ctx context.Context) { s.certs.RenewLoop(ctx, time.Hour, register) })
	return <-errc
}

// RemoveWebhooks deletes the webhook configurations that a netop with
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
func RemoveWebhooks(ctx context.Context, kube kubernetes.Interface) error {
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

// Remover runs instead of the server when the webhooks are off: it
// removes the configurations a netop with webhooks registered
// (RemoveWebhooks), then waits for the stop.
type Remover struct{ Kube kubernetes.Interface }

// Run removes the configurations and waits until ctx is done.
func (r Remover) Run(ctx context.Context) error {
	if err := RemoveWebhooks(ctx, r.Kube); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
