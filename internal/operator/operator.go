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
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/agent"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/agents"
	"github.com/netop-dev/netop/internal/backend/backends"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/component"
	"github.com/netop-dev/netop/internal/eventsink"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/leader"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/rungroup"
	"github.com/netop-dev/netop/internal/version"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// shared is what every component is built from: the shared context, and
// the options, whose components' parts the list of components hands them.
type shared struct {
	*component.Context
	opts *Options
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
	op := &Operator{shared: shared{Context: &component.Context{Settings: o.Settings, Metrics: metrics.New(), Synced: make(chan struct{})}, opts: o}, close: func() {}}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.Client.QPS, o.Client.Burst
	cfg.UserAgent = "netop/" + version.String()
	cfg.Wrap(op.Context.Metrics.CountRequests)
	op.Config = cfg
	op.election = leader.Election{Options: o.Leader, Namespace: o.OperatorNamespace, Leading: op.Context.Metrics.Leader}
	var err error
	if op.Kube, err = kubeclient.New(cfg, o.Client.ContentType); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	op.election.Kube = op.Kube
	if op.Client, err = versioned.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("netop client: %w", err)
	}
	if op.Cluster = o.ClusterID; op.Cluster == "" {
		if op.Cluster, err = kubeclient.ClusterID(ctx, op.Kube); err != nil {
			return nil, err
		}
	}
	if be == nil {
		if be, err = op.newBackend(ctx); err != nil {
			op.close()
			return nil, err
		}
	}
	_, op.Fleet = be.(agents.Backend)
	if l, ok := be.(*linux.Backend); ok {
		op.Firewall = l.Firewall()
	}
	op.Backend = backend.Instrument(be, func(operation string, d time.Duration, err error) {
		op.Context.Metrics.ObserveBackend(string(be.Type()), operation, d, err)
	})

	op.Netop = informers.NewSharedInformerFactoryWithOptions(op.Client, o.Resync,
		informers.WithNamespace(o.Namespace), informers.WithTransform(kubeclient.DropManagedFields))
	op.Builtin = kubeinformers.NewSharedInformerFactoryWithOptions(op.Kube, o.Resync,
		kubeinformers.WithNamespace(o.Namespace), kubeinformers.WithTransform(kubeclient.DropManagedFields))
	op.Pods = kubeinformers.NewSharedInformerFactoryWithOptions(op.Kube, o.Resync,
		kubeinformers.WithNamespace(o.Namespace), kubeinformers.WithTransform(kubeclient.TrimPod))
	op.Templates = kubeinformers.NewSharedInformerFactoryWithOptions(op.Kube, o.Resync,
		kubeinformers.WithTweakListOptions(admission.TemplateListOptions), kubeinformers.WithTransform(kubeclient.DropManagedFields))

	// Bounds a stop's last writes (eventsink's flush) and a hung request.
	eventsConfig := kubeclient.Config(cfg, o.Client.ContentType)
	eventsConfig.Timeout = 10 * time.Second
	eventClient, err := kubernetes.NewForConfig(eventsConfig)
	if err != nil {
		op.close()
		return nil, fmt.Errorf("event client: %w", err)
	}
	op.Recorder, op.stopEvents = eventsink.NewRecorder(ctx, eventClient, kubeclient.Scheme(), "netop", eventsink.Options{
		Written: op.Context.Metrics.EventsWritten.Inc,
		Dropped: func(reason string) { op.Context.Metrics.EventsDropped.WithLabelValues(reason).Inc() },
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
		if op.Overlay, err = agent.Overlay(ctx, op.Kube, op.opts.Agent.NodeName); err != nil {
			return nil, err
		}
	}
	be, release, err := backends.New(ctx, o, op.Overlay)
	op.close = release
	return be, err
}

// Metrics returns the operator's metrics.
func (op *Operator) Metrics() *metrics.Metrics { return op.Context.Metrics }

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
	logger.Info("Starting netop", "role", op.opts.Role, "version", version.String(), "backend", op.Backend.Type(), "namespace", op.opts.Namespace)

	all, ctx := rungroup.New(ctx)
	factories := op.Factories()
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
		op.Context.Metrics.Leader.Set(1)
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
	if !cache.WaitFor(ctx, "", op.Networks().HasSyncedChecker()) {
		return // stopped
	}
	op.Context.Metrics.Startup.WithLabelValues(metrics.PhaseNetworksListed).Set(time.Since(op.started).Seconds())
	for _, f := range []interface {
		WaitForCacheSync(<-chan struct{}) map[reflect.Type]bool
	}{op.Netop, op.Builtin, op.Pods, op.Templates} {
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
	op.Context.Metrics.Startup.WithLabelValues(metrics.PhaseCachesSynced).Set(time.Since(op.started).Seconds())
	klog.FromContext(ctx).Info("Caches synced", "after", time.Since(op.started))
	close(op.Synced)
}

// serveMetrics serves /metrics, /healthz, /readyz and, with --profiling,
// /debug/pprof/ until ctx is done. /readyz is ready once the caches are
// synced and every component is (metrics.Ready).
func (op *Operator) serveMetrics(ctx context.Context) error {
	return metrics.Serve(ctx, op.opts.Metrics.Addr, op.Context.Metrics.Handler(), op.readyz, op.opts.Metrics.Profiling)
}

// readyz says why this replica is not ready, or nil and which replica
// leads: every replica is ready (each serves the webhooks).
func (op *Operator) readyz() (string, error) {
	select {
	case <-op.Synced:
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
