package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/tenancy"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// cluster is what an allocator under test reads, as plain values, and
// what it told: the pods it retried and the Networks whose usage changed.
type cluster struct {
	networks []*samplecrdv2.Network
	// pods are the pods cache: those with allocations hold them.
	pods []*corev1.Pod
	// labels of the namespaces seen, by name.
	labels  map[string]map[string]string
	retried []cache.ObjectName
	told    []string
}

// allocator is an allocator on c.
func (c *cluster) allocator() *Allocator {
	al := New(Reads{
		Network: func(namespace, name string) (*samplecrdv2.Network, error) {
			for _, n := range c.networks {
				if n.Namespace == namespace && n.Name == name {
					return n, nil
				}
			}
			return nil, apierrors.NewNotFound(samplecrdv2.Resource("networks"), name)
		},
		PodsOf: func(network types.UID) ([]*corev1.Pod, error) {
			var out []*corev1.Pod
			for _, pod := range c.pods {
				if !netselect.Finished(pod) && len(onNetwork(pod, network)) > 0 {
					out = append(out, pod)
				}
			}
			return out, nil
		},
		Admits: func(_ context.Context, n *samplecrdv2.Network, namespace string) error {
			if namespace == n.Namespace {
				return nil
			}
			labels, ok := c.labels[namespace]
			if !ok {
				return fmt.Errorf("namespace %s not seen yet", namespace)
			}
			return tenancy.Admits(n, namespace, labels)
		},
	}, netspec.Resolver{}, func(pod cache.ObjectName) { c.retried = append(c.retried, pod) })
	al.OnUsageChanged(func(n cache.ObjectName) { c.told = append(c.told, n.String()) })
	return al
}

// retriedPod says whether the pod ns/name was retried, and forgets that
// it was.
func (c *cluster) retriedPod(name string) bool {
	pod := cache.ObjectName{Namespace: "ns", Name: name}
	was := slices.Contains(c.retried, pod)
	c.retried = slices.DeleteFunc(c.retried, func(p cache.ObjectName) bool { return p == pod })
	return was
}

func network(name string, cidrs ...string) *samplecrdv2.Network {
	return &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name + "-uid")},
		Spec: samplecrdv2.NetworkSpec{CIDRs: cidrs}}
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name + "-uid")}}
}

// holding is pod name carrying allocations (the annotation's JSON).
func holding(name, allocations string) *corev1.Pod {
	p := pod(name)
	p.Annotations = map[string]string{netselect.AllocationsAnnotation: allocations}
	return p
}

