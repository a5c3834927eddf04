//go:build faults

// Package faults is the fault suite (make test-faults): the control plane
// restarted under a running controller, and a slow, failing backend. Each
// test states what it checked, with counts, in its log (go test -v).
package faults

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/standalone/controlplane"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// controlPlane starts one on dir; the test stops it.
func controlPlane(t *testing.T, dir string) *controlplane.ControlPlane {
	t.Helper()
	cp, err := controlplane.Start(context.Background(), controlplane.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	cfg := cp.AdminConfig()
	if err := install.CRDs(context.Background(), cfg); err != nil {
		cp.Stop()
		t.Fatal(err)
	}
	// v1 clients need the conversion webhook; the operators here have
	// their webhooks off.
	conversion, err := testenv.ServeConversion(context.Background(), cfg)
	if err != nil {
		cp.Stop()
		t.Fatal(err)
	}
	t.Cleanup(conversion.Close)
	return cp
}

func options(netns string) *operator.Options {
	o := operator.NewOptions()
	o.Backend.Netns, o.Metrics.Addr, o.Webhooks.Addr, o.Workloads.Enabled = netns, "0", "0", false
	o.Client.QPS, o.Client.Burst = 500, 1000
	return o
}

func create(t *testing.T, client versioned.Interface, name, cidr string) {
	t.Helper()
	err := wait(t, 30*time.Second, func(ctx context.Context) error {
		_, err := client.SamplecrdV1().Networks("default").Create(ctx, &samplecrdv1.Network{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: samplecrdv1.NetworkSpec{CIDR: cidr},
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("creating %s: %v", name, err)
	}
}

// wait retries f until it succeeds or timeout passes.
func wait(t *testing.T, timeout time.Duration, f func(ctx context.Context) error) error {
	var last error
	testenv.Eventually(t, timeout, func(ctx context.Context) (bool, string) {
		last = f(ctx)
		return last == nil, fmt.Sprint(last)
	})
	return last
}

// converged waits until every Network is Ready and the bridges are exactly
// theirs.
func converged(t *testing.T, client versioned.Interface, lb *linux.Backend) (networks int) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		var bridges int
		var ok bool
		networks, bridges, ok = testenv.BackendMatches(ctx, func(ctx context.Context) (*samplecrdv1.NetworkList, error) {
			return client.SamplecrdV1().Networks("default").List(ctx, metav1.ListOptions{})
		}, lb)
		return ok, fmt.Sprintf("%d Networks, %d bridges", networks, bridges)
	})
	return networks
}

// The API server restarts while the controller keeps running: its watches
// resume (relisting if they must), Networks created and deleted after the
// restart converge, and no backend network is made twice.
func TestAPIServerRestart(t *testing.T) {
	nettest.RequireRoot(t)
	dir := t.TempDir()
	cp := controlPlane(t, dir)
	netns := nettest.NetnsName("netop-f-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(netns) })
	lb, err := linux.New(context.Background(), linux.Config{Netns: netns})
	if err != nil {
		cp.Stop()
		t.Fatal(err)
	}
	defer lb.Close()
	op, stop := testenv.StartOperator(t, cp.AdminConfig(), options(netns), lb)
	client := versioned.NewForConfigOrDie(cp.AdminConfig())
	for i := range 20 {
		create(t, client, fmt.Sprintf("before-%02d", i), fmt.Sprintf("10.60.%d.0/24", i))
	}
	before := converged(t, client, lb)

	cp.Stop()
	cp = controlPlane(t, dir)
	defer cp.Stop()
	defer stop() // the operator goes before the control plane
	client = versioned.NewForConfigOrDie(cp.AdminConfig())
	for i := range 20 {
		create(t, client, fmt.Sprintf("after-%02d", i), fmt.Sprintf("10.61.%d.0/24", i))
	}
	for i := range 10 {
		if err := client.SamplecrdV1().Networks("default").Delete(context.Background(), fmt.Sprintf("before-%02d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	after := converged(t, client, lb)
	created := testutil.ToFloat64(op.Metrics().BackendChanges.WithLabelValues(string(samplecrd.BackendLinux), string(backend.ActionCreated)))
	if created != 40 {
		t.Fatalf("%v bridges created for 40 Networks: a backend network was made twice or not at all", created)
	}
	t.Logf("API server restarted under the controller: %d Networks before, %d after (20 created, 10 deleted after the restart); %v bridges created for 40 Networks, bridges equal Networks", before, after, created)
}

var errDown = errors.New("injected: backend unreachable")

// A slow, failing backend is retried with capped exponential backoff, not
// in a hot loop, and the status says what is wrong.
func TestSlowFailingBackendBacksOff(t *testing.T) {
	cp := controlPlane(t, t.TempDir())
	defer cp.Stop()
	be := backendtest.New()
	be.Fail(errDown)
	be.SetLatency(200 * time.Millisecond)
	_, stop := testenv.StartOperator(t, cp.AdminConfig(), options(""), be)
	defer stop()
	client := versioned.NewForConfigOrDie(cp.AdminConfig())
	const networks = 3
	for i := range networks {
		create(t, client, fmt.Sprintf("n%d", i), fmt.Sprintf("10.62.%d.0/24", i))
	}
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		list, err := client.SamplecrdV1().Networks("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, n := range list.Items {
			c := n.Status.Conditions
			if len(c) == 0 || c[0].Reason != samplecrd.ReasonBackendError || c[0].Message != errDown.Error() {
				return false, fmt.Sprintf("%s: %+v", n.Name, c)
			}
		}
		return len(list.Items) == networks, "waiting for BackendError on every Network"
	})
	// A measurement window: how often the controller tries in 8 s.
	window := 8 * time.Second
	<-time.After(window - time.Since(start))
	attempts := be.Calls(backend.OperationEnsure)
	// Backoff from 100 ms doubling: about 7 tries per Network in 8 s (each
	// also waits 200 ms); a hot loop would make dozens.
	perNetwork := float64(attempts) / networks
	if perNetwork > 10 || perNetwork < 3 {
		t.Fatalf("%d attempts for %d Networks in %v (%.1f each): want capped backoff, 3 to 10 each", attempts, networks, window, perNetwork)
	}
	t.Logf("failing backend: %d attempts for %d Networks in %v (%.1f each, backoff from 100 ms doubling, capped at 30 s); every status says BackendError: %q", attempts, networks, window, perNetwork, errDown)
}
