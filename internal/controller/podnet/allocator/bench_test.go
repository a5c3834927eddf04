package allocator

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// An allocation and its release, on a dual-stack Network with reserved
// ranges and a route, as the API server stores it (a UID and a
// resourceVersion): what each pod's start and end cost the allocator.
func BenchmarkAllocateRelease(b *testing.B) {
	n := network("n", "10.80.0.0/16", "fd80::/64")
	n.ResourceVersion = "7"
	n.Spec.Reserved = []string{"10.80.0.200-10.80.0.209", "fd80::100/120"}
	n.Spec.Routes = []samplecrdv2.NetworkRoute{{Destination: "10.99.0.0/16"}}
	c := &cluster{networks: []*samplecrdv2.Network{n}}
	al := c.allocator()
	s, err := netselect.Parse("n", "ns")
	if err != nil {
		b.Fatal(err)
	}
	pods := make([]*corev1.Pod, 64)
	for i := range pods {
		pods[i] = pod(fmt.Sprintf("p%d", i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p := pods[i%len(pods)]
		i++
		if _, err := al.Allocate(p, s); err != nil {
			b.Fatal(err)
		}
		al.Release(cache.MetaObjectToName(p), p.UID)
	}
}

// Usage is asked of every Network whose pods came or went, once a second
// at most, and of each sync.
func BenchmarkUsage(b *testing.B) {
	n := network("n", "10.80.0.0/16", "fd80::/64")
	n.ResourceVersion = "7"
	c := &cluster{networks: []*samplecrdv2.Network{n}}
	al := c.allocator()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := al.Usage(n); err != nil {
			b.Fatal(err)
		}
	}
}