func selections(t *testing.T, networks string) []netselect.Selection {
	t.Helper()
	s, err := netselect.Parse(networks, "ns")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func usage(t *testing.T, al *Allocator, n *samplecrdv2.Network) int64 {
	t.Helper()
	u, err := al.Usage(n)
	if err != nil {
		t.Fatalf("usage of %s: %v", n.Name, err)
	}
	return u.Allocated
}

// waits says whether err makes the pod wait (or be refused, if refused)
// for reason, saying msg.
func waits(err error, reason string, refused bool, msg string) bool {
	var wait *WaitError
	return errors.As(err, &wait) && wait.Reason == reason && wait.Refused == refused && strings.Contains(wait.Msg, msg)
}

// A pod gets an address of its Network, a MAC made of it and the
// Network's routes, and keeps them when asked again; released, they are
// free, and the Network is told. A release of another pod of the name
// frees nothing.
func TestAllocateAndRelease(t *testing.T) {
	n := network("n", "10.80.0.0/24")
	n.Spec.Routes = []samplecrdv2.NetworkRoute{{Destination: "10.99.0.0/16"}}
	n.Spec.Reserved = []string{"10.80.0.200-10.80.0.209"}
	c := &cluster{networks: []*samplecrdv2.Network{n}}
	al := c.allocator()
	got, err := al.Allocate(pod("a"), selections(t, "n"))
	want := netselect.Allocation{Network: "ns/n", NetworkUID: "n-uid", Interface: "net1", IPs: []string{"10.80.0.2/24"}, MAC: "0a:58:0a:50:00:02",
		Routes: []netselect.Route{{Dst: "10.99.0.0/16", GW: "10.80.0.1"}}}
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Fatalf("a: %+v %v, want %+v", got, err, want)
	}
	if again, err := al.Allocate(pod("a"), selections(t, "n")); err != nil || again[0].IPs[0] != "10.80.0.2/24" {
		t.Fatalf("a asked again: %+v %v, want what it holds", again, err)
	}
	if got, err := al.Allocate(pod("b"), selections(t, "n")); err != nil || got[0].IPs[0] != "10.80.0.3/24" {
		t.Fatalf("b: %+v %v, want the next address", got, err)
	}
	u, err := al.Usage(n)
	if err != nil || u.Allocated != 2 || u.Available != "241" || u.Reserved != "10" {
		t.Fatalf("usage: %+v %v, want 2 allocated, 253-2-10 available, 10 reserved", u, err)
	}
	al.Release(cache.ObjectName{Namespace: "ns", Name: "a"}, "another-uid")
	if got := usage(t, al, n); got != 2 || len(c.told) != 0 {
		t.Fatalf("after a release of another pod named a: %d allocated, told %v; want both still held, none told", got, c.told)
	}
	al.Release(cache.ObjectName{Namespace: "ns", Name: "a"}, "")
	if got := usage(t, al, n); got != 1 || !slices.Equal(c.told, []string{"ns/n"}) {
		t.Fatalf("after a's release: %d allocated, told %v; want b's alone, ns/n told", got, c.told)
	}
}

