// Package operator is the core every netop process shares: the clients,
// one informer factory per API group, Events, metrics and the backend
// (shared), and the runner that starts the components a role declares
// (components.go) in one errgroup, the writers under leader election. Both
// binaries, netop (any cluster) and netop-standalone (embedded control
// plane), run it, so a role behaves the same in either.
package operator

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/agent"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/agents"
	"github.com/netop-dev/netop/internal/backend/backends"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/controller/podnet"
	"github.com/netop-dev/netop/internal/eventsink"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/leader"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/networkcache"
	"github.com/netop-dev/netop/internal/rungroup"
	"github.com/netop-dev/netop/internal/version"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// shared is what every component is built from.
type shared struct {
	opts   *Options
	config *rest.Config
	kube   kubernetes.Interface
	client versioned.Interface
	// The informer factories, one per API group and cache shape, each
	// with the transform that keeps its cache small: netop's resources,
	// the built-in ones, pods (kubeclient.TrimPod) and the envoy-initializer
	// ConfigMaps. A factory no component asks for starts nothing.
	netop     informers.SharedInformerFactory
	builtin   kubeinformers.SharedInformerFactory
	pods      kubeinformers.SharedInformerFactory
	templates kubeinformers.SharedInformerFactory
	// more are factories components add (startWithOthers).
	more     []factory
	recorder record.EventRecorder
	metrics  *metrics.Metrics
	backend  backend.Backend
	// cluster is the cluster identity recorded on backend networks.
	cluster string
	// fleet is set when the nodes' agents build the bridges
	// (agents.Backend): Networks are ready once ready on every node.
	fleet bool
	// overlay is an agent's node on the underlay; nil elsewhere, or on a
	// node without an InternalIP.
	overlay *linux.Overlay
	// nodeNetworks are the Networks an agent reads (agent.Networks): on
	// demand, only those its node's pods use. nil in other roles.
	nodeNetworks networkcache.Source
	// firewall enforces network policies where the backend is a node's
	// bridges (linux); nil elsewhere.
	firewall *linux.Firewall
	// synced is closed once every cache is synced.
	synced chan struct{}
	// addresses is the address allocation, which the Network controller
	// and admission read: built before them (components.go).
	addresses *podnet.Controller
}

// factory is an informer factory: started with the others, shut down
// after the components stopped.
type factory interface {
	Start(<-chan struct{})
	Shutdown()
}

// startWithOthers has f started and shut down with the shared factories.
func (s *shared) startWithOthers(f factory) { s.more = append(s.more, f) }

// networks are the Networks the role's components read: an agent's own,
// else every Network's shared informer. Asking for the informer starts it:
// an agent on demand must not.
func (s *shared) networks() networkcache.Source {
	if s.nodeNetworks != nil {
		return s.nodeNetworks
	}
	return s.netop.Samplecrd().V2().Networks().Informer()
}

// Operator is netop configured for one cluster and one role, ready to run.
type Operator struct {
	shared
	built []builtComponent
	// stopEvents writes the last Events; close releases the backend.
	stopEvents, close func()
	election          leader.Election
	// started is when Run began, for the startup metrics.
	started time.Time
}

