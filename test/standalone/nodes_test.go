package standalone

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/internal/testing/gobuild"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// buildImage builds netop's image as `make image` does, into dir, under
// ref; it returns the image archive and the CNI plugin in it.
func buildImage(t *testing.T, dir, ref string) (archive, plugin string) {
	t.Helper()
	static, plugin := filepath.Join(dir, "netop-static"), filepath.Join(dir, "netop-cni-static")
	archive = filepath.Join(dir, "netop-image.tar")
	for out, pkg := range map[string]string{static: "github.com/netop-dev/netop/cmd/netop", plugin: gobuild.Plugin} {
		if err := gobuild.Static(out, pkg); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("go", "run", "github.com/netop-dev/netop/hack/image", "--binary", static, "--plugin", plugin, "--tag", ref, "--out", archive).CombinedOutput(); err != nil {
		t.Fatalf("building the image: %v\n%s", err, out)
	}
	return archive, plugin
}

// Issue 16, as a user installs netop on a cluster: a three-node
// standalone without its own operator, netop's image built here and
// served to the nodes, `netop manifests --image` applied. The controller's
// two replicas and an agent per node run; a Network is Ready on no node
// until pods use it (issue 37), then on the two nodes of its pods, which
// reach each other over the overlay, within the MultiNetworkPolicies the
// agents enforce. The leading controller killed, the other leads within
// the lease; an agent killed, its node lags and converges; a node removed,
// its bridges go and nobody else's.
func TestNodesWithManifests(t *testing.T) {
	nettest.RequireRoot(t)
	if err := node.Check(); err != nil {
		t.Fatalf("this host cannot run a node: %v", err)
	}
	ctx := t.Context()
	const ref = "netop.local/netop:test"
	archive, thinPlugin := buildImage(t, t.TempDir(), ref)
	prefix := nettest.NetnsName("nn")
	var netnss []string
	for i := 1; i <= 3; i++ {
		netnss = append(netnss, fmt.Sprintf("%s-%d", prefix, i))
	}
	// The standalone keeps its network namespaces for its next start, as
	// it keeps its data directory: the test removes them, the operator's
	// (the prefix) among them.
	t.Cleanup(func() {
		for _, ns := range append(netnss, prefix) {
			_ = nettest.DeleteNetns(ns)
		}
	})
	dataDir := t.TempDir()
	sa := startStandaloneWith(t, "--data-dir", dataDir, "--netns", prefix, "--node-name", prefix, "--nodes", "3", "--node=true",
		"--operator=false", "--image-archive", archive, "--metrics-addr", "0")
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV1().Networks("default")
	nodeNames := netnss // --node-name is the prefix too

	t.Cleanup(func() {
		if t.Failed() {
			logAgents(t, kube)
		}
	})
	// The nodes share this host's file system: the agents install the
	// CNI plugin into directories of the test's.
	cniBin := t.TempDir()
	if err := testenv.ApplyManifests(ctx, cfg, config.All(config.Options{Image: ref, CNIBinDir: cniBin})); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 3*time.Minute, func(ctx context.Context) (bool, string) {
		d, err := kube.AppsV1().Deployments("netop-system").Get(ctx, "netop-controller", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ds, err := kube.AppsV1().DaemonSets("netop-system").Get(ctx, "netop-agent", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return d.Status.ReadyReplicas == 2 && ds.Status.NumberReady == 3,
			fmt.Sprintf("controller %d/2 ready, agents %d/3 ready", d.Status.ReadyReplicas, ds.Status.NumberReady)
	})

	checkCNIInstalled(t, thinPlugin, cniBin)
	checkServiceAcrossNodes(t, cfg, kube, nodeNames)

	network, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "spans"}, Spec: samplecrdv1.NetworkSpec{CIDR: "10.150.0.0/24"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitNodes := func(summary string, ready metav1.ConditionStatus, lagging string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
			n, err := nets.Get(ctx, network.Name, metav1.GetOptions{})
			if err != nil || n.Status.Nodes == nil || len(n.Status.Conditions) == 0 {
				return false, fmt.Sprintf("%+v %v", n.Status, err)
			}
			c := n.Status.Conditions[0]
			return n.Status.Nodes.Summary == summary && c.Status == ready && strings.Contains(c.Message, lagging),
				fmt.Sprintf("nodes %s, Ready=%s %s: %s; want %s, Ready=%s naming %q", n.Status.Nodes.Summary, c.Status, c.Reason, c.Message, summary, ready, lagging)
		})
	}
	// On demand (the agents' default): Ready, on no node until pods use it.
	waitNodes("0/0 (of 3)", metav1.ConditionTrue, "")
	bridge := ifname.Bridge(network.UID)
	hasBridge := func(netns string) bool {
		return exec.Command("ip", "-n", netns, "link", "show", bridge).Run() == nil
	}
	for _, ns := range netnss {
		if hasBridge(ns) {
			t.Errorf("node namespace %s has bridge %s, which no pod there uses", ns, bridge)
		}
	}

	// Pods on nodes 1 and 3 reach each other over the overlay.
	addrs := map[string]string{}
	for _, i := range []int{0, 2} {
		p := busyboxPod(fmt.Sprintf("on-%d", i+1), corev1.RestartPolicyAlways, "sleep 3600")
		p.Spec.NodeName = nodeNames[i]
		p.Labels = map[string]string{"pod": p.Name}
		p.Annotations = map[string]string{netselect.NetworksAnnotation: network.Name}
		runPod(t, kube, p)
		waitRunning(t, kube, p.Name, "c")
		// The plugin, with its node-bound token, wrote network-status
		// whole: the pod's eth0 first.
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			got, err := kube.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			var status []netselect.Status
			_ = json.Unmarshal([]byte(got.Annotations[netselect.StatusAnnotation]), &status)
			return len(status) == 2 && status[0].Default && status[0].Interface == "eth0" && status[1].Interface == "net1",
				fmt.Sprintf("pod %s: network-status %s", p.Name, got.Annotations[netselect.StatusAnnotation])
		})
		fields := strings.Fields(execIn(t, cfg, kube, p.Name, "sh", "-c", "ip -4 -o addr show dev net1"))
		if len(fields) < 4 {
			t.Fatalf("pod %s: net1 %q", p.Name, fields)
		}
		addrs[p.Name] = strings.TrimSuffix(fields[3], "/24")
	}
	execIn(t, cfg, kube, "on-1", "ping", "-c", "1", "-W", "3", addrs["on-3"])
	waitNodes("2/2 (of 3)", metav1.ConditionTrue, "")
	checkRealised(t, netnss, network.UID, true, false, true)

	// Networks stay boundaries across nodes, and an agent's own token
	// writes only its node's report (issue 33).
	checkOverlayIsolation(t, cfg, kube, nodeNames[2], network.Spec.CIDR, addrs)
	checkAgentTokens(t, cfg, kube, nodeNames[0], nodeNames[1])
	checkOverlayPolicies(t, cfg, kube, network.Name, addrs)

	// The leading controller killed: the other replica leads within the
	// lease (15 s). Nothing is lost or doubled: the converged Network is
	// neither written nor rebuilt by the new leader, and a Network made
	// while nobody leads is Ready, and on no node: no pod uses it.
	lease, err := kube.CoordinationV1().Leases("netop-system").Get(ctx, "netop", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("lease: %+v %v", lease, err)
	}
	leader, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_")
	// Settled: the two pods' addresses counted in status (the controller
	// writes the count at most once a second, after they were allocated).
	var settled *samplecrdv1.Network
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		settled, err = nets.Get(ctx, network.Name, metav1.GetOptions{})
		return err == nil && settled.Status.Addresses != nil && settled.Status.Addresses.Allocated == 2, fmt.Sprintf("%+v %v", settled.Status.Addresses, err)
	})
	bridgesBefore := map[string]string{}
	for _, ns := range []string{netnss[0], netnss[2]} {
		bridgesBefore[ns] = bridgeIndex(t, ns, bridge)
	}
	if err := kube.CoreV1().Pods("netop-system").Delete(ctx, leader, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// Until the Services' endpoints drop the killed pod, the API server may
	// pick it for the validating webhook (failurePolicy Fail) or for the
	// conversion of this v1 create, and refuse the create, as it would
	// for any client: retried, as a client would. The conversion that
	// fails may be the answer's, after the Network was stored: then the
	// retry finds it there.
	var during *samplecrdv1.Network
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		during, err = nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "during"}, Spec: samplecrdv1.NetworkSpec{CIDR: "10.151.0.0/24"}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			during, err = nets.Get(ctx, "during", metav1.GetOptions{})
		}
		if err != nil && !strings.Contains(err.Error(), "failed calling webhook") && !strings.Contains(err.Error(), "conversion webhook") {
			t.Fatal(err)
		}
		return err == nil, fmt.Sprint(err)
	})
	testenv.Eventually(t, 20*time.Second, func(ctx context.Context) (bool, string) {
		lease, err := kube.CoordinationV1().Leases("netop-system").Get(ctx, "netop", metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false, fmt.Sprint(err)
		}
		holder, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_")
		return holder != "" && holder != leader, fmt.Sprintf("lease held by %q after %s was killed", holder, leader)
	})
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		n, err := nets.Get(ctx, during.Name, metav1.GetOptions{})
		return err == nil && n.Status.Nodes != nil && n.Status.Nodes.Summary == "0/0 (of 3)" && meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady),
			fmt.Sprintf("made during the failover: %+v %v", n.Status, err)
	})
	for _, ns := range netnss {
		out, _ := exec.Command("ip", "-n", ns, "-br", "link", "show", "type", "bridge").Output()
		if got := strings.Count(string(out), ifname.Bridge(during.UID)); got != 0 {
			t.Errorf("node namespace %s has %d bridges of the Network made during the failover, which no pod uses", ns, got)
		}
	}
	for ns, before := range bridgesBefore {
		if got := bridgeIndex(t, ns, bridge); got != before {
			t.Errorf("node namespace %s: the converged Network's bridge was rebuilt across the failover (%s, then %s)", ns, before, got)
		}
	}
	if now, err := nets.Get(ctx, network.Name, metav1.GetOptions{}); err != nil || now.ResourceVersion != settled.ResourceVersion {
		t.Errorf("the new leader wrote the converged Network: %+v, was %+v (%v); writers now %s, before %s", now.Status, settled.Status, err, writers(now), writers(settled))
	}

	// An agent killed: its node, which realises the Network, lags, by
	// name, until the DaemonSet's new pod has built and reported.
	agents, err := kube.CoreV1().Pods("netop-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent",
		FieldSelector: "spec.nodeName=" + nodeNames[0]})
	if err != nil || len(agents.Items) != 1 {
		t.Fatalf("agent of %s: %v %v", nodeNames[0], agents, err)
	}
	if err := kube.CoreV1().Pods("netop-system").Delete(ctx, agents.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitNodes("1/2 (of 3)", metav1.ConditionFalse, nodeNames[0]+": its agent's pod")
	waitNodes("2/2 (of 3)", metav1.ConditionTrue, "")

	// A node removed: its report goes, its agent removes its bridges, the
	// others keep theirs and reach each other.
	if err := kube.CoreV1().Nodes().Delete(ctx, nodeNames[2], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNodes("1/1 (of 2)", metav1.ConditionTrue, "")
	testenv.Eventually(t, 60*time.Second, func(context.Context) (bool, string) {
		return !hasBridge(netnss[2]), "the removed node still has the bridge"
	})
	if !hasBridge(netnss[0]) {
		t.Errorf("node namespace %s lost its bridge when another node was removed", netnss[0])
	}
	// The removed node's agent, its work done, stays up without
	// restarting until the pod garbage collector deletes its pod. (Its
	// log is read from the node's disk: the API server finds kubelets
	// through their Nodes.)
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		pods, err := kube.CoreV1().Pods("netop-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent",
			FieldSelector: "spec.nodeName=" + nodeNames[2]})
		if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
			return false, fmt.Sprintf("agent of the removed node: %v %v", pods, err)
		}
		status := pods.Items[0].Status.ContainerStatuses[0]
		if status.RestartCount > 0 {
			t.Fatalf("the removed node's agent restarted: %+v", status)
		}
		logs, _ := filepath.Glob(filepath.Join(dataDir, "nodes", nodeNames[2], "node", "pod-logs", "netop-system_"+pods.Items[0].Name+"_*", "*", "*.log"))
		var idle bool
		for _, path := range logs {
			data, _ := os.ReadFile(path)
			idle = idle || bytes.Contains(data, []byte("Idle until this agent is stopped"))
		}
		return idle && status.State.Running != nil, fmt.Sprintf("the removed node's agent: %+v, logs %v", status.State, logs)
	})
	sa.stop(t)
}