// A new allocator (a restarted controller, a new leader) builds the pools
// from the pods' allocations: it hands out nothing a pod that has not
// finished holds, and frees what a pod it never synced held once the pod
// goes. A pod adopted (the controller's own write seen in the cache) frees
// its addresses when it goes too.
func TestAdoptionAfterRestart(t *testing.T) {
	n := network("n", "10.81.0.0/29") // .2 to .6 for pods
	done := holding("done", `[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":["10.81.0.3/29"]}]`)
	done.Status.Phase = corev1.PodSucceeded
	c := &cluster{networks: []*samplecrdv2.Network{n}, pods: []*corev1.Pod{
		holding("p", `[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":["10.81.0.2/29"]}]`),
		holding("q", `[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":["10.81.0.4/29"]}]`),
		done,
	}}
	al := c.allocator()
	if got := usage(t, al, n); got != 2 {
		t.Fatalf("usage after the restart: %d, want p's and q's", got)
	}
	for _, name := range []string{"r", "s", "t"} {
		got, err := al.Allocate(pod(name), selections(t, "n"))
		if err != nil || got[0].IPs[0] == "10.81.0.2/29" || got[0].IPs[0] == "10.81.0.4/29" {
			t.Fatalf("%s: %+v %v, want an address no pod holds", name, got, err)
		}
	}
	if _, err := al.Allocate(pod("u"), selections(t, "n")); !waits(err, ReasonNoFreeAddress, false, "Network ns/n has no free address") {
		t.Fatalf("u: %v, want it to wait for a free address", err)
	}
	// p, never synced, goes.
	al.Release(cache.ObjectName{Namespace: "ns", Name: "p"}, "")
	if got := usage(t, al, n); got != 4 || !c.retriedPod("u") {
		t.Fatalf("after p went: %d allocated, retried %v; want q's and three, u retried", got, c.retried)
	}
	have, err := netselect.ParseAllocations(c.pods[1].Annotations[netselect.AllocationsAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	al.Adopt(cache.ObjectName{Namespace: "ns", Name: "q"}, "q-uid", have)
	al.Release(cache.ObjectName{Namespace: "ns", Name: "q"}, "q-uid")
	if got := usage(t, al, n); got != 3 {
		t.Fatalf("after q, adopted, went: %d allocated, want the three new", got)
	}
}

// An address asked for that another pod holds is waited for, and the
// waiting pod retried once it is free; one outside the Network's cidrs,
// or its gateway, waits too (the cidrs and gateway may change); one of
// another prefix length can never be the pod's: refused, nothing waits.
// CheckPinned says why any of them is not a pod's before a pod exists.
func TestPinnedAddress(t *testing.T) {
	n := network("n", "10.83.0.0/24")
	c := &cluster{networks: []*samplecrdv2.Network{n}}
	al := c.allocator()
	for _, tc := range []struct {
		ip, refusal string
	}{
		{"10.83.0.9", ""},
		{"10.83.0.1", "address 10.83.0.1"},
		{"10.84.0.5", "address 10.84.0.5: not in cidr 10.83.0.0/24"},
		{"10.83.0.9/16", "prefix length 16, the Network's is 24"},
	} {
		err := al.CheckPinned(n, selections(t, `[{"name":"n","ips":["`+tc.ip+`"]}]`)[0])
		if tc.refusal == "" && err != nil || tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), tc.refusal)) {
			t.Errorf("CheckPinned %s: %v, want %q", tc.ip, err, tc.refusal)
		}
	}
	pinning := func(ip string) []netselect.Selection { return selections(t, `[{"name":"n","ips":["`+ip+`"]}]`) }
	if got, err := al.Allocate(pod("a"), pinning("10.83.0.9")); err != nil || got[0].IPs[0] != "10.83.0.9/24" {
		t.Fatalf("a: %+v %v, want 10.83.0.9/24", got, err)
	}
	if _, err := al.Allocate(pod("b"), pinning("10.83.0.9")); !waits(err, ReasonAddressRefused, false, "Network ns/n: ") {
		t.Fatalf("b, a's address: %v, want it to wait", err)
	}
	if _, err := al.Allocate(pod("outside"), pinning("10.84.0.5")); !waits(err, ReasonAddressRefused, false, "not in cidr") {
		t.Fatalf("outside the cidr: %v, want it to wait", err)
	}
	if _, err := al.Allocate(pod("gateway"), pinning("10.83.0.1")); !waits(err, ReasonAddressRefused, false, "the gateway of cidr 10.83.0.0/24") {
		t.Fatalf("the gateway: %v, want it to wait", err)
	}
	if _, err := al.Allocate(pod("length"), pinning("10.83.0.7/16")); !waits(err, ReasonAddressRefused, true, "prefix length 16") {
		t.Fatalf("another prefix length: %v, want it refused", err)
	}
	if got := usage(t, al, n); got != 1 {
		t.Fatalf("after the waits and the refusal: %d allocated, want a's alone", got)
	}
	al.Release(cache.ObjectName{Namespace: "ns", Name: "a"}, "a-uid")
	if !c.retriedPod("b") || !c.retriedPod("outside") || !c.retriedPod("gateway") || len(c.retried) != 0 {
		t.Fatalf("retried once a went: %v, want b, outside and gateway, not the refused length", c.retried)
	}
	if got, err := al.Allocate(pod("b"), pinning("10.83.0.9")); err != nil || got[0].IPs[0] != "10.83.0.9/24" {
		t.Fatalf("b, once a went: %+v %v", got, err)
	}
}

// PinnedHolder names the other pod that holds a pinned address or MAC, as
// the pods cache shows it: not the pod itself, nor one being deleted.
func TestPinnedHolder(t *testing.T) {
	n := network("n", "10.85.0.0/24")
	holder := holding("h", `[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":["10.85.0.20/24"],"mac":"02:00:00:00:00:20"}]`)
	c := &cluster{networks: []*samplecrdv2.Network{n}, pods: []*corev1.Pod{holder}}
	al := c.allocator()
	byIP := selections(t, `[{"name":"n","ips":["10.85.0.20"]}]`)[0]
	byMAC := selections(t, `[{"name":"n","mac":"02:00:00:00:00:20"}]`)[0]
	other := cache.ObjectName{Namespace: "ns", Name: "x"}
	if err := al.PinnedHolder(n, byIP, other); err == nil || err.Error() != "address 10.85.0.20: held by pod ns/h" {
		t.Errorf("the address: %v, want h named", err)
	}
	if err := al.PinnedHolder(n, byMAC, other); err == nil || err.Error() != "mac 02:00:00:00:00:20: held by pod ns/h" {
		t.Errorf("the MAC: %v, want h named", err)
	}
	if err := al.PinnedHolder(n, byIP, cache.ObjectName{Namespace: "ns", Name: "h"}); err != nil {
		t.Errorf("h itself: %v, want none", err)
	}
	holder.DeletionTimestamp = &metav1.Time{}
	if err := al.PinnedHolder(n, byIP, other); err != nil {
		t.Errorf("h being deleted: %v, want none", err)
	}
}

