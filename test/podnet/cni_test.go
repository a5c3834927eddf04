package podnet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"

	"github.com/netop-dev/netop/internal/backend/backends"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/gobuild"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

var (
	pluginOnce sync.Once
	pluginDir  string
	pluginErr  error
)

// buildPlugin builds netop's CNI plugin once per test binary, into a
// directory that is the runtime's CNI bin directory.
func buildPlugin(t *testing.T) string {
	t.Helper()
	pluginOnce.Do(func() {
		pluginDir, pluginErr = os.MkdirTemp("", "netop-cni-bin-")
		if pluginErr != nil {
			return
		}
		pluginErr = gobuild.Static(filepath.Join(pluginDir, cniapi.Type), gobuild.Plugin)
	})
	if pluginErr != nil {
		t.Fatal(pluginErr)
	}
	return pluginDir
}

// namedNetns makes a throwaway network namespace and returns its path.
func namedNetns(t *testing.T, prefix string) (name, path string) {
	t.Helper()
	name = nettest.NetnsName(prefix)
	if err := linux.EnsureNetns(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nettest.DeleteNetns(name) })
	return name, filepath.Join("/run/netns", name)
}

// cniNode is a node for the plugin: a network namespace in which the
// operator (with the allocation controller and the linux backend) makes
// the Networks' bridges, and a runtime's view of the plugin.
type cniNode struct {
	env     *testenv.Env
	ns      string // the pods' Kubernetes namespace
	netns   string // path of the node's network namespace
	node    *netlink.Handle
	runtime *libcni.CNIConfig
	dataDir string
	// socket is the operator's CNI server's; stop stops the operator.
	socket   string
	op       *operator.Operator
	stop     func()
	networks map[string]*samplecrdv1.Network
}

func startCNINode(t *testing.T) *cniNode { t.Helper(); return startCNINodeWith(t, nil) }

// startCNINodeWith starts the node with the operator's options edited.
func startCNINodeWith(t *testing.T, edit func(*operator.Options)) *cniNode {
	t.Helper()
	return startCNINodeVia(t, nil, edit)
}

