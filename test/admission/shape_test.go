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

	// A v1 client reads the list in an annotation and keeps it.
	v1 := env.Netop.SamplecrdV1().Networks(ns)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := v1.Get(ctx, "kept", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var shape struct{ Reserved []string }
		if err := json.Unmarshal([]byte(n.Annotations[samplecrdv1.SpecShapeAnnotation]), &shape); err != nil || len(shape.Reserved) != 3 {
			return false, fmt.Errorf("v1 annotations %v: %v", n.Annotations, err)
		}
		n.Labels = map[string]string{"touched": "by-v1"}
		_, err = v1.Update(ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	n, err := nets.Get(ctx, "kept", metav1.GetOptions{})
	if err != nil || n.Labels["touched"] != "by-v1" || strings.Join(n.Spec.Reserved, ",") != "10.173.0.2-10.173.0.20,10.173.0.240/28,10.173.0.21" {
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
