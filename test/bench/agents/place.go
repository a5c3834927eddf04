package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/node"
)

// placement is one node's share of the Networks: the pod's Networks, by
// UID, and the node that shares them (-1: none, the last of an odd count).
type placement struct {
	uids []types.UID
	peer int
}

// place gives each node a pod on perNode Networks (nodes 2i and 2i+1 the
// same ones), and waits until every node has each of its Networks usable:
// its bridge up and its VXLAN device flooding to the other node. It
// records the time that took and what each node then has.
// byName maps the Networks' names to their UIDs.
func place(ctx context.Context, kube kubernetes.Interface, names, netnss []string, underlay *node.Underlay, perNode int,
	byName map[string]types.UID, res *result) error {
	placements := make([]placement, len(names))
	began := time.Now()
	for i := range names {
		var networks []string
		p := placement{peer: i ^ 1}
		if p.peer >= len(names) {
			p.peer = -1
		}
		for j := range perNode {
			name := fmt.Sprintf("n%d", (i/2)*perNode+j)
			networks = append(networks, name)
			p.uids = append(p.uids, byName[name])
		}
		placements[i] = p
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "placed-" + names[i], Annotations: map[string]string{netselect.NetworksAnnotation: strings.Join(networks, ",")}},
			Spec: corev1.PodSpec{NodeName: names[i], Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("placing pod on %s: %w", names[i], err)
		}
	}
	handles := make([]*netlink.Handle, len(netnss))
	for i, name := range netnss {
		ns, err := netns.GetFromName(name)
		if err != nil {
			return err
		}
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		_ = ns.Close()
		if err != nil {
			return err
		}
		defer h.Close()
		handles[i] = h
	}
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		usable := 0
		for i, p := range placements {
			var peer netip.Addr
			if p.peer >= 0 {
				peer = underlay.Nodes[p.peer].Address
			}
			for _, uid := range p.uids {
				if isUsable(handles[i], uid, peer) {
					usable++
				}
			}
		}
		msg := fmt.Sprintf("%d of %d placements usable", usable, len(names)*perNode)
		if msg != last {
			fmt.Fprintf(os.Stderr, "%5.0fs %s\n", time.Since(began).Seconds(), msg)
			last = msg
		}
		return usable == len(names)*perNode, nil
	}); err != nil {
		return fmt.Errorf("not every placement usable: %s", last)
	}
	res.PlacedS = time.Since(began).Seconds()
	var links, vxlans, floods []float64
	for _, h := range handles {
		l, v, f, err := devices(h)
		if err != nil {
			return err
		}
		links, vxlans, floods = append(links, float64(l)), append(vxlans, float64(v)), append(floods, float64(f))
	}
	res.Links, res.VXLANDevices, res.FloodEntries = statOf(links), statOf(vxlans), statOf(floods)
	return nil
}

// isUsable: the Network's bridge is up on the node of h, and its VXLAN
// device floods to peer (if valid).
func isUsable(h *netlink.Handle, uid types.UID, peer netip.Addr) bool {
	bridge, err := h.LinkByName(ifname.Bridge(uid))
	if err != nil || bridge.Attrs().Flags&net.FlagUp == 0 {
		return false
	}
	vx, err := h.LinkByName(linux.VXLANName(uid))
	if err != nil {
		return false
	}
	if !peer.IsValid() {
		return true
	}
	neighs, err := h.NeighList(vx.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return false
	}
	for _, n := range neighs {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == peer && isZero(n.HardwareAddr) {
			return true
		}
	}
	return false
}

// devices counts the links of the node of h, its VXLAN devices, and
// their flooding entries.
func devices(h *netlink.Handle) (links, vxlans, floods int, err error) {
	all, err := h.LinkList()
	if err != nil {
		return 0, 0, 0, err
	}
	for _, l := range all {
		if l.Type() != "vxlan" {
			continue
		}
		vxlans++
		neighs, err := h.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return 0, 0, 0, err
		}
		for _, n := range neighs {
			if isZero(n.HardwareAddr) {
				floods++
			}
		}
	}
	return len(all), vxlans, floods, nil
}

func isZero(mac net.HardwareAddr) bool {
	return mac.String() == "00:00:00:00:00:00"
}
