// Package leader runs the writers of netop's controller replicas on one
// replica at a time: the one that holds a Lease.
package leader

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// LeaseName is the Lease the replicas elect their leader with, in the
// operator's namespace.
const LeaseName = "netop"

// Options are leader election's flags.
type Options struct {
	// Elect makes replicas elect one leader that runs the writers; every
	// replica serves the webhooks and keeps its caches warm.
	Elect bool
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's
	// timings.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// NewOptions returns client-go's usual timings.
func NewOptions() Options {
	return Options{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
}

// AddFlags registers the flags of leader election among replicas.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Elect, "leader-elect", o.Elect, "Elect one leader among the replicas (a Lease named netop in --operator-namespace) to run the controllers; every replica serves the admission webhooks. Off, this process runs the controllers at once: run one replica only.")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "How long a leader's Lease holds without renewal before another replica may take over.")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "How long the leader keeps trying to renew before it gives up leading.")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "How often replicas try to acquire or renew the Lease.")
}

// Validate checks the timings of an election.
func (o *Options) Validate() error {
	if o.Elect && (o.LeaseDuration <= o.RenewDeadline || o.RenewDeadline <= o.RetryPeriod || o.RetryPeriod <= 0) {
		return fmt.Errorf("--leader-elect-lease-duration (%v) must exceed --leader-elect-renew-deadline (%v), which must exceed --leader-elect-retry-period (%v) > 0",
			o.LeaseDuration, o.RenewDeadline, o.RetryPeriod)
	}
	return nil
}

// Election is one replica's part in the election of the Lease LeaseName.
type Election struct {
	Options
	Kube      kubernetes.Interface
	Namespace string
	// Leading is 1 while this replica leads, 0 otherwise.
	Leading prometheus.Gauge
	// leader is the identity of the replica that leads, as last seen.
	leader atomic.Value
}

// Leader is the identity of the replica that leads, as last seen, or "".
func (e *Election) Leader() string {
	leader, _ := e.leader.Load().(string)
	return leader
}

// Run campaigns for the Lease and runs controllers while this replica
// leads. The Lease is released only once the controllers have stopped, so
// that the next leader never runs beside them; a lost Lease ends the
// operator with an error (its Deployment restarts it), as Kubernetes'
// own controllers do.
func (e *Election) Run(ctx context.Context, controllers func(context.Context) error) error {
	o, kube, namespace := e.Options, e.Kube, e.Namespace
	logger := klog.FromContext(ctx)
	host, _ := os.Hostname()
	identity := host + "_" + string(uuid.NewUUID())
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, namespace, LeaseName,
		kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: identity})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	// The election outlives ctx until the controllers stopped.
	electionCtx, endElection := context.WithCancel(context.WithoutCancel(ctx))
	defer endElection()
	var leading atomic.Bool
	var controllersErr error
	controllersDone := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            LeaseName,
		LeaseDuration:   o.LeaseDuration,
		RenewDeadline:   o.RenewDeadline,
		RetryPeriod:     o.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadingCtx context.Context) {
				defer close(controllersDone)
				defer endElection() // release the Lease, now that they stopped
				leading.Store(true)
				e.Leading.Set(1)
				logger.Info("Leading: running the controllers", "identity", identity)
				runCtx, stop := context.WithCancel(leadingCtx)
				defer stop()
				defer context.AfterFunc(ctx, stop)()
				controllersErr = controllers(runCtx)
			},
			OnStoppedLeading: func() {
				e.Leading.Set(0)
				logger.Info("Stopped leading", "identity", identity)
			},
			OnNewLeader: func(current string) {
				e.leader.Store(current)
				if current != identity {
					logger.Info("Following the leader", "leader", current)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	// Not leading when asked to stop: stop campaigning.
	defer context.AfterFunc(ctx, func() {
		if !leading.Load() {
			endElection()
		}
	})()
	elector.Run(electionCtx)
	if leading.Load() {
		<-controllersDone
	}
	switch {
	case controllersErr != nil:
		return controllersErr
	case ctx.Err() == nil:
		return fmt.Errorf("lost the leader election Lease %s/%s", namespace, LeaseName)
	}
	return nil
}
