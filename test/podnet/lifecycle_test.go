package podnet

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// addresses reads the Network's address usage from its status.
func addresses(ctx context.Context, env *testenv.Env, ns, name string) (*samplecrdv1.Network, string) {
	n, err := env.Netop.SamplecrdV1().Networks(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err.Error()
	}
	if n.Status.Addresses == nil {
		return n, "no status.addresses"
	}
	return n, fmt.Sprintf("allocated %d available %s", n.Status.Addresses.Allocated, n.Status.Addresses.Available)
}

// startOperator runs the whole operator with its webhooks on a test backend.
func startOperator(t *testing.T, env *testenv.Env) (*operator.Operator, *backendtest.Backend) {
	t.Helper()
	opts := operator.NewOptions()
	opts.Metrics.Addr = "0"
	opts.Webhooks.Addr = "127.0.0.1:0"
	opts.Webhooks.Local = true
	opts.Webhooks.CertDir = t.TempDir()
	opts.Workloads.Enabled = false
	// Runs after the operator stopped: the webhooks it registered must
	// not outlive it, or the next test's Networks are refused.
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		_ = env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, admission.WebhookConfigurationName, metav1.DeleteOptions{})
		_ = env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, admission.WebhookConfigurationName, metav1.DeleteOptions{})
	})
	be := backendtest.New()
	op, _ := testenv.StartOperator(t, env.Config, opts, be)
	// The webhooks answer once a Network's dry-run create comes back
	// defaulted.
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		n, err := env.Netop.SamplecrdV1().Networks("default").Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec: samplecrdv1.NetworkSpec{CIDR: "10.255.255.0/24"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && n.Spec.Gateway != "", fmt.Sprint(err)
	})
	return op, be
}

// The whole operator (allocation, Network controller, admission): the
// Network's status counts the addresses pods hold, with far fewer status
// writes than pods; while pods hold addresses its cidr and gateway cannot
// change and its deletion waits with Ready=False reason InUse naming them;
// once they are gone it is deleted as before.
func TestNetworkInUse(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	op, be := startOperator(t, env)
	nets := env.Netop.SamplecrdV1().Networks(ns)

	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "example-network"},
			Spec: samplecrdv1.NetworkSpec{CIDR: "192.168.0.0/24"}}, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err) // the webhooks may not answer yet
	})
	n := env.WaitReady(t, ns, "example-network", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	if a := n.Status.Addresses; a == nil || a.Allocated != 0 || a.Available != "253" {
		t.Fatalf("a new /24: status.addresses %+v, want 0 allocated and 253 available (not the network, gateway or broadcast)", a)
	}

	statusWrites := func() float64 {
		return testutil.ToFloat64(op.Metrics().APIWrites.WithLabelValues("put", "networks/status"))
	}
	before := statusWrites()
	const pods = 20
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() { createPod(t, env, ns, fmt.Sprintf("p%02d", i), "example-network") })
	}
	wg.Wait()
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, got := addresses(ctx, env, ns, "example-network")
		return got == fmt.Sprintf("allocated %d available %d", pods, 253-pods), got
	})
	if writes := statusWrites() - before; writes < 1 || writes > pods/4 {
		t.Errorf("%v status writes for %d pods: want at least one, and far fewer than pods", writes, pods)
	} else {
		t.Logf("%v status writes for %d pods", writes, pods)
	}

	// The addresses cannot move under the pods.
	for field, edit := range map[string]func(*samplecrdv1.Network){
		"spec.cidr":    func(n *samplecrdv1.Network) { n.Spec.CIDR, n.Spec.Gateway = "10.9.0.0/24", "" },
		"spec.gateway": func(n *samplecrdv1.Network) { n.Spec.Gateway = "192.168.0.254" },
	} {
		cur, err := nets.Get(t.Context(), "example-network", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edit(cur)
		_, err = nets.Update(t.Context(), cur, metav1.UpdateOptions{})
		want := fmt.Sprintf("%s: Forbidden: %d pods hold addresses of the Network (%s/p00, %s/p01, %s/p02, ...)", field, pods, ns, ns, ns)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("changing %s under pods: %v, want %q", field, err, want)
		}
	}

	// Deletion waits for the pods.
	if err := nets.Delete(t.Context(), "example-network", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		n, err := nets.Get(ctx, "example-network", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady)
		return ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == samplecrd.ReasonInUse &&
			strings.Contains(ready.Message, fmt.Sprintf("%d pods hold addresses of the Network (%s/p00, %s/p01, %s/p02, ...)", pods, ns, ns, ns)), fmt.Sprintf("%+v", ready)
	})
	if len(be.Networks()) != 1 {
		t.Fatalf("the backend network went while pods use it: %v", be.Networks())
	}
	// A pod made now does not get an address of a Network being deleted.
	createPod(t, env, ns, "late", "example-network")

	for i := range pods - 1 {
		if err := env.Kube.CoreV1().Pods(ns).Delete(t.Context(), fmt.Sprintf("p%02d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		n, got := addresses(ctx, env, ns, "example-network")
		ready := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady)
		return got == fmt.Sprintf("allocated 1 available %d", 252) && ready != nil && strings.HasPrefix(ready.Message, fmt.Sprintf("1 pods hold addresses of the Network (%s/p19)", ns)),
			got + " " + fmt.Sprint(ready)
	})
	if err := env.Kube.CoreV1().Pods(ns).Delete(t.Context(), "p19", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, err := nets.Get(ctx, "example-network", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(be.Networks()) == 0, fmt.Sprintf("%v, backend %d", err, len(be.Networks()))
	})
	late, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), "late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if late.Annotations[netselect.AllocationsAnnotation] != "" {
		t.Errorf("a pod created during the Network's deletion got %s", late.Annotations[netselect.AllocationsAnnotation])
	}
}