// startCNINodeVia starts the node with an operator that reaches the API
// server with cfg (the test's if nil).
func startCNINodeVia(t *testing.T, cfg *rest.Config, edit func(*operator.Options)) *cniNode {
	t.Helper()
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	n := &cniNode{env: env, ns: env.Namespace(t), dataDir: t.TempDir(), networks: map[string]*samplecrdv1.Network{}}
	var nodeNetns string
	nodeNetns, n.netns = namedNetns(t, "cninode")
	n.node = nettest.Handle(t, nodeNetns)
	n.runtime = libcni.NewCNIConfigWithCacheDir([]string{buildPlugin(t)}, t.TempDir(), nil)

	_, ctx := ktesting.NewTestContext(t)
	opts := operator.NewOptions()
	opts.Backend.Netns = nodeNetns
	opts.Namespace = n.ns
	opts.Metrics.Addr = "0"
	opts.Webhooks.Addr = "0"
	opts.Workloads.Enabled = false
	// A path: the plugin runs in the test's namespace, not the node's.
	sockets, err := os.MkdirTemp("", "netop-cni-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockets) })
	opts.CNISocket = filepath.Join(sockets, "cni.sock")
	if edit != nil {
		edit(opts)
	}
	be, closeBackend, err := backends.New(ctx, opts.Backend, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeBackend)
	if cfg == nil {
		cfg = env.Config
	}
	n.op, n.stop = testenv.StartOperator(t, cfg, opts, be)
	n.socket = opts.CNISocket
	for name, cidr := range map[string]string{"example-network": "192.168.0.0/16", "v6": "fd00:42::/64"} {
		createNetwork(t, env, n.ns, name, cidr)
		n.networks[name] = env.WaitReady(t, n.ns, name, metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	}
	return n
}

// conf is the plugin's configuration list at a CNI version; network makes
// it a delegate for one Network.
func (n *cniNode) conf(t *testing.T, version, network string, edit ...func(*cniapi.Config)) *libcni.NetworkConfigList {
	t.Helper()
	c := cniapi.Config{Socket: n.socket, NodeNetns: n.netns, DataDir: n.dataDir, Network: network, Timeout: "20s"}
	c.Type = cniapi.Type
	for _, e := range edit {
		e(&c)
	}
	data, err := json.Marshal(map[string]any{"cniVersion": version, "name": "netop-test", "plugins": []any{c}})
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// sandbox is a pod as the runtime sees it.
type sandbox struct {
	pod         *corev1.Pod
	containerID string
	netns       string
	handle      *netlink.Handle
	allocations []netselect.Allocation
}

func (s *sandbox) rt(ifname string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: s.containerID, NetNS: s.netns, IfName: ifname, Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", s.pod.Namespace}, {"K8S_POD_NAME", s.pod.Name},
		{"K8S_POD_INFRA_CONTAINER_ID", s.containerID}, {"K8S_POD_UID", string(s.pod.UID)},
	}}
}

// newSandbox creates the pod and its network namespace, and waits for its
// allocations unless it declares none that can be allocated.
func (n *cniNode) newSandbox(t *testing.T, name, networks string, wait bool) *sandbox {
	t.Helper()
	return n.newSandboxIn(t, n.ns, name, networks, wait)
}

// newSandboxIn is newSandbox in namespace ns.
func (n *cniNode) newSandboxIn(t *testing.T, ns, name, networks string, wait bool) *sandbox {
	t.Helper()
	return n.newSandboxOn(t, ns, name, networks, "", wait)
}

// newSandboxOn is newSandboxIn with the pod bound to node.
func (n *cniNode) newSandboxOn(t *testing.T, ns, name, networks, node string, wait bool) *sandbox {
	t.Helper()
	createPodOn(t, n.env, ns, name, networks, node)
	s := &sandbox{containerID: "c-" + nettest.NetnsName(name)}
	var netnsName string
	netnsName, s.netns = namedNetns(t, "cnipod")
	s.handle = nettest.Handle(t, netnsName)
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		pod, err := n.env.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s.pod = pod
		s.allocations, err = netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		return !wait || err == nil && s.allocations != nil, fmt.Sprintf("allocations %q (%v)", pod.Annotations[netselect.AllocationsAnnotation], err)
	})
	return s
}

func (n *cniNode) bridge(t *testing.T, network string) netlink.Link {
	t.Helper()
	br, err := n.node.LinkByName(ifname.Bridge(n.networks[network].UID))
	if err != nil {
		t.Fatal(err)
	}
	return br
}

// requireAttached checks with netlink that each allocation is an interface
// of the pod, up, with the allocated address and MAC, whose host end is a
// port of the Network's bridge.
func (n *cniNode) requireAttached(t *testing.T, s *sandbox) {
	t.Helper()
	for _, a := range s.allocations {
		link, err := s.handle.LinkByName(a.Interface)
		if err != nil {
			t.Fatalf("pod %s: %s: %v", s.pod.Name, a.Interface, err)
		}
		if link.Attrs().Flags&net.FlagUp == 0 || link.Attrs().HardwareAddr.String() != a.MAC {
			t.Errorf("pod %s: %s: flags %v, MAC %s, want up and %s", s.pod.Name, a.Interface, link.Attrs().Flags, link.Attrs().HardwareAddr, a.MAC)
		}
		addrs, err := s.handle.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range a.IPs {
			if !slices.ContainsFunc(addrs, func(h netlink.Addr) bool { return h.IPNet.String() == ip }) {
				t.Errorf("pod %s: %s has %v, want %s", s.pod.Name, a.Interface, addrs, ip)
			}
		}
		// The connected route of the cidr, through the interface.
		routes, err := s.handle.RouteList(link, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range a.IPs {
			cidr := netip.MustParsePrefix(ip).Masked().String()
			if !slices.ContainsFunc(routes, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == cidr }) {
				t.Errorf("pod %s: no route to %s through %s: %v", s.pod.Name, cidr, a.Interface, routes)
			}
		}
		host, err := n.node.LinkByName(ifname.HostVeth(s.containerID, a.Interface))
		if err != nil {
			t.Fatalf("pod %s: host end of %s: %v", s.pod.Name, a.Interface, err)
		}
		network := strings.SplitN(a.Network, "/", 2)[1]
		if host.Attrs().MasterIndex != n.bridge(t, network).Attrs().Index {
			t.Errorf("pod %s: host end of %s is not a port of %s's bridge", s.pod.Name, a.Interface, network)
		}
	}
}

