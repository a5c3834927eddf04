package allocated

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
)

func TestAttachment(t *testing.T) {
	a := netselect.Allocation{
		Network: "ns1/blue", NetworkUID: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", Interface: "net1",
		IPs: []string{"10.1.0.5/24", "fd00::5/64"}, MAC: "02:00:00:00:00:05",
		Routes: []netselect.Route{{Dst: "10.9.0.0/16", GW: "10.1.0.1"}},
	}
	at, err := Attachment("c1", "/run/netns/p", a)
	if err != nil {
		t.Fatal(err)
	}
	if at.Bridge != "netop0f1e2d3c4b" || at.Interface != "net1" || at.Netns != "/run/netns/p" || at.ContainerID != "c1" {
		t.Errorf("attachment %+v", at)
	}
	if len(at.Addresses) != 2 || at.Addresses[1] != netip.MustParsePrefix("fd00::5/64") || at.MAC.String() != a.MAC {
		t.Errorf("addresses %v, mac %v", at.Addresses, at.MAC)
	}
	if len(at.Routes) != 1 || at.Routes[0] != (cni.Route{Dst: netip.MustParsePrefix("10.9.0.0/16"), GW: netip.MustParseAddr("10.1.0.1")}) {
		t.Errorf("routes %v", at.Routes)
	}

	for field, broken := range map[string]func(*netselect.Allocation){
		"address": func(a *netselect.Allocation) { a.IPs = []string{"10.1.0.5"} },
		"mac":     func(a *netselect.Allocation) { a.MAC = "02:00" },
		"route":   func(a *netselect.Allocation) { a.Routes = []netselect.Route{{Dst: "10.9.0.0/16", GW: "gw"}} },
	} {
		b := a
		broken(&b)
		_, err := Attachment("c1", "/run/netns/p", b)
		if err == nil || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), "ns1/blue") {
			t.Errorf("broken %s: error %v, want one naming the field and the Network", field, err)
		}
	}
}

func TestInterfacesReplaceInTheRecord(t *testing.T) {
	blue := netselect.Allocation{Network: "ns1/blue", NetworkUID: "0f1e2d3c-4b5a", Interface: "net1", IPs: []string{"10.1.0.5/24"}}
	red := netselect.Allocation{Network: "ns1/red", NetworkUID: "99887766-5544", Interface: "net1", IPs: []string{"10.2.0.5/24"}}
	rec := cni.Record{ContainerID: "c1"}.With(Interfaces("conf", "c1", blue)...)
	rec = rec.With(Interfaces("conf", "c1", red)...)
	if len(rec.Interfaces) != 1 {
		t.Fatalf("net1 recorded %d times: %+v", len(rec.Interfaces), rec.Interfaces)
	}
	got := rec.Interfaces[0]
	if got.Network != "ns1/red" || got.Bridge != ifname.Bridge(red.NetworkUID) || got.HostVeth != ifname.HostVeth("c1", "net1") || got.Config != "conf" {
		t.Errorf("recorded %+v", got)
	}
}