// New configures an operator for the cluster of cfg. be is the backend to
// use; nil makes the one the options name. Nothing runs until Run.
func New(ctx context.Context, cfg *rest.Config, o *Options, be backend.Backend) (*Operator, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	op := &Operator{shared: shared{opts: o, metrics: metrics.New(), synced: make(chan struct{})}, close: func() {}}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.Client.QPS, o.Client.Burst
	cfg.UserAgent = "netop/" + version.String()
	cfg.Wrap(op.metrics.CountRequests)
	op.config = cfg
	op.election = leader.Election{Options: o.Leader, Namespace: o.OperatorNamespace, Leading: op.metrics.Leader}
	var err error
	if op.kube, err = kubeclient.New(cfg, o.Client.ContentType); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	op.election.Kube = op.kube
	if op.client, err = versioned.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("netop client: %w", err)
	}
	if op.cluster = o.ClusterID; op.cluster == "" {
		if op.cluster, err = kubeclient.ClusterID(ctx, op.kube); err != nil {
			return nil, err
		}
	}
	if be == nil {
		if be, err = op.newBackend(ctx); err != nil {
			op.close()
			return nil, err
		}
	}
	_, op.fleet = be.(agents.Backend)
	if l, ok := be.(*linux.Backend); ok {
		op.firewall = l.Firewall()
	}
	op.backend = backend.Instrument(be, func(operation string, d time.Duration, err error) {
		op.metrics.ObserveBackend(string(be.Type()), operation, d, err)
	})

	op.netop = informers.NewSharedInformerFactoryWithOptions(op.client, o.Resync,
		informers.WithNamespace(o.Namespace), informers.WithTransform(kubeclient.DropManagedFields))
	op.builtin = kubeinformers.NewSharedInformerFactoryWithOptions(op.kube, o.Resync,
		kubeinformers.WithNamespace(o.Namespace), kubeinformers.WithTransform(kubeclient.DropManagedFields))
	op.pods = kubeinformers.NewSharedInformerFactoryWithOptions(op.kube, o.Resync,
		kubeinformers.WithNamespace(o.Namespace), kubeinformers.WithTransform(kubeclient.TrimPod))
	op.templates = kubeinformers.NewSharedInformerFactoryWithOptions(op.kube, o.Resync,
		kubeinformers.WithTweakListOptions(admission.TemplateListOptions), kubeinformers.WithTransform(kubeclient.DropManagedFields))

	// Bounds a stop's last writes (eventsink's flush) and a hung request.
	eventsConfig := kubeclient.Config(cfg, o.Client.ContentType)
	eventsConfig.Timeout = 10 * time.Second
	eventClient, err := kubernetes.NewForConfig(eventsConfig)
	if err != nil {
		op.close()
		return nil, fmt.Errorf("event client: %w", err)
	}
	op.recorder, op.stopEvents = eventsink.NewRecorder(ctx, eventClient, kubeclient.Scheme(), "netop", eventsink.Options{
		Written: op.metrics.EventsWritten.Inc,
		Dropped: func(reason string) { op.metrics.EventsDropped.WithLabelValues(reason).Inc() },
	})
	if op.built, err = build(ctx, &op.shared); err != nil {
		op.stopEvents()
		op.close()
		return nil, err
	}
	return op, nil
}

// newBackend makes the backend of the role: the agents' with the linux
// backend in a cluster (they build the bridges), a node's bridges joined
// to the others' by its overlay for an agent, else the one the options
// name.
func (op *Operator) newBackend(ctx context.Context) (backend.Backend, error) {
	o := op.opts.Backend
	switch {
	case op.opts.Role == RoleController && o.Type == string(backend.TypeLinux):
		return agents.Backend{}, nil
	case op.opts.Role == RoleAgent:
		o.Type = string(backend.TypeLinux)
		var err error
		if op.overlay, err = agent.Overlay(ctx, op.kube, op.opts.Agent.NodeName); err != nil {
			return nil, err
		}
	}
	be, release, err := backends.New(ctx, o, op.overlay)
	op.close = release
	return be, err
}

// Metrics returns the operator's metrics.
func (op *Operator) Metrics() *metrics.Metrics { return op.metrics }

// ConversionRegistered is closed once this operator's conversion webhook
// is registered on the Network CRD: from then on v1 clients are served. An
// operator without webhooks registers none, and its channel is closed.
func (op *Operator) ConversionRegistered() <-chan struct{} {
	return op.webhookSignal((*admission.Server).ConversionRegistered)
}

// AdmissionInForce is closed once the API server calls this operator's
// admission webhooks: from then on what they refuse is refused. An
// operator without webhooks has its channel closed.
func (op *Operator) AdmissionInForce() <-chan struct{} {
	return op.webhookSignal((*admission.Server).InForce)
}

