package install

import (
	"context"
	"fmt"
	"testing"
	"time"

	netopleader "github.com/netop-dev/netop/internal/leader"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// Two replicas with the manifests' RBAC and one backend: one leads and
// alone changes the backend; a clean stop of the leader releases the Lease,
// so the other leads at once rather than after the lease duration; every
// Network is built exactly once across the failover.
func TestLeaderElection(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	ns := env.Namespace(t)
	nets := env.Netop.SamplecrdV1().Networks(ns)
	be := backendtest.New()
	cfg := asServiceAccount(env)
	start := func() (*operator.Operator, func()) {
		opts := operator.NewOptions()
		opts.Metrics.Addr = "0"
		opts.Webhooks.Addr = "0"
		opts.Workloads.Enabled = false
		opts.Namespace = ns // the backend's changes are this test's Networks'
		opts.OperatorNamespace = operatorNamespace
		opts.Leader.Elect = true
		opts.Leader.LeaseDuration, opts.Leader.RenewDeadline, opts.Leader.RetryPeriod = 20*time.Second, 15*time.Second, 200*time.Millisecond
		return testenv.StartOperator(t, cfg, opts, be)
	}
	type replica struct {
		op   *operator.Operator
		stop func()
	}
	var replicas [2]replica
	for i := range replicas {
		replicas[i].op, replicas[i].stop = start()
	}
	leading := func() []int {
		var who []int
		for i, r := range replicas {
			if r.op != nil && testutil.ToFloat64(r.op.Metrics().Leader) == 1 {
				who = append(who, i)
			}
		}
		return who
	}
	var leader int
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		who := leading()
		if len(who) == 1 {
			leader = who[0]
		}
		return len(who) == 1, fmt.Sprintf("leading: %v", who)
	})
	lease, err := env.Kube.CoordinationV1().Leases(operatorNamespace).Get(t.Context(), netopleader.LeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("Lease %s/%s: %+v (%v)", operatorNamespace, netopleader.LeaseName, lease, err)
	}
	holder := *lease.Spec.HolderIdentity

	create := func(name, cidr string) types.UID {
		n, err := nets.Create(t.Context(), &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: samplecrdv1.NetworkSpec{CIDR: cidr}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		env.WaitReady(t, ns, name, metav1.ConditionTrue, samplecrd.ReasonProvisioned, 30*time.Second)
		return n.UID
	}
	create("before", "10.131.0.0/24")
	if got := testutil.ToFloat64(replicas[1-leader].op.Metrics().ReconcileTotal.WithLabelValues("network", "success")); got != 0 {
		t.Errorf("the follower reconciled %v Networks", got)
	}

	// A clean stop hands over: the Lease is released, not left to expire.
	replicas[leader].stop()
	replicas[leader].op = nil
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		who := leading()
		return len(who) == 1 && who[0] == 1-leader, fmt.Sprintf("leading: %v (the lease lasts 20s: this must be its release)", who)
	})
	lease, err = env.Kube.CoordinationV1().Leases(operatorNamespace).Get(t.Context(), netopleader.LeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == holder {
		t.Errorf("Lease after the handover: %+v (%v)", lease.Spec.HolderIdentity, err)
	}
	create("after", "10.132.0.0/24")
	// Each Network built once, none twice across the handover.
	if changes := be.Changes(); changes != 2 {
		t.Errorf("%d backend changes for 2 Networks across a handover", changes)
	}
}