// No two interfaces on a Network share a MAC, whose bridge would send one's
// frames to the other: a pod that pins the MAC another pod's interface on
// it has waits (its predecessor may be leaving), and gets it once that one
// is gone; on another Network it is free; on two of a pod's interfaces it
// is refused. An allocator that starts (a new leader) knows the MACs from
// the pods' allocations.
func TestPinnedMACIsOnePods(t *testing.T) {
	c := &cluster{networks: []*samplecrdv2.Network{network("a", "10.71.0.0/24"), network("b", "10.72.0.0/24")}}
	al := c.allocator()
	pinning := func(network string) []netselect.Selection {
		return selections(t, `[{"name":"`+network+`","mac":"02:00:00:00:00:07"}]`)
	}
	first, err := al.Allocate(pod("first"), pinning("a"))
	if err != nil || first[0].MAC != "02:00:00:00:00:07" {
		t.Fatalf("first: %+v %v", first, err)
	}
	if _, err := al.Allocate(pod("second"), pinning("a")); !waits(err, ReasonAddressRefused, false, "mac 02:00:00:00:00:07: another pod's interface on it has it") {
		t.Fatalf("second, the same MAC on the same Network: %v, want it to wait, saying why", err)
	}
	if got, err := al.Allocate(pod("other"), pinning("b")); err != nil || got[0].MAC != "02:00:00:00:00:07" {
		t.Fatalf("the same MAC on another Network: %+v %v", got, err)
	}
	if got := usage(t, al, c.networks[0]); got != 1 {
		t.Errorf("a after the refusal: %d addresses handed out, want first's alone", got)
	}
	// A pod's interface asks, hot-plugged, for the MAC another of its
	// interfaces has.
	if _, err := al.Allocate(pod("twice"), selections(t, `[{"name":"b","interface":"net1","mac":"02:00:00:00:00:08"}]`)); err != nil {
		t.Fatal(err)
	}
	added := selections(t, `[{"name":"b","interface":"net2","mac":"02:00:00:00:00:08"}]`)
	if _, err := al.Change(pod("twice"), nil, added); !waits(err, ReasonAddressRefused, true, "pinned on two of the pod's interfaces") {
		t.Fatalf("one MAC on two of a pod's interfaces: %v, want it refused", err)
	}
	al.Release(cache.ObjectName{Namespace: "ns", Name: "first"}, "first-uid")
	if !c.retriedPod("second") {
		t.Fatalf("retried once first went: %v, want second", c.retried)
	}
	if got, err := al.Allocate(pod("second"), pinning("a")); err != nil || got[0].MAC != "02:00:00:00:00:07" {
		t.Fatalf("second, once first is gone: %+v %v", got, err)
	}

	// A new leader, whose pods cache has second's allocation.
	leader := &cluster{networks: c.networks, pods: []*corev1.Pod{
		holding("second", `[{"network":"ns/a","networkUID":"a-uid","interface":"net1","ips":["10.71.0.2/24"],"mac":"02:00:00:00:00:07"}]`),
	}}
	if _, err := leader.allocator().Allocate(pod("third"), pinning("a")); !waits(err, ReasonAddressRefused, false, "mac 02:00:00:00:00:07") {
		t.Fatalf("third, on a new leader: %v, want it to wait for second's MAC", err)
	}
}