// webhookSignal is the channel signal gives of the operator's webhook
// server, or a closed one where it runs none.
func (op *Operator) webhookSignal(signal func(*admission.Server) <-chan struct{}) <-chan struct{} {
	for _, b := range op.built {
		if s, ok := b.runnable.(*admission.Server); ok {
			return signal(s)
		}
	}
	closed := make(chan struct{})
	close(closed)
	return closed
}

// Run runs the operator until ctx is done, then releases everything. The
// components run in one rungroup: the first to fail stops the others, and
// its error is returned; one that ends stops them too.
func (op *Operator) Run(ctx context.Context) error {
	defer op.close()
	defer op.stopEvents()
	op.started = time.Now()
	logger := klog.FromContext(ctx)
	logger.Info("Starting netop", "role", op.opts.Role, "version", version.String(), "backend", op.backend.Type(), "namespace", op.opts.Namespace)

	all, ctx := rungroup.New(ctx)
	factories := append([]factory{op.netop, op.builtin, op.pods, op.templates}, op.more...)
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	all.Go(op.waitSynced)
	if op.opts.Metrics.Enabled() {
		all.Run("metrics server", op.serveMetrics)
	}
	var writers []builtComponent
	for _, b := range op.built {
		if b.leaderOnly {
			writers = append(writers, b)
			continue
		}
		all.Run(b.name, b.runnable.Run)
	}
	// The writers: on one replica at a time when replicas elect a leader.
	controllers := func(ctx context.Context) error {
		group, _ := rungroup.New(ctx)
		for _, w := range writers {
			group.Run(w.name, w.runnable.Run)
		}
		return group.Wait()
	}
	switch {
	case len(writers) == 0:
	case op.opts.Leader.Elect:
		all.Run("leader election", func(ctx context.Context) error { return op.election.Run(ctx, controllers) })
	default:
		op.metrics.Leader.Set(1)
		all.Run("controllers", controllers)
	}
	err := all.Wait()
	for _, f := range factories {
		f.Shutdown()
	}
	logger.Info("Stopped netop", "role", op.opts.Role)
	return err
}

// waitSynced records the startup phases, makes /readyz ready and closes
// synced once every cache is synced and every component has been handed
// its initial lists.
func (op *Operator) waitSynced(ctx context.Context) {
	if !cache.WaitFor(ctx, "", op.networks().HasSyncedChecker()) {
		return // stopped
	}
	op.metrics.Startup.WithLabelValues(metrics.PhaseNetworksListed).Set(time.Since(op.started).Seconds())
	for _, f := range []interface {
		WaitForCacheSync(<-chan struct{}) map[reflect.Type]bool
	}{op.netop, op.builtin, op.pods, op.templates} {
		for _, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return
			}
		}
	}
	for _, b := range op.built {
		if s, ok := b.runnable.(interface{ HasSyncedChecker() cache.DoneChecker }); ok && !cache.WaitFor(ctx, "", s.HasSyncedChecker()) {
			return
		}
	}
	op.metrics.Startup.WithLabelValues(metrics.PhaseCachesSynced).Set(time.Since(op.started).Seconds())
	klog.FromContext(ctx).Info("Caches synced", "after", time.Since(op.started))
	close(op.synced)
}

// serveMetrics serves /metrics, /healthz, /readyz and, with --profiling,
// /debug/pprof/ until ctx is done. /readyz is ready once the caches are
// synced and every component is (metrics.Ready).
func (op *Operator) serveMetrics(ctx context.Context) error {
	return metrics.Serve(ctx, op.opts.Metrics.Addr, op.metrics.Handler(), op.readyz, op.opts.Metrics.Profiling)
}

// readyz says why this replica is not ready, or nil and which replica
// leads: every replica is ready (each serves the webhooks).
func (op *Operator) readyz() (string, error) {
	select {
	case <-op.synced:
	default:
		return "", errors.New("informer caches not synced")
	}
	for _, b := range op.built {
		if r, ok := b.runnable.(interface{ Ready() error }); ok {
			if err := r.Ready(); err != nil {
				return "", err
			}
		}
	}
	if leader := op.election.Leader(); leader != "" {
		return "leader: " + leader, nil
	}
	return "", nil
}
