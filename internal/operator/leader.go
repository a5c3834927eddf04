package operator

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// LeaseName is the Lease the replicas elect their leader with, in the
// operator's namespace.
const LeaseName = "netop"

// lead campaigns for the Lease and runs controllers while this replica
// leads. The Lease is released only once the controllers have stopped, so
// that the next leader never runs beside them; a lost Lease ends the
// operator with an error (its Deployment restarts it), as Kubernetes'
// own controllers do.
func (op *Operator) lead(ctx context.Context, controllers func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	host, _ := os.Hostname()
	identity := host + "_" + string(uuid.NewUUID())
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, op.opts.OperatorNamespace, LeaseName,
		op.kube.CoreV1(), op.kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: identity})
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
		LeaseDuration:   op.opts.LeaseDuration,
		RenewDeadline:   op.opts.RenewDeadline,
		RetryPeriod:     op.opts.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadingCtx context.Context) {
				defer close(controllersDone)
				defer endElection() // release the Lease, now that they stopped
				leading.Store(true)
				op.metrics.Leader.Set(1)
				logger.Info("Leading: running the controllers", "identity", identity)
				runCtx, stop := context.WithCancel(leadingCtx)
				defer stop()
				defer context.AfterFunc(ctx, stop)()
				controllersErr = controllers(runCtx)
			},
			OnStoppedLeading: func() {
				op.metrics.Leader.Set(0)
				logger.Info("Stopped leading", "identity", identity)
			},
			OnNewLeader: func(current string) {
				op.leader.Store(current)
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
		return fmt.Errorf("lost the leader election Lease %s/%s", op.opts.OperatorNamespace, LeaseName)
	}
	return nil
}