// The MACs netop makes from addresses are kept apart from pinned ones: two
// interfaces whose addresses end alike (IPv6 addresses equal in their last
// four bytes) get the same made MAC, as before, and neither waits for the
// other, whose bridge port it never was to share with a pin.
func TestMadeMACsDoNotWait(t *testing.T) {
	al := (&cluster{networks: []*samplecrdv2.Network{network("v6", "fd00:71::/64")}}).allocator()
	for i, ip := range []string{"fd00:71::1:0:0:7", "fd00:71::7"} {
		if got, err := al.Allocate(pod(fmt.Sprintf("p%d", i)), selections(t, `[{"name":"v6","ips":["`+ip+`"]}]`)); err != nil || got[0].MAC != "0a:58:00:00:00:07" {
			t.Fatalf("%s: %+v %v, want it allocated with its made MAC", ip, got, err)
		}
	}
}

// A pod waits for a Network that does not exist, and is retried when it
// appears.
func TestWaitsForTheNetwork(t *testing.T) {
	c := &cluster{}
	al := c.allocator()
	if _, err := al.Allocate(pod("p"), selections(t, "late")); !waits(err, ReasonNetworkNotFound, false, "Network ns/late: ") {
		t.Fatalf("before the Network: %v, want it to wait", err)
	}
	late := network("late", "10.86.0.0/24")
	c.networks = append(c.networks, late)
	al.NetworkChanged(late)
	if !c.retriedPod("p") {
		t.Fatalf("retried once the Network appeared: %v, want p", c.retried)
	}
	if _, err := al.Allocate(pod("p"), selections(t, "late")); err != nil {
		t.Fatalf("once the Network appeared: %v", err)
	}
}

// Retire counts the pods that hold addresses of a Network being deleted,
// and nothing more is allocated in it, as in a Network the cache shows
// being deleted.
func TestRetire(t *testing.T) {
	n, gone := network("n", "10.87.0.0/24"), network("gone", "10.88.0.0/24")
	gone.DeletionTimestamp = &metav1.Time{}
	c := &cluster{networks: []*samplecrdv2.Network{n, gone}, pods: []*corev1.Pod{
		holding("p", `[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":["10.87.0.2/24"]}]`),
	}}
	al := c.allocator()
	if h, err := al.Retire(n, 3); err != nil || h.Count != 1 || !slices.Equal(h.Pods, []string{"ns/p"}) {
		t.Fatalf("Retire: %+v %v, want p", h, err)
	}
	for _, name := range []string{"n", "gone"} {
		if _, err := al.Allocate(pod("q"), selections(t, name)); !waits(err, ReasonNetworkNotFound, false, "Network ns/"+name+" is being deleted") {
			t.Errorf("in %s: %v, want it to wait", name, err)
		}
	}
}