// A second family added to a Network in use: the pods already there keep
// their one address, new ones get one of each family, the status counts
// pod interfaces (the IPv4 pool's count, the fuller one), and the IPv6
// family cannot go while pods hold IPv6 addresses, naming those pods only;
// once they are gone it can, with IPv4 still held.
func TestDualStackNetworkInUse(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startOperator(t, env)
	nets := env.Netop.SamplecrdV2().Networks(ns)
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "grow"},
		Spec: samplecrdv1.NetworkSpec{CIDR: "10.83.0.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.WaitReady(t, ns, "grow", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	for i := range 3 {
		createPod(t, env, ns, fmt.Sprintf("old%d", i), "grow")
	}
	waitAllocated(t, env, ns, 3)

	setCIDRs := func(cidrs ...string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := nets.Get(t.Context(), "grow", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(n.Spec.Gateways) == 0 {
				t.Fatalf("grow has no gateway: %+v", n.Spec)
			}
			n.Spec.CIDRs, n.Spec.Gateways = cidrs, n.Spec.Gateways[:1]
			_, err = nets.Update(t.Context(), n, metav1.UpdateOptions{})
			return err
		})
	}
	if err := setCIDRs("10.83.0.0/24", "fd83::/64"); err != nil {
		t.Fatalf("adding IPv6 to a Network whose pods hold IPv4 addresses: %v", err)
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		n, err := nets.Get(ctx, "grow", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(n.Status.CIDRs) == 2, fmt.Sprintf("status.cidrs %v", n.Status.CIDRs)
	})
	for i := range 2 {
		createPod(t, env, ns, fmt.Sprintf("new%d", i), "grow")
	}
	all := waitAllocated(t, env, ns, 5)
	for pod, as := range all {
		if want := map[bool]int{true: 1, false: 2}[strings.HasPrefix(pod, "old")]; len(as) != 1 || len(as[0].IPs) != want {
			t.Errorf("pod %s holds %+v, want %d addresses", pod, as, want)
		}
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, got := addresses(ctx, env, ns, "grow")
		return got == "allocated 5 available 248", got
	})

	err := setCIDRs("10.83.0.0/24")
	if want := fmt.Sprintf("spec.cidrs[1]: Forbidden: 2 pods hold addresses of the Network (%s/new0, %s/new1)", ns, ns); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("removing IPv6 under pods holding IPv6 addresses: %v, want %q", err, want)
	}
	for i := range 2 {
		if err := env.Kube.CoreV1().Pods(ns).Delete(t.Context(), fmt.Sprintf("new%d", i), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, func(context.Context) (bool, string) {
		err := setCIDRs("10.83.0.0/24")
		return err == nil, fmt.Sprint(err) // the allocation controller sees the deletions
	})

	// Gone with its pods, so that the operators of later tests find
	// neither it nor its cidr.
	if err := env.Kube.CoreV1().Pods(ns).DeleteCollection(t.Context(), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nets.Delete(t.Context(), "grow", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, err := nets.Get(ctx, "grow", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}