// requireDetached checks that none of the pod's interfaces or host ends is
// left, nor its record.
func (n *cniNode) requireDetached(t *testing.T, s *sandbox) {
	t.Helper()
	for _, a := range s.allocations {
		if _, err := n.node.LinkByName(ifname.HostVeth(s.containerID, a.Interface)); err == nil {
			t.Errorf("pod %s: host end of %s left", s.pod.Name, a.Interface)
		}
		if _, err := s.handle.LinkByName(a.Interface); err == nil {
			t.Errorf("pod %s: %s left", s.pod.Name, a.Interface)
		}
	}
	if _, ok, _ := (cni.Store{Dir: n.dataDir}).Load(s.containerID); ok {
		t.Errorf("pod %s: record left", s.pod.Name)
	}
}

func ping(t *testing.T, from *sandbox, to string) {
	t.Helper()
	args := []string{"--net=" + from.netns, "/bin/busybox", "ping", "-c", "1", "-W", "3"}
	if strings.Contains(to, ":") {
		args = append(args, "-6")
	}
	if out, err := exec.Command("nsenter", append(args, to)...).CombinedOutput(); err != nil {
		t.Errorf("pod %s: ping %s: %v\n%s", from.pod.Name, to, err, out)
	}
}

func addr(a netselect.Allocation) string { return strings.SplitN(a.IPs[0], "/", 2)[0] }