// A pod of a namespace the Network does not admit is refused, and retried
// once its namespace changes. A pod that holds addresses of a Network its
// namespace may no longer join is an outsider, and the Network is told
// when its namespace changes.
func TestTenancy(t *testing.T) {
	n := network("n", "10.89.0.0/24")
	n.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	c := &cluster{networks: []*samplecrdv2.Network{n}, labels: map[string]map[string]string{"other": {"team": "b"}}}
	al := c.allocator()
	guest := pod("guest")
	guest.Namespace = "other"
	if _, err := al.Allocate(guest, selections(t, "ns/n")); !waits(err, ReasonNotAdmitted, true, "pods of namespace other may not join Network ns/n") {
		t.Fatalf("guest of a namespace not selected: %v, want it refused", err)
	}
	unseen := pod("unseen")
	unseen.Namespace = "new"
	if _, err := al.Allocate(unseen, selections(t, "ns/n")); !waits(err, ReasonNotAdmitted, true, "namespace new not seen yet") {
		t.Fatalf("pod of a namespace not seen: %v, want it refused, saying why", err)
	}
	c.labels["other"] = map[string]string{"team": "a"}
	al.NamespaceChanged("other")
	if !slices.Contains(c.retried, cache.ObjectName{Namespace: "other", Name: "guest"}) || len(c.retried) != 1 {
		t.Fatalf("retried once other was relabelled: %v, want guest alone", c.retried)
	}
	got, err := al.Allocate(guest, selections(t, "ns/n"))
	if err != nil {
		t.Fatalf("guest once other is selected: %v", err)
	}
	guest.Annotations = map[string]string{netselect.AllocationsAnnotation: fmt.Sprintf(`[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":[%q]}]`, got[0].IPs[0])}
	c.pods = append(c.pods, guest)
	if h, err := al.Outsiders(n, 3); err != nil || h.Count != 0 {
		t.Fatalf("outsiders while other is selected: %+v %v, want none", h, err)
	}
	c.labels["other"] = map[string]string{"team": "b"}
	al.NamespaceChanged("other")
	if !slices.Equal(c.told, []string{"ns/n"}) {
		t.Errorf("told once other was relabelled again: %v, want ns/n", c.told)
	}
	if h, err := al.Outsiders(n, 3); err != nil || h.Count != 1 || !slices.Equal(h.Pods, []string{"other/guest"}) {
		t.Fatalf("outsiders once other is not selected: %+v %v, want guest", h, err)
	}
}

// A replica that does not lead runs no sync, so its pools never learn of
// the leader's allocations; Held, which the Network webhook asks on every
// replica, must still count the pods that hold addresses (from the pods
// cache), or a cidr could move under them.
func TestHeldOnAReplicaThatDoesNotLead(t *testing.T) {
	n := network("n", "10.70.0.0/24")
	c := &cluster{networks: []*samplecrdv2.Network{n}}
	al := c.allocator()
	if h, err := al.Held(n, netip.MustParsePrefix("10.70.0.0/24"), 3); err != nil || h.Count != 0 {
		t.Fatalf("no pods yet: %+v %v", h, err)
	}
	// The leader allocates; this replica's cache sees the pod.
	c.pods = append(c.pods, holding("p", `[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":["10.70.0.2/24"],"mac":"0a:58:0a:46:00:02"}]`))
	h, err := al.Held(n, netip.MustParsePrefix("10.70.0.0/24"), 3)
	if err != nil || h.Count != 1 || len(h.Pods) != 1 || h.Pods[0] != "ns/p" {
		t.Fatalf("after the leader's allocation: %+v %v, want ns/p", h, err)
	}
}

// On the leader, an address whose pod's allocation is still being written
// (not in the pods cache yet) is held already: HeldIn and Held count it,
// in its family and its range alone.
func TestHeldBeforeTheCacheHasIt(t *testing.T) {
	n := network("dual", "10.90.0.0/24", "fd00:90::/64")
	al := (&cluster{networks: []*samplecrdv2.Network{n}}).allocator()
	got, err := al.Allocate(pod("p"), selections(t, `[{"name":"dual","ips":["10.90.0.50"]}]`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		first, last string
		want        int64
	}{{"10.90.0.40", "10.90.0.60", 1}, {"10.90.0.60", "10.90.0.70", 0}} {
		r := ipam.Range{First: netip.MustParseAddr(tc.first), Last: netip.MustParseAddr(tc.last)}
		if h, err := al.HeldIn(n, r, 3); err != nil || h.Count != tc.want || len(h.Pods) != 0 {
			t.Errorf("HeldIn %s: %+v %v, want %d unnamed (p holds %v)", r, h, err, tc.want, got[0].IPs)
		}
	}
	if h, err := al.Held(n, netip.MustParsePrefix("fd00:90::/64"), 3); err != nil || h.Count != 1 {
		t.Errorf("Held of the IPv6 family: %+v %v, want p's", h, err)
	}
	if h, err := al.Held(n, netip.MustParsePrefix("10.91.0.0/24"), 3); err != nil || h.Count != 0 {
		t.Errorf("Held of a cidr the Network does not have: %+v %v, want none", h, err)
	}
}