// checkCNIInstalled checks what the agents installed for the CNI plugin:
// the image's thin plugin, which answers as the plugin, and nothing else
// (no credentials: it asks the agent).
func checkCNIInstalled(t *testing.T, thin, binDir string) {
	t.Helper()
	plugin := filepath.Join(binDir, "netop-cni")
	want, err := os.ReadFile(thin)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func(context.Context) (bool, string) {
		got, err := os.ReadFile(plugin)
		return err == nil && bytes.Equal(got, want), fmt.Sprintf("%s: %d bytes, want the image's netop-cni, %d: %v", plugin, len(got), len(want), err)
	})
	version := exec.Command(plugin)
	version.Env = []string{"CNI_COMMAND=VERSION"}
	version.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	if out, err := version.Output(); err != nil || !strings.Contains(string(out), "1.1.0") {
		t.Errorf("the installed plugin's VERSION: %s %v", out, err)
	}
	if entries, err := os.ReadDir(binDir); err != nil || len(entries) != 1 {
		t.Errorf("the CNI bin directory holds %v (%v), want netop-cni alone", entries, err)
	}
}

// bridgeIndex is the interface index of bridge in netns: a bridge made
// again has another.
func bridgeIndex(t *testing.T, netns, bridge string) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", netns, "-o", "link", "show", bridge).Output()
	if err != nil {
		t.Fatalf("bridge %s in %s: %v", bridge, netns, err)
	}
	index, _, _ := strings.Cut(string(out), ":")
	return index
}

// logAgents logs the last lines of every agent pod's log, current and
// previous, to explain a failure.
func logAgents(t *testing.T, kube kubernetes.Interface) {
	ctx := context.Background()
	pods, err := kube.CoreV1().Pods("netop-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("agent pods: %v", err)
		return
	}
	tail := int64(30)
	for _, p := range pods.Items {
		for _, previous := range []bool{false, true} {
			data, err := kube.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail, Previous: previous}).DoRaw(ctx)
			if err == nil {
				t.Logf("pod %s (previous: %v, restarts %v):\n%s", p.Name, previous, p.Status.ContainerStatuses, data)
			}
		}
	}
}

// writers says who wrote an object and when, from its managed fields.
func writers(n *samplecrdv1.Network) string {
	if n == nil {
		return "none"
	}
	var out []string
	for _, m := range n.ManagedFields {
		out = append(out, fmt.Sprintf("%s %s %s at %s", m.Manager, m.Operation, m.Subresource, m.Time))
	}
	return strings.Join(out, "; ")
}