// The plugin as a runtime runs it (libcni, as containerd does: environment
// and stdin), for every spec version it supports, in chained mode: ADD
// attaches every Network the pod declares with the allocated addresses and
// MACs, and reports them; the pods reach each other and the gateways; CHECK
// passes and then finds a broken interface; GC detaches what the runtime
// no longer has and host ends no record knows; DEL needs no API server and
// is idempotent; STATUS says whether the node is usable.
func TestCNIPlugin(t *testing.T) {
	n := startCNINode(t)
	for _, version := range []string{"1.0.0", "1.1.0"} {
		t.Run(version, func(t *testing.T) {
			ctx := t.Context()
			list := n.conf(t, version, "")
			tag := strings.ReplaceAll(version, ".", "")
			a := n.newSandbox(t, "a"+tag, "example-network,v6", true)
			b := n.newSandbox(t, "b"+tag, "example-network", true)
			res, err := n.runtime.AddNetworkList(ctx, list, a.rt("eth0"))
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != version {
				t.Errorf("result version %s, want %s", res.Version(), version)
			}
			result, err := current.GetResult(res)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ip := range result.IPs {
				iface := result.Interfaces[*ip.Interface]
				got = append(got, iface.Name+" "+ip.Address.String()+" "+iface.Mac)
			}
			want := []string{"net1 " + a.allocations[0].IPs[0] + " " + a.allocations[0].MAC, "net2 " + a.allocations[1].IPs[0] + " " + a.allocations[1].MAC}
			if !slices.Equal(got, want) {
				t.Errorf("ADD result %v, want %v", got, want)
			}
			n.requireAttached(t, a)
			// Where a pod's start waits on netop is timed.
			for _, phase := range []string{metrics.CNIPhaseAllocation, metrics.CNIPhaseAttach} {
				if count := testenv.HistogramCount(t, n.op.Metrics().CNIAdd.WithLabelValues(phase, metrics.ResultSuccess)); count < 1 {
					t.Errorf("netop_cni_add_seconds{phase=%q,result=success}: %d samples after an ADD, want at least 1", phase, count)
				}
			}
			if _, err := n.runtime.AddNetworkList(ctx, list, b.rt("eth0")); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			n.requireAttached(t, b)
			ping(t, a, "192.168.0.1")
			ping(t, a, addr(b.allocations[0]))
			ping(t, b, addr(a.allocations[0]))
			ping(t, a, "fd00:42::1")

			if err := n.runtime.CheckNetworkList(ctx, list, a.rt("eth0")); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			net1, _ := a.handle.LinkByName("net1")
			if err := a.handle.LinkSetDown(net1); err != nil {
				t.Fatal(err)
			}
			if err := n.runtime.CheckNetworkList(ctx, list, a.rt("eth0")); err == nil || !strings.Contains(err.Error(), "net1: down") {
				t.Errorf("CHECK of a pod whose net1 is down: %v", err)
			}

			if version == "1.1.0" {
				if err := n.runtime.GetStatusNetworkList(ctx, list); err != nil {
					t.Errorf("STATUS: %v", err)
				}
				gone := n.conf(t, version, "", func(c *cniapi.Config) { c.NodeNetns = "/run/netns/no-such-node" })
				var cniErr *types.Error
				if err := n.runtime.GetStatusNetworkList(ctx, gone); err == nil || !asCNIError(err, &cniErr) || cniErr.Code != types.ErrPluginNotAvailable {
					t.Errorf("STATUS without the node's namespace: %v, want code %d", err, types.ErrPluginNotAvailable)
				}
				// A host end no record knows, as a crash between the
				// kernel's work and the record would leave.
				orphan := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ifname.HostVeth("gone", "net1")}, PeerName: "orphan-peer"}
				if err := n.node.LinkAdd(orphan); err != nil {
					t.Fatal(err)
				}
				// The runtime has only a: b goes, with the orphan.
				if err := n.runtime.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: a.containerID, IfName: "eth0"}}}); err != nil {
					t.Fatalf("GC: %v", err)
				}
				n.requireDetached(t, b)
				if _, err := n.node.LinkByName(orphan.Name); err == nil {
					t.Error("GC left a host end no record knows")
				}
				if _, err := n.node.LinkByName(ifname.HostVeth(a.containerID, "net1")); err != nil {
					t.Errorf("GC removed a valid attachment: %v", err)
				}
			}

			// DEL asks nothing of the node side, nor of the API server:
			// a configuration whose socket leads nowhere still detaches.
			offline := n.conf(t, version, "", func(c *cniapi.Config) { c.Socket = "/nonexistent/cni.sock" })
			for range 2 {
				if err := n.runtime.DelNetworkList(ctx, offline, a.rt("eth0")); err != nil {
					t.Fatalf("DEL: %v", err)
				}
				n.requireDetached(t, a)
			}
			if err := n.runtime.DelNetworkList(ctx, offline, b.rt("eth0")); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			n.requireDetached(t, b)
		})
	}
}

func asCNIError(err error, target **types.Error) bool {
	e, ok := err.(*types.Error)
	if ok {
		*target = e
	}
	return ok
}

// VERSION lists the spec versions the plugin speaks, from cmd/netop-cni
// and from the operator's binary installed under the plugin's name (one
// image carries both).
func TestCNIPluginVersion(t *testing.T) {
	operatorDir := t.TempDir()
	if err := gobuild.Command(filepath.Join(operatorDir, cniapi.Type), "github.com/netop-dev/netop/cmd/netop"); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{buildPlugin(t), operatorDir} {
		rt := libcni.NewCNIConfig([]string{dir}, nil)
		info, err := rt.GetVersionInfo(t.Context(), cniapi.Type)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"1.0.0", "1.1.0"} {
			if !slices.Contains(info.SupportedVersions(), v) {
				t.Errorf("%s: supported versions %v lack %s", dir, info.SupportedVersions(), v)
			}
		}
	}
}

