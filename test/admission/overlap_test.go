package admission

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// Overlapping Networks created at the same instant in several namespaces
// can all pass admission, which checks a cache; the controller must still
// never build two overlapping networks, and must say which one lost.
func TestSimultaneousOverlappingCreates(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	namespaces := []string{env.Namespace(t), env.Namespace(t), env.Namespace(t)}
	ctx := t.Context()
	const rounds = 60
	admittedTogether := 0
	// The bridges are sampled all along, not only once a round settled:
	// two overlapping networks must never exist, even for a moment.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var samples, violations int
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			samples++
			if overlapping := overlappingBridges(t); len(overlapping) > 0 {
				violations++
				t.Errorf("two overlapping bridges exist: %v", overlapping)
			}
			select {
			case <-sampleCtx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	for round := range rounds {
		base := fmt.Sprintf("10.%d", 140+round) // 10.140-10.199: no other test of this package uses them
		var cidrs []string
		switch round % 3 {
		case 0: // the same cidr twice
			cidrs = []string{base + ".1.0/24", base + ".1.0/24"}
		case 1: // a /16 and a /24 inside it
			cidrs = []string{base + ".0.0/16", base + ".9.0/24"}
		default: // three namespaces: a /16 and the same /24 twice
			cidrs = []string{base + ".0.0/16", base + ".5.0/24", base + ".5.0/24"}
		}
		name := fmt.Sprintf("round%d", round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		admitted := map[string]string{} // namespace → cidr
		for i, cidr := range cidrs {
			wg.Go(func() {
				<-start
				_, err := env.Netop.SamplecrdV1().Networks(namespaces[i]).Create(ctx, &samplecrdv1.Network{
					ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec:       samplecrdv1.NetworkSpec{CIDR: cidr},
				}, metav1.CreateOptions{})
				switch {
				case err == nil:
					mu.Lock()
					admitted[namespaces[i]] = cidr
					mu.Unlock()
				case !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err):
					// The webhook's refusal is the expected answer to all
					// but the first; anything else is a failure.
					t.Errorf("round %d: create in %s: %v", round, namespaces[i], err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(admitted) == 0 {
			t.Fatalf("round %d: no Network admitted", round)
		}
		if len(admitted) > 1 {
			admittedTogether++
		}

		// Every admitted Network settles, Ready or not built for Overlap,
		// and no two Ready ones overlap. (A Network built before an older
		// overlapping one was seen is Ready for a moment, then gives its
		// network up: the older one waits for that, so the two networks
		// never exist at once.)
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			var built []*samplecrdv1.Network
			for ns := range admitted {
				n, err := env.Netop.SamplecrdV1().Networks(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, err.Error()
				}
				ready := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady)
				if ready == nil || n.Status.ObservedGeneration != n.Generation ||
					ready.Reason != samplecrd.ReasonProvisioned && ready.Reason != samplecrd.ReasonOverlap {
					return false, fmt.Sprintf("%s/%s not settled: %+v", ns, name, ready)
				}
				if ready.Status == metav1.ConditionTrue {
					built = append(built, n)
				}
			}
			if len(built) == 0 {
				return false, fmt.Sprintf("none of %d admitted Networks is built", len(admitted))
			}
			for i, a := range built {
				for _, b := range built[i+1:] {
					if netip.MustParsePrefix(a.Spec.CIDR).Overlaps(netip.MustParsePrefix(b.Spec.CIDR)) {
						return false, fmt.Sprintf("%s/%s (%s) and %s/%s (%s) are both Ready", a.Namespace, a.Name, a.Spec.CIDR, b.Namespace, b.Name, b.Spec.CIDR)
					}
				}
			}
			return true, ""
		})
		for ns := range admitted {
			if err := env.Netop.SamplecrdV1().Networks(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	stopSampling()
	<-sampled
	t.Logf("%d of %d rounds admitted more than one overlapping Network; %d samples of the bridges, %d with an overlap",
		admittedTogether, rounds, samples, violations)
	if admittedTogether == 0 {
		t.Error("admission refused every simultaneous overlap: the controller's arbitration was not exercised")
	}
}

// overlappingBridges lists the pairs of bridges in the operator's network
// namespace that carry overlapping subnets.
func overlappingBridges(t *testing.T) []string {
	handleNS, err := netns.GetFromName(operatorNetns)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer func() { _ = handleNS.Close() }()
	handle, err := netlink.NewHandleAt(handleNS)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer handle.Close()
	addrs, err := handle.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		// A dump interrupted by a concurrent change is retried next time.
		return nil
	}
	var out []string
	byLink := map[int]netip.Prefix{}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.IsLinkLocalUnicast() || ip.IsLoopback() {
			continue
		}
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip.Unmap(), ones).Masked()
		for link, q := range byLink {
			if link != a.LinkIndex && p.Overlaps(q) {
				out = append(out, fmt.Sprintf("link %d %s and link %d %s", a.LinkIndex, p, link, q))
			}
		}
		byLink[a.LinkIndex] = p
	}
	return out
}

// Of two overlapping Networks created back to back, as one kubectl apply
// creates them, the second is refused every time, on a busy machine too:
// the overlap check reads its own writes, not only what its informer has
// been delivered.
func TestOverlapBackToBackRefused(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	namespace := env.Namespace(t)
	nets := env.Netop.SamplecrdV1().Networks(namespace)
	ctx := t.Context()
	testenv.BurnCPU(t)
	for i := range 30 {
		first, second := fmt.Sprintf("10.230.%d.0/24", i), fmt.Sprintf("10.230.%d.128/25", i) // 10.230: no other test of this package uses it
		if _, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("first%d", i)},
			Spec: samplecrdv1.NetworkSpec{CIDR: first}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %v", first, err)
		}
		_, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("second%d", i)},
			Spec: samplecrdv1.NetworkSpec{CIDR: second}}, metav1.CreateOptions{})
		if want := fmt.Sprintf("overlaps Network %s/first%d", namespace, i); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s right after %s: %v, want refused: %s", second, first, err, want)
		}
		if err := nets.Delete(ctx, fmt.Sprintf("first%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
