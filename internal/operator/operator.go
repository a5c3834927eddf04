package operator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/backend/neutron"
	"github.com/netop-dev/netop/internal/controller/network"
	"github.com/netop-dev/netop/internal/controller/workload"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/version"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// scheme knows the built-in types and ours, for Event references.
var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(samplecrdv1.AddToScheme(scheme))
}

// Operator is netop configured for one cluster, ready to run.
type Operator struct {
	opts        *Options
	factory     informers.SharedInformerFactory
	controller  *network.Controller
	metrics     *metrics.Metrics
	broadcaster record.EventBroadcaster
	kubeFactory kubeinformers.SharedInformerFactory
	templates   kubeinformers.SharedInformerFactory
	admission   *admission
	workloads   *workload.Controller
	backend     backend.Backend
	close       func()
	synced      atomic.Bool
	// started is when Run began, for the startup metrics.
	started time.Time
}

// New configures an operator for the cluster of cfg. be is the backend to
// use; nil makes the one the options name. Nothing runs until Run.
func New(ctx context.Context, cfg *rest.Config, o *Options, be backend.Backend) (*Operator, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	op := &Operator{opts: o, metrics: metrics.New(), close: func() {}}

	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
	cfg.UserAgent = "netop/" + version.String()
	cfg.Wrap(op.metrics.CountWrites)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("netop client: %w", err)
	}

	if be == nil {
		if be, op.close, err = NewBackend(ctx, o); err != nil {
			return nil, err
		}
	}
	op.backend = backend.Instrument(be, func(operation string, d time.Duration, err error) {
		op.metrics.ObserveBackend(string(be.Type()), operation, d, err)
	})

	op.factory = informers.NewSharedInformerFactoryWithOptions(client, o.Resync,
		informers.WithNamespace(o.Namespace),
		informers.WithTransform(dropManagedFields))
	op.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
	recorder := op.broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "netop"})
	// Events get a client, and so a rate limiter, of their own: they are
	// best effort, and must not slow the status writes down.
	eventClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("event client: %w", err)
	}
	op.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: eventClient.CoreV1().Events("")})

	fail := func(err error) (*Operator, error) {
		op.broadcaster.Shutdown()
		op.close()
		return nil, err
	}
	op.controller, err = network.New(ctx, client, op.factory.Samplecrd().V1().Networks(), op.backend, recorder, op.metrics,
		network.Options{Workers: o.Workers, Resync: o.Resync})
	if err != nil {
		return fail(err)
	}

	op.kubeFactory = kubeinformers.NewSharedInformerFactoryWithOptions(kube, o.Resync, kubeinformers.WithTransform(dropManagedFields))
	op.templates = templateInformers(kube, o.Resync)
	if o.InitializeWorkloads {
		op.workloads, err = workload.New(ctx, kube, op.kubeFactory.Apps().V1().Deployments(), op.templates.Core().V1().ConfigMaps(),
			recorder, op.metrics, o.OperatorNamespace, o.Workers)
		if err != nil {
			return fail(err)
		}
	}
	if o.webhooksEnabled() {
		op.admission, err = newAdmission(ctx, o, kube, op.templates, op.factory.Samplecrd().V1().Networks().Lister(), recorder)
		if err != nil {
			return fail(err)
		}
	}
	return op, nil
}

// NewBackend makes the backend the options name, and the function that
// releases it.
func NewBackend(ctx context.Context, o *Options) (backend.Backend, func(), error) {
	if o.Backend == string(samplecrdv1.BackendNeutron) {
		nb, err := neutron.New(ctx, neutron.Config{Endpoint: o.NeutronEndpoint, ProjectID: o.NeutronProject, Cloud: o.NeutronCloud})
		if err != nil {
			return nil, nil, err
		}
		return nb, func() {}, nil
	}
	lb, err := linux.New(ctx, linux.Config{Netns: o.Netns})
	if err != nil {
		return nil, nil, err
	}
	return lb, lb.Close, nil
}

// dropManagedFields trims what the controller never reads from cached
// objects: managedFields are often most of an object's size.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// Metrics returns the operator's metrics.
func (op *Operator) Metrics() *metrics.Metrics { return op.metrics }

// Run runs the operator until ctx is done, then releases everything.
func (op *Operator) Run(ctx context.Context) error {
	defer op.close()
	defer op.broadcaster.Shutdown()
	op.started = time.Now()
	logger := klog.FromContext(ctx)
	logger.Info("Starting netop", "version", version.String(), "backend", op.backend.Type(), "namespace", op.opts.Namespace)

	if op.opts.MetricsAddr != "0" && op.opts.MetricsAddr != "" {
		stop, err := op.serveMetrics(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	admissionErr := make(chan error, 1)
	if op.admission != nil {
		// Closed by the server's shutdown too; this covers a stop before
		// the caches synced and the server started.
		defer func() { _ = op.admission.listener.Close() }()
	}
	op.factory.Start(ctx.Done())
	defer op.factory.Shutdown()
	op.kubeFactory.Start(ctx.Done())
	defer op.kubeFactory.Shutdown()
	op.templates.Start(ctx.Done())
	defer op.templates.Shutdown()
	go func() {
		networks := op.factory.Samplecrd().V1().Networks().Informer().HasSyncedChecker()
		if !cache.WaitFor(ctx, "", networks) {
			return
		}
		op.metrics.Startup.WithLabelValues("networks_listed").Set(time.Since(op.started).Seconds())
		for _, synced := range []map[reflect.Type]bool{
			op.factory.WaitForCacheSync(ctx.Done()),
			op.kubeFactory.WaitForCacheSync(ctx.Done()),
			op.templates.WaitForCacheSync(ctx.Done()),
		} {
			for _, ok := range synced {
				if !ok {
					return
				}
			}
		}
		if !cache.WaitFor(ctx, "", op.controller.HasSyncedChecker()) {
			return
		}
		op.metrics.Startup.WithLabelValues("caches_synced").Set(time.Since(op.started).Seconds())
		op.synced.Store(true)
		logger.Info("Caches synced", "after", time.Since(op.started))
		if op.admission != nil {
			// Webhooks answer from the caches: serve only once they are full.
			// A stop while registering is a stop, not a failure.
			if err := op.admission.run(ctx); err != nil && ctx.Err() == nil {
				admissionErr <- err
				cancel()
			}
		}
	}()
	var workloadsDone chan struct{}
	if op.workloads != nil {
		workloadsDone = make(chan struct{})
		go func() {
			defer close(workloadsDone)
			_ = op.workloads.Run(ctx)
		}()
	}
	err := op.controller.Run(ctx)
	if workloadsDone != nil {
		<-workloadsDone
	}
	logger.Info("Stopping netop")
	select {
	case aerr := <-admissionErr:
		return fmt.Errorf("admission webhooks: %w", aerr)
	default:
		return err
	}
}

// serveMetrics serves /metrics, /healthz and /readyz (ready once the caches
// are synced).
func (op *Operator) serveMetrics(ctx context.Context) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", op.metrics.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !op.synced.Load() {
			http.Error(w, "informer caches not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	l, err := net.Listen("tcp", op.opts.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	klog.FromContext(ctx).Info("Serving metrics", "address", l.Addr().String())
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped")
		}
	}()
	return func() {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}, nil
}

// Run configures an operator from the options and runs it until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, o *Options) error {
	op, err := New(ctx, cfg, o, nil)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}