// As a delegate (one configuration per Network, as Multus calls the
// configuration of a NetworkAttachmentDefinition), the plugin attaches the
// one interface it is called for; a pod whose addresses never come fails
// ADD with why, and leaves nothing.
func TestCNIPluginDelegateAndFailure(t *testing.T) {
	n := startCNINode(t)
	ctx := t.Context()
	s := n.newSandbox(t, "delegated", "example-network,v6", true)
	v6 := n.conf(t, "1.1.0", n.ns+"/v6")
	if _, err := n.runtime.AddNetworkList(ctx, v6, s.rt("net2")); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if _, err := s.handle.LinkByName("net1"); err == nil {
		t.Error("a delegate for v6 attached net1 too")
	}
	only := *s
	only.allocations = s.allocations[1:]
	n.requireAttached(t, &only)
	if _, err := n.runtime.AddNetworkList(ctx, v6, s.rt("net1")); err == nil || !strings.Contains(err.Error(), "no allocation on Network "+n.ns+"/v6 for interface net1") {
		t.Errorf("ADD of an interface the pod does not have on the Network: %v", err)
	}
	if err := n.runtime.DelNetworkList(ctx, v6, s.rt("net2")); err != nil {
		t.Fatal(err)
	}
	n.requireDetached(t, s)

	missing := n.newSandbox(t, "waits", "no-such-network", false)
	short := n.conf(t, "1.1.0", "", func(c *cniapi.Config) { c.Timeout = "2s" })
	_, err := n.runtime.AddNetworkList(ctx, short, missing.rt("eth0"))
	if err == nil || !strings.Contains(err.Error(), "netop has not allocated its addresses yet") {
		t.Errorf("ADD of a pod whose Network does not exist: %v", err)
	}
	if records, _, _ := (cni.Store{Dir: n.dataDir}).List(); len(records) != 0 {
		t.Errorf("records left: %+v", records)
	}

	// The runtime kills a plugin that outlives its own timeout: its ADD
	// ends on the node side with it, not at the configuration's timeout
	// (10 minutes here).
	// Its wait ends as failed: the metric of the waits that succeed does
	// not count it.
	allocationPhase := n.op.Metrics().CNIAdd.WithLabelValues(metrics.CNIPhaseAllocation, metrics.ResultError)
	ended := testenv.HistogramCount(t, allocationPhase)
	watching := pidfds(t)
	caller := n.startPlugin(t, "ADD", missing, "eth0", func(c *cniapi.Config) { c.Timeout = "10m" })
	// The node side (this process) opens a pidfd of its caller once it
	// has read the request; os/exec holds one of the plugin too.
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		return pidfds(t) >= watching+2, "the node side has not taken the plugin's request yet"
	})
	if err := caller.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = caller.Wait()
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		return testenv.HistogramCount(t, allocationPhase) > ended, "the node side still waits for the pod of a plugin that was killed"
	})

	// A pod of a namespace this netop does not manage (its --namespace)
	// joins none of its Networks: chained, nothing to attach, at once.
	elsewhere := &sandbox{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "not-" + n.ns, Name: "p", UID: "u"}},
		containerID: "c-elsewhere", netns: missing.netns}
	res, err := n.runtime.AddNetworkList(ctx, short, elsewhere.rt("eth0"))
	if err != nil {
		t.Fatalf("ADD of a pod of another namespace: %v", err)
	}
	if result, err := current.GetResult(res); err != nil || len(result.Interfaces) != 0 {
		t.Errorf("ADD of a pod of another namespace: %+v %v, want nothing attached", result, err)
	}
}

