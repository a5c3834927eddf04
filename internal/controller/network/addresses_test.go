package network

import (
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// unreadUsage is the allocation controller of one pod on every Network,
// whose caches are filled once the test opens the gate.
type unreadUsage struct{ *gate }

func (u unreadUsage) Usage(*samplecrdv2.Network) (*samplecrdv2.NetworkAddresses, error) {
	if !u.read() {
		return &samplecrdv2.NetworkAddresses{Available: "253"}, nil
	}
	return &samplecrdv2.NetworkAddresses{Allocated: 1, Available: "252"}, nil
}

func (u unreadUsage) Retire(*samplecrdv2.Network, int) (netselect.Holders, error) {
	u.read()
	return netselect.Holders{}, nil
}

func (u unreadUsage) Outsiders(*samplecrdv2.Network, int) (netselect.Holders, error) {
	u.read()
	return netselect.Holders{}, nil
}

func (u unreadUsage) OnUsageChanged(func(cache.ObjectName)) {}
func (u unreadUsage) Synced() []cache.DoneChecker           { return []cache.DoneChecker{u.gate} }

// A controller that just became leader syncs no Network before the
// allocation controller's caches are filled: it would write the addresses
// of pods it has not seen as free (and the pods of a namespace it has not
// seen as outsiders).
func TestSyncsAfterTheAddressUsage(t *testing.T) {
	n := network("net", "10.0.0.0/24", "10.0.0.1")
	usage := unreadUsage{newGate("the pods and namespaces")}
	client := runOn(t, n, Options{Workers: 1, Resync: time.Hour, Addresses: usage})
	usage.open(t)
	waitFor(t, client, n, "the Network's status does not count the pod once the caches were filled", func(got *samplecrdv2.Network) bool {
		return got.Status.Addresses != nil && got.Status.Addresses.Allocated == 1
	})
	if usage.early.Load() {
		t.Error("a Network's address usage was read before the caches were filled")
	}
}
