package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Issue 35, spec.reserved against the API server: the schema and the
// webhook refuse bad entries naming them; reserved addresses are never
// allocated and cannot be pinned; status counts them apart; reserving an
// address a pod holds is refused naming the pod until it is gone; a v1
// client's update keeps the list.
func TestReservedAddresses(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	ns := env.Namespace(t)
	nets := env.Netop.SamplecrdV2().Networks(ns)
	for i, tc := range []struct {
		reserved []string
		want     string
	}{
		{[]string{"nope"}, `spec.reserved[0]: Invalid value: "nope": must be an address, a prefix in CIDR notation, or a range first-last`},
		{[]string{"10.173.0.5", "10.9.0.5"}, `spec.reserved[1]: Invalid value: "10.9.0.5": is outside every cidr (10.173.0.0/24)`},
		{[]string{"10.173.0.9-10.173.0.3"}, `spec.reserved[0]: Invalid value: "10.173.0.9-10.173.0.3": must be a range whose first address is not after its last`},
	} {
		requireRefused(t, fmt.Sprintf("reserved %v", tc.reserved), func(ctx context.Context) error {
			_, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bad-%d", i)},
				Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.173.0.0/24"}, Reserved: tc.reserved}}, metav1.CreateOptions{})
			return err
		}, tc.want)
	}

	if _, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "kept"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.173.0.0/24"}, Reserved: []string{"10.173.0.2-10.173.0.20", "10.173.0.240/28"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		n, err := nets.Get(ctx, "kept", metav1.GetOptions{})
		if err != nil || n.Status.Addresses == nil {
			return false, fmt.Sprintf("%v %v", n, err)
		}
		// 256 - network, gateway, broadcast - 19 - 15 (the /28 less the
		// broadcast address).
		return n.Status.Addresses.Reserved == "34" && n.Status.Addresses.Available == "219", fmt.Sprintf("status.addresses %+v", *n.Status.Addresses)
	})
	requireRefused(t, "pinning a reserved address", func(ctx context.Context) error {
		_, err := env.Kube.CoreV1().Pods(ns).Create(ctx, networkPod(ns, "pins", `[{"name":"kept","ips":["10.173.0.7"]}]`), metav1.CreateOptions{})
		return err
	}, "address 10.173.0.7: reserved by the Network (spec.reserved), which no pod may hold")
	eventuallyAdmitted(t, env, networkPod(ns, "first", "kept"))
	waitAllocated(t, env, ns, "first", ns+"/kept")
	if got := podAddress(t, env, ns, "first"); got != "10.173.0.21/24" {
		t.Errorf("the first pod got %s, want 10.173.0.21/24, the first address not reserved", got)
	}

	// Reserving the address a pod holds waits for the pod.
	requireRefused(t, "reserving a held address", func(ctx context.Context) error {
		n, err := nets.Get(ctx, "kept", metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Reserved = append(n.Spec.Reserved, "10.173.0.21")
		_, err = nets.Update(ctx, n, metav1.UpdateOptions{})
		return err
	}, `spec.reserved[2]: Forbidden: 1 pods hold addresses of the Network (`+ns+`/first) in 10.173.0.21: it can be reserved once they are gone`)
	if err := env.Kube.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		n, err := nets.Get(ctx, "kept", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		n.Spec.Reserved = append(n.Spec.Reserved, "10.173.0.21")
		_, err = nets.Update(ctx, n, metav1.UpdateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	eventuallyAdmitted(t, env, networkPod(ns, "second", "kept"))
	waitAllocated(t, env, ns, "second", ns+"/kept")
	if got := podAddress(t, env, ns, "second"); got != "10.173.0.22/24" {
		t.Errorf("the next pod got %s, want 10.173.0.22/24", got)
	}

	// An entry removed is free at once.
	n, err := nets.Get(ctx, "kept", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Reserved = n.Spec.Reserved[1:]
	if _, err := nets.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		n, err := nets.Get(ctx, "kept", metav1.GetOptions{})
		return err == nil && n.Status.Addresses != nil && n.Status.Addresses.Reserved == "16", fmt.Sprintf("%+v %v", n.Status.Addresses, err)
	})
	eventuallyAdmitted(t, env, networkPod(ns, "third", "kept"))
	waitAllocated(t, env, ns, "third", ns+"/kept")
	if got := podAddress(t, env, ns, "third"); got != "10.173.0.2/24" {
		t.Errorf("after 10.173.0.2-10.173.0.20 was removed from the list, the next pod got %s, want 10.173.0.2/24", got)
	}

	// A v1 client reads the list in an annotation and keeps it.
	v1 := env.Netop.SamplecrdV1().Networks(ns)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := v1.Get(ctx, "kept", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var shape struct{ Reserved []string }
		if err := json.Unmarshal([]byte(n.Annotations[samplecrdv1.SpecShapeAnnotation]), &shape); err != nil || len(shape.Reserved) != 2 {
			return false, fmt.Errorf("v1 annotations %v: %v", n.Annotations, err)
		}
		n.Labels = map[string]string{"touched": "by-v1"}
		_, err = v1.Update(ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	n, err = nets.Get(ctx, "kept", metav1.GetOptions{})
	if err != nil || n.Labels["touched"] != "by-v1" || strings.Join(n.Spec.Reserved, ",") != "10.173.0.240/28,10.173.0.21" {
		t.Errorf("after a v1 update: labels %v, reserved %v (%v)", n.Labels, n.Spec.Reserved, err)
	}
}

// podAddress is the first address the pod's allocations hold.
func podAddress(t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	p, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have, err := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
	if err != nil || len(have) == 0 || len(have[0].IPs) == 0 {
		t.Fatalf("pod %s/%s: allocations %v (%v)", ns, name, have, err)
	}
	return have[0].IPs[0]
}

// Issue 35, spec.routes, spec.mtu and spec.egress against the API
// server: the schema and the webhook refuse bad ones naming the field; a pod's allocation carries
// the routes, via defaulted to the gateway, for the CNI plugin.
func TestRoutesAreValidatedAndAllocated(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	ns := env.Namespace(t)
	nets := env.Netop.SamplecrdV2().Networks(ns)
	route := func(dst, via string) samplecrdv2.NetworkRoute {
		return samplecrdv2.NetworkRoute{Destination: dst, Via: via}
	}
	for i, tc := range []struct {
		routes []samplecrdv2.NetworkRoute
		want   string
	}{
		{[]samplecrdv2.NetworkRoute{route("nope", "")}, `spec.routes[0].destination: Invalid value: "nope": must be an IP prefix in CIDR notation`},
		{[]samplecrdv2.NetworkRoute{route("10.200.0.0/16", "nope")}, `spec.routes[0].via: Invalid value: "nope": must be an IP address`},
		{[]samplecrdv2.NetworkRoute{route("10.200.0.0/16", ""), route("10.174.0.0/16", "")}, `spec.routes[1].destination: Invalid value: "10.174.0.0/16": must not overlap the Network's cidr 10.174.0.0/24`},
		{[]samplecrdv2.NetworkRoute{route("10.200.0.0/16", "10.9.0.1")}, `spec.routes[0].via: Invalid value: "10.9.0.1": must be an address of the Network, inside its cidr 10.174.0.0/24`},
		{[]samplecrdv2.NetworkRoute{route("fd00:200::/48", "")}, `spec.routes[0].destination: Invalid value: "fd00:200::/48": has no cidr of its IP family`},
	} {
		requireRefused(t, fmt.Sprintf("routes %v", tc.routes), func(ctx context.Context) error {
			_, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bad-%d", i)},
				Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.174.0.0/24"}, Routes: tc.routes}}, metav1.CreateOptions{})
			return err
		}, tc.want)
	}
	for i, tc := range []struct {
		cidrs []string
		mtu   int32
		want  string
	}{
		{[]string{"10.175.0.0/24"}, 100, "spec.mtu: Invalid value: 100: spec.mtu in body should be greater than or equal to 576"},
		{[]string{"10.175.0.0/24"}, 10000, "spec.mtu: Invalid value: 10000: spec.mtu in body should be less than or equal to 9216"},
		{[]string{"10.175.0.0/24", "fd00:175::/64"}, 1000, "spec.mtu: Invalid value: 1000: must be at least 1280 on a Network with an IPv6 cidr"},
	} {
		requireRefused(t, fmt.Sprintf("mtu %d", tc.mtu), func(ctx context.Context) error {
			_, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bad-mtu-%d", i)},
				Spec: samplecrdv2.NetworkSpec{CIDRs: tc.cidrs, MTU: tc.mtu}}, metav1.CreateOptions{})
			return err
		}, tc.want)
	}
	requireRefused(t, "an egress mode netop does not have", func(ctx context.Context) error {
		_, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "bad-egress"},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.175.0.0/24"}, Egress: &samplecrdv2.NetworkEgress{Mode: "Bridge"}}}, metav1.CreateOptions{})
		return err
	}, `spec.egress.mode: Unsupported value: "Bridge": supported values: "NAT"`)
	if _, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "routed"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.174.0.0/24", "fd00:174::/64"},
			Routes: []samplecrdv2.NetworkRoute{route("10.200.0.0/16", ""), route("fd00:200::/48", "fd00:174::fe")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventuallyAdmitted(t, env, networkPod(ns, "routed", "routed"))
	waitAllocated(t, env, ns, "routed", ns+"/routed")
	p, err := env.Kube.CoreV1().Pods(ns).Get(ctx, "routed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have, _ := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
	if got := fmt.Sprint(have[0].Routes); got != "[{10.200.0.0/16 10.174.0.1} {fd00:200::/48 fd00:174::fe}]" {
		t.Errorf("the allocation's routes: %s", got)
	}
}