// An ADD on the node side and a DEL in the plugin each wait for the
// container's lock, which the other holds while it changes the container:
// the DEL the runtime sends after killing a plugin then finds what that
// plugin's ADD left once its undo is done, not half of it.
func TestCNIPluginTakesTheContainersLock(t *testing.T) {
	n := startCNINode(t)
	ctx := t.Context()
	list := n.conf(t, "1.1.0", "")
	s := n.newSandbox(t, "locked", "example-network", true)
	store := cni.Store{Dir: n.dataDir}
	// held starts command while the test holds the container's lock (start
	// returns what waits for its end): it waits, it ends once the lock is
	// free, and check sees how things stand in between.
	held := func(command string, start func() (wait func() error), check func()) {
		t.Helper()
		lock, err := store.Lock(s.containerID)
		if err != nil {
			t.Fatal(err)
		}
		wait := start()
		done := make(chan error, 1)
		go func() { done <- wait() }()
		// Given a quarter of a second, it would have run many times over.
		select {
		case err := <-done:
			t.Fatalf("%s ended while the container's lock was held: %v", command, err)
		case <-time.After(250 * time.Millisecond):
		}
		check()
		if err := lock.Unlock(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", command, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not end once the container's lock was free", command)
		}
	}

	held("ADD", func() func() error {
		return func() error {
			_, err := n.runtime.AddNetworkList(ctx, list, s.rt("eth0"))
			return err
		}
	}, func() {
		if _, err := s.handle.LinkByName("net1"); err == nil {
			t.Fatal("ADD attached while the container's lock was held")
		}
	})
	n.requireAttached(t, s)
	held("DEL", func() func() error { return n.startPlugin(t, "DEL", s, "eth0").Wait }, func() { n.requireAttached(t, s) })
	n.requireDetached(t, s)
	if records, _, err := store.List(); err != nil || len(records) != 0 {
		t.Errorf("records left after DEL: %+v %v", records, err)
	}
}

// startPlugin starts netop's plugin for command on sandbox s's interface
// ifname, as the runtime executes it, with the node's configuration edited.
func (n *cniNode) startPlugin(t *testing.T, command string, s *sandbox, ifname string, edit ...func(*cniapi.Config)) *exec.Cmd {
	t.Helper()
	c := cniapi.Config{CNIVersion: "1.1.0", Name: "netop-test", Type: cniapi.Type, Socket: n.socket, NodeNetns: n.netns, DataDir: n.dataDir, Timeout: "20s"}
	for _, e := range edit {
		e(&c)
	}
	stdin, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	dir := buildPlugin(t)
	var args []string
	for _, kv := range s.rt(ifname).Args {
		args = append(args, kv[0]+"="+kv[1])
	}
	cmd := exec.Command(filepath.Join(dir, cniapi.Type))
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+s.containerID, "CNI_NETNS="+s.netns,
		"CNI_IFNAME="+ifname, "CNI_PATH="+dir, "CNI_ARGS="+strings.Join(args, ";"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// pidfds counts this process's open pidfds.
func pidfds(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == "anon_inode:[pidfd]" {
			n++
		}
	}
	return n
}

// A dual-stack Network: ADD gives the pod's interface both addresses, with
// a connected route of each cidr, and reports both; pods reach each other
// and the bridge's gateway over IPv4 and over IPv6.
func TestCNIPluginDualStack(t *testing.T) {
	n := startCNINode(t)
	ctx := t.Context()
	if _, err := n.env.Netop.SamplecrdV2().Networks(n.ns).Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.84.0.0/24", "fd84::/64"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.networks["dual"] = n.env.WaitReady(t, n.ns, "dual", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	list := n.conf(t, "1.1.0", "")
	a := n.newSandbox(t, "dual-a", "dual", true)
	b := n.newSandbox(t, "dual-b", "dual", true)
	res, err := n.runtime.AddNetworkList(ctx, list, a.rt("eth0"))
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	result, err := current.GetResult(res)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ip := range result.IPs {
		got = append(got, result.Interfaces[*ip.Interface].Name+" "+ip.Address.String())
	}
	if want := []string{"net1 " + a.allocations[0].IPs[0], "net1 " + a.allocations[0].IPs[1]}; len(a.allocations[0].IPs) != 2 || !slices.Equal(got, want) {
		t.Fatalf("ADD result %v, want %v (allocated %v)", got, want, a.allocations[0].IPs)
	}
	n.requireAttached(t, a)
	if _, err := n.runtime.AddNetworkList(ctx, list, b.rt("eth0")); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	n.requireAttached(t, b)
	for _, to := range []string{"10.84.0.1", "fd84::1", addr(b.allocations[0]), strings.SplitN(b.allocations[0].IPs[1], "/", 2)[0]} {
		ping(t, a, to)
	}
	for _, s := range []*sandbox{a, b} {
		if err := n.runtime.DelNetworkList(ctx, list, s.rt("eth0")); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		n.requireDetached(t, s)
	}
}

// With the API server out of reach, ADD still attaches a pod whose
// addresses the node side's cache holds; with the node side down, ADD fails
// saying so, and DEL and CHECK, which need neither, still work.
func TestCNIPluginNodeSideAndAPIServerDown(t *testing.T) {
	env := testenv.Get(t)
	api := startLink(t, strings.TrimPrefix(env.Config.Host, "https://"))
	cfg := rest.CopyConfig(env.Config)
	cfg.Host = "https://" + api.addr()
	n := startCNINodeVia(t, cfg, nil)
	ctx := t.Context()
	list := n.conf(t, "1.1.0", "")
	// b's addresses are written before a's: once the node side attached
	// a, its cache (one ordered watch of pods) holds b's too.
	b := n.newSandbox(t, "down-b", "example-network", true)
	a := n.newSandbox(t, "down-a", "example-network", true)
	c := n.newSandbox(t, "down-c", "example-network", true)
	if _, err := n.runtime.AddNetworkList(ctx, list, a.rt("eth0")); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	n.requireAttached(t, a)

	api.cut(true)
	if _, err := n.runtime.AddNetworkList(ctx, list, b.rt("eth0")); err != nil {
		t.Fatalf("ADD with the API server out of reach: %v", err)
	}
	n.requireAttached(t, b)
	api.cut(false)

	n.stop()
	_, err := n.runtime.AddNetworkList(ctx, list, c.rt("eth0"))
	if err == nil || !strings.Contains(err.Error(), "netop's node agent did not answer at "+n.socket) {
		t.Errorf("ADD with the node side down: %v", err)
	}
	if _, err := c.handle.LinkByName("net1"); err == nil {
		t.Error("ADD with the node side down attached net1")
	}
	for _, s := range []*sandbox{a, b} {
		if err := n.runtime.CheckNetworkList(ctx, list, s.rt("eth0")); err != nil {
			t.Errorf("CHECK with the node side down: %v", err)
		}
		if err := n.runtime.DelNetworkList(ctx, list, s.rt("eth0")); err != nil {
			t.Fatalf("DEL with the node side down: %v", err)
		}
		n.requireDetached(t, s)
	}
}

// link forwards TCP connections to an address, and can be cut: its
// connections closed and new ones refused, as a partition would.
type link struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]bool
}

func startLink(t *testing.T, target string) *link {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &link{l: l, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { _ = l.Close(); k.cut(true) })
	go k.serve()
	return k
}

func (k *link) addr() string { return k.l.Addr().String() }

func (k *link) serve() {
	for {
		in, err := k.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", k.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !k.track(in, out) {
			continue
		}
		for _, pair := range [][2]net.Conn{{in, out}, {out, in}} {
			go func() {
				_, _ = io.Copy(pair[0], pair[1])
				_ = pair[0].Close()
				_ = pair[1].Close()
			}()
		}
	}
}

// track keeps the pair for cutting, or closes it if the link is down.
func (k *link) track(conns ...net.Conn) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range conns {
		if k.down {
			_ = c.Close()
			continue
		}
		k.conns[c] = true
	}
	return !k.down
}

// cut takes the link down (closing what it carries) or back up.
func (k *link) cut(down bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.down = down
	if down {
		for c := range k.conns {
			_ = c.Close()
		}
		clear(k.conns)
	}
}
