// Command node measures the standalone's node (as root, on a host with
// containerd, runc, the CNI plugins, busybox-static and nftables): the
// time from start to the control plane ready, to the Node Ready and to
// cluster DNS answering a pod's question through kube-dns's Service, on a
// fresh data directory (cold) and on the same one again (warm), pod create to Running over N pods created at once, and
// the memory of the node's processes (kubelet, containerd, shims) with
// those pods running; then the same pods declaring the tutorial's
// example-network: create to Running with net1 attached, create to
// addresses allocated, pods attached per second, and netop's API writes
// per pod; then the same pods again under --policies MultiNetworkPolicies
// that select them all, and the time from a change (a pod relabelled, a
// policy created or deleted) to its enforcement on a UDP stream between
// two pods. It prints three tables and a JSON line.
//
//	go run ./test/bench/node [--pods 50] [--policies 20] [--changes 50]
//
// --only runs one other part instead: hotplug, ondemand, or peers (pods
// at once through the kubelet: eth0 only, with net1 by netop, and eth0
// by whereabouts, the peer test/bench/peers measures through libcni).
// --plot-dir DIR draws the first part's pod create to Running in each
// round as an SVG file in DIR (BENCHMARKS.md's is in docs/benchmarks).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/gobuild"
	"github.com/netop-dev/netop/internal/testing/podprobe"
	"github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	"github.com/netop-dev/netop/test/bench/benchplot"
	"github.com/netop-dev/netop/test/bench/benchproc"
	"github.com/netop-dev/netop/test/bench/whereabouts"
)

type result struct {
	Date       string  `json:"date"`
	CPUs       int     `json:"cpus"`
	Pods       int     `json:"pods"`
	ColdReadyS float64 `json:"coldReadyS"`
	WarmReadyS float64 `json:"warmReadyS"`
	// Start to the control plane ready and to DNS answering.
	ColdControlPlaneS float64 `json:"coldControlPlaneS"`
	WarmControlPlaneS float64 `json:"warmControlPlaneS"`
	ColdDNSS          float64 `json:"coldDNSS"`
	WarmDNSS          float64 `json:"warmDNSS"`
	// One pod at a time, each created once the one before runs.
	OneP50S float64 `json:"oneAtATimeP50S"`
	OneP99S float64 `json:"oneAtATimeP99S"`
	// All pods created at once.
	RunningP50S   float64 `json:"runningP50S"`
	RunningP99S   float64 `json:"runningP99S"`
	AllRunningS   float64 `json:"allRunningS"`
	KubeletMiB    float64 `json:"kubeletMiB"`
	ContainerdMiB float64 `json:"containerdMiB"`
	ShimsMiB      float64 `json:"shimsMiB"`
	Shims         int     `json:"shims"`
	StopS         float64 `json:"stopS"`
	// The same, the pods declaring example-network.
	NetOneP50S     float64 `json:"networkOneAtATimeP50S"`
	NetOneP99S     float64 `json:"networkOneAtATimeP99S"`
	NetRunningP50S float64 `json:"networkRunningP50S"`
	NetRunningP99S float64 `json:"networkRunningP99S"`
	NetAllRunningS float64 `json:"networkAllRunningS"`
	// Create to allocated, one at a time and all at once.
	AllocatedOneP50S float64 `json:"allocatedOneAtATimeP50S"`
	AllocatedOneP99S float64 `json:"allocatedOneAtATimeP99S"`
	AllocatedP50S    float64 `json:"allocatedP50S"`
	AllocatedP99S    float64 `json:"allocatedP99S"`
	AttachedPerS     float64 `json:"attachedPerS"`
	PodWritesPerPod  float64 `json:"podWritesPerPod"`
	// Events netop wrote while the pods joined, per pod.
	EventsPerPod float64 `json:"eventsPerPod"`
	// The same again, with Policies MultiNetworkPolicies selecting every
	// pod on example-network.
	Policies       int     `json:"policies"`
	PolOneP50S     float64 `json:"policiesOneAtATimeP50S"`
	PolOneP99S     float64 `json:"policiesOneAtATimeP99S"`
	PolRunningP50S float64 `json:"policiesRunningP50S"`
	PolRunningP99S float64 `json:"policiesRunningP99S"`
	PolAllRunningS float64 `json:"policiesAllRunningS"`
	// From a change (a pod relabelled, a policy created or deleted) to
	// the first datagram that the change lets through or drops.
	EnforcedPodP50S    float64 `json:"enforcedPodChangeP50S"`
	EnforcedPodP99S    float64 `json:"enforcedPodChangeP99S"`
	EnforcedPolicyP50S float64 `json:"enforcedPolicyChangeP50S"`
	EnforcedPolicyP99S float64 `json:"enforcedPolicyChangeP99S"`
	EnforcedChanges    int     `json:"enforcedChanges"`
}

func main() {
	pods := flag.Int("pods", 50, "pods created at once")
	policies := flag.Int("policies", 20, "MultiNetworkPolicies in the round of pods with policies")
	changes := flag.Int("changes", 50, "changes of each kind (pod, policy) timed to enforcement, and hot-plug changes")
	only := flag.String("only", "", "run only one part: hotplug, ondemand (on two nodes: a pod starting on a Network its node realises on demand, against one on a Network already there, --pods of each), or peers (--pods at once: eth0 only, with net1 by netop, with eth0 by whereabouts)")
	passes := flag.Int("passes", 2, "with --only peers, the passes over the four configurations, every other one in reverse order")
	whereaboutsVersion := flag.String("whereabouts-version", whereabouts.DefaultVersion, "with --only peers, the version of "+whereabouts.Module+" to build")
	plots := benchplot.Flags(flag.CommandLine)
	flag.Parse()
	run := func(pods, policies, changes int) error { return run(pods, policies, changes, plots) }
	switch *only {
	case "hotplug":
		run = func(_, _, changes int) error { return runHotPlug(changes) }
	case "ondemand":
		run = func(pods, _, _ int) error { return runOnDemand(pods) }
	case "peers":
		run = func(pods, _, _ int) error { return runPeers(pods, *passes, *whereaboutsVersion) }
	}
	if err := run(*pods, *policies, *changes); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// fatPlugin, when set, leaves the thin plugin out of the workspace: the
// standalone's node then executes the standalone's own binary as netop's
// plugin.
var fatPlugin = flag.Bool("fat-plugin", false, "do not build the thin plugin beside netop-standalone: the node runs the standalone's own binary as netop's CNI plugin")

// workspace builds netop-standalone, and the thin CNI plugin beside it as
// `make build` does, into a directory of its own, which also holds the data
// directory; done removes it, and the bench's backend namespace.
func workspace() (binary, dataDir, netns string, done func(), err error) {
	tmp, err := os.MkdirTemp("", "netop-node-bench-")
	if err != nil {
		return "", "", "", nil, err
	}
	netns = fmt.Sprintf("netop-bench-%d", os.Getpid())
	done = func() {
		_ = exec.Command("ip", "netns", "delete", netns).Run()
		_ = os.RemoveAll(tmp)
	}
	binary = filepath.Join(tmp, "netop-standalone")
	err = gobuild.Command(binary, "github.com/netop-dev/netop/cmd/netop-standalone")
	if err == nil && !*fatPlugin {
		err = gobuild.Static(filepath.Join(tmp, cniapi.Type), gobuild.Plugin)
	}
	if err != nil {
		done()
		return "", "", "", nil, err
	}
	return binary, filepath.Join(tmp, "d"), netns, done, nil
}

func run(pods, policies, changes int, plots *benchplot.Output) error {
	binary, dataDir, netns, done, err := workspace()
	if err != nil {
		return err
	}
	defer done()
	metricsAddr := "127.0.0.1:18089"
	args := []string{"--data-dir", dataDir, "--netns", netns, "--metrics-addr", metricsAddr, "--webhook-addr", "127.0.0.1:0", "--node-name", "bench-node"}
	r := result{Date: time.Now().UTC().Format(time.DateOnly), CPUs: runtime.NumCPU(), Pods: pods}

	sa, cold, err := start(binary, args, netns)
	if err != nil {
		return err
	}
	r.ColdReadyS, r.ColdControlPlaneS, r.ColdDNSS = cold.node.Seconds(), cold.controlPlane.Seconds(), cold.dns.Seconds()
	rounds, err := r.measureRounds(dataDir, metricsAddr, policies, changes)
	if err != nil {
		sa.stop()
		return err
	}
	r.StopS = sa.stop().Seconds()

	sa, warm, err := start(binary, args, netns)
	if err != nil {
		return err
	}
	r.WarmReadyS, r.WarmControlPlaneS, r.WarmDNSS = warm.node.Seconds(), warm.controlPlane.Seconds(), warm.dns.Seconds()
	sa.stop()
	r.print()
	return drawPodStarts(plots, r, rounds)
}

// rounds are the rounds of pods measured: plain, joining example-network,
// and joining it under policies.
type rounds struct{ plain, joined, withPolicies measured }

// measureRounds measures, on the running standalone, the rounds of pods
// and the enforcement of changes to policies.
func (r *result) measureRounds(dataDir, metricsAddr string, policies, changes int) (rounds, error) {
	var all rounds
	pods := r.Pods
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	kube, err := client(kubeconfig)
	if err != nil {
		return all, err
	}
	// KUBECONFIG is printed once the node is Ready, if there is one.
	if _, err := kube.CoreV1().Nodes().Get(context.Background(), "bench-node", metav1.GetOptions{}); err != nil {
		return all, fmt.Errorf("the standalone runs without a node (see %s/logs): %w", dataDir, err)
	}
	if all.plain, err = measurePods(kube, pods, "", dataDir); err != nil {
		return all, err
	}
	plain := all.plain
	r.OneP50S, r.OneP99S, r.RunningP50S, r.RunningP99S, r.AllRunningS = plain.oneP50, plain.oneP99, plain.allP50, plain.allP99, plain.all
	r.KubeletMiB, r.ContainerdMiB, r.ShimsMiB, r.Shims = plain.kubelet, plain.containerd, plain.shims, plain.nShims

	if err := createNetwork(kubeconfig); err != nil {
		return all, err
	}
	writesBefore, eventsBefore, err := podWrites(metricsAddr)
	if err != nil {
		return all, err
	}
	if all.joined, err = measurePods(kube, pods, "example-network", dataDir); err != nil {
		return all, err
	}
	writesAfter, eventsAfter, err := podWrites(metricsAddr)
	if err != nil {
		return all, err
	}
	joined := all.joined
	r.NetOneP50S, r.NetOneP99S, r.NetRunningP50S, r.NetRunningP99S, r.NetAllRunningS = joined.oneP50, joined.oneP99, joined.allP50, joined.allP99, joined.all
	r.AllocatedOneP50S, r.AllocatedOneP99S = percentiles(joined.allocatedOne)
	r.AllocatedP50S, r.AllocatedP99S = percentiles(joined.allocated)
	r.AttachedPerS = float64(pods) / joined.all
	r.PodWritesPerPod = (writesAfter - writesBefore) / float64(2*pods)
	r.EventsPerPod = (eventsAfter - eventsBefore) / float64(2*pods)

	netop, err := netopClient(kubeconfig)
	if err != nil {
		return all, err
	}
	if err := createPolicies(netop, policies); err != nil {
		return all, err
	}
	if all.withPolicies, err = measurePods(kube, pods, "example-network", dataDir); err != nil {
		return all, err
	}
	withPolicies := all.withPolicies
	r.Policies = policies
	r.PolOneP50S, r.PolOneP99S, r.PolRunningP50S, r.PolRunningP99S, r.PolAllRunningS = withPolicies.oneP50, withPolicies.oneP99, withPolicies.allP50, withPolicies.allP99, withPolicies.all
	podChanges, policyChanges, err := measureEnforcement(kube, netop, dataDir, changes)
	if err != nil {
		return all, err
	}
	r.EnforcedChanges = 2 * changes
	r.EnforcedPodP50S, r.EnforcedPodP99S = percentiles(podChanges)
	r.EnforcedPolicyP50S, r.EnforcedPolicyP99S = percentiles(policyChanges)
	return all, nil
}

// print prints the result as four tables and a JSON line.
func (r result) print() {
	fmt.Println("| date | CPUs | start to control plane ready, cold | warm | to node Ready, cold | warm | to DNS answering through kube-dns, cold | warm |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- |")
	fmt.Printf("| %s | %d | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s |\n",
		r.Date, r.CPUs, r.ColdControlPlaneS, r.WarmControlPlaneS, r.ColdReadyS, r.WarmReadyS, r.ColdDNSS, r.WarmDNSS)
	fmt.Println()

	fmt.Printf("| date | CPUs | cold start to node Ready | warm | create to Running, one at a time, p50 | p99 | %d at once, p50 | p99 | all Running | kubelet RSS | containerd RSS | shims RSS (n) | stop |\n", r.Pods)
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	fmt.Printf("| %s | %d | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.0f MiB | %.0f MiB | %.0f MiB (%d) | %.2f s |\n",
		r.Date, r.CPUs, r.ColdReadyS, r.WarmReadyS, r.OneP50S, r.OneP99S, r.RunningP50S, r.RunningP99S, r.AllRunningS, r.KubeletMiB, r.ContainerdMiB, r.ShimsMiB, r.Shims, r.StopS)
	fmt.Println()
	fmt.Printf("| pods declaring example-network | create to Running, one at a time, p50 | p99 | %d at once, p50 | p99 | all Running | attached per second | stored to allocated, one at a time, p50 | p99 | %d at once, p50 | p99 | netop pod writes per pod | netop Events per pod |\n", r.Pods, r.Pods)
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	fmt.Printf("| %s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.1f | %.3f s | %.3f s | %.3f s | %.3f s | %.2f | %.2f |\n",
		r.Date, r.NetOneP50S, r.NetOneP99S, r.NetRunningP50S, r.NetRunningP99S, r.NetAllRunningS, r.AttachedPerS,
		r.AllocatedOneP50S, r.AllocatedOneP99S, r.AllocatedP50S, r.AllocatedP99S, r.PodWritesPerPod, r.EventsPerPod)
	fmt.Println()
	fmt.Printf("| %d policies on example-network | create to Running, one at a time, p50 | p99 | %d at once, p50 | p99 | all Running | change to enforcement, pod relabelled, p50 | p99 | policy created or deleted, p50 | p99 |\n", r.Policies, r.Pods)
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	fmt.Printf("| %s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.0f ms | %.0f ms | %.0f ms | %.0f ms |\n",
		r.Date, r.PolOneP50S, r.PolOneP99S, r.PolRunningP50S, r.PolRunningP99S, r.PolAllRunningS,
		1000*r.EnforcedPodP50S, 1000*r.EnforcedPodP99S, 1000*r.EnforcedPolicyP50S, 1000*r.EnforcedPolicyP99S)
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

// drawPodStarts draws the distribution of pod create to Running in each
// round, one at a time and all at once.
func drawPodStarts(plots *benchplot.Output, r result, all rounds) error {
	var series []benchplot.Series
	for _, round := range []struct {
		name string
		m    measured
	}{
		{"plain", all.plain},
		{"net1 on a Network", all.joined},
		{fmt.Sprintf("net1, %d policies", r.Policies), all.withPolicies},
	} {
		series = append(series,
			benchplot.Cumulative(round.name+", one at a time", round.m.oneTook, 1),
			benchplot.Cumulative(fmt.Sprintf("%s, %d at once", round.name, r.Pods), round.m.allTook, 1))
	}
	return plots.Draw("node-pod-start", benchplot.Chart{
		Title:      "Pod create to Running on the standalone's node (busybox, containerd, runc)",
		Conditions: fmt.Sprintf("N = %d pods one at a time, then %d at once", r.Pods, r.Pods),
		XLabel:     "seconds from create to Running (log scale)", YLabel: "share of pods",
		LogX: true, Series: series,
	})
}

// measured is one round of pods: one at a time, then all at once.
type measured struct {
	oneP50, oneP99, allP50, allP99, all float64
	// oneTook, allTook: create to Running, one at a time and all at once.
	oneTook, allTook []float64
	// allocatedOne, allocated: create to allocation, one at a time and
	// all at once.
	allocatedOne, allocated    []float64
	kubelet, containerd, shims float64
	nShims                     int
}

// measurePods runs pods one at a time, then all at once, each declaring
// network (if any), and deletes them.
func measurePods(kube kubernetes.Interface, pods int, network, dataDir string) (measured, error) {
	var m measured
	var took []float64
	for i := range pods {
		t, allocated, err := runPods(kube, fmt.Sprintf("one%s-%03d", short(network), i), 1, network)
		if err != nil {
			return m, err
		}
		took = append(took, t...)
		m.allocatedOne = append(m.allocatedOne, allocated...)
	}
	m.oneP50, m.oneP99 = percentiles(took)
	m.oneTook = took
	if err := deletePods(kube); err != nil {
		return m, err
	}
	if err := settle(dataDir); err != nil {
		return m, err
	}
	began := time.Now()
	took, allocated, err := runPods(kube, "all"+short(network), pods, network)
	if err != nil {
		return m, err
	}
	m.all = time.Since(began).Seconds()
	m.allP50, m.allP99 = percentiles(took)
	m.allTook = took
	m.allocated = append(m.allocated, allocated...)
	m.kubelet, m.containerd, m.shims, m.nShims = memory(dataDir)
	if err := deletePods(kube); err != nil {
		return m, err
	}
	return m, settle(dataDir)
}

// settle waits until the node has torn down the deleted pods' sandboxes
// (no shim left), so that one round's teardown does not slow the next.
func settle(dataDir string) error {
	return wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		_, _, _, shims := memory(dataDir)
		return shims == 0, nil
	})
}

func short(network string) string {
	if network == "" {
		return ""
	}
	return "-net"
}

// createNetwork applies the tutorial's Network and waits for it to be
// Ready.
func createNetwork(kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV1().Networks("default")
	n := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "example-network"}, Spec: samplecrdv1.NetworkSpec{CIDR: "192.168.0.0/16", Gateway: "192.168.0.1"}}
	if _, err := nets.Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := nets.Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil && got.Status.Addresses != nil, nil
	})
}

// podWrites reads netop's count of writes to pods, and of Events
// written, from its metrics.
func podWrites(addr string) (pods, events float64, err error) {
	families, err := benchproc.Scrape(addr)
	if err != nil {
		return 0, 0, err
	}
	return benchproc.Sum(families["netop_api_writes_total"], "resource", "pods"), benchproc.Sum(families["netop_events_written_total"], "", ""), nil
}

type standalone struct{ cmd *exec.Cmd }

// startStandalone starts the standalone on dataDir, its node in netnsName,
// with the flags every part but the first uses (no metrics, the webhook on
// any port) and extra; it returns once the node is Ready and DNS answers
// in dnsNetns, with its kubeconfig and a client.
func startStandalone(binary, dataDir, netnsName, dnsNetns string, extra ...string) (*standalone, string, kubernetes.Interface, error) {
	args := append([]string{"--data-dir", dataDir, "--netns", netnsName, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0", "--node-name", "bench-node"}, extra...)
	sa, _, err := start(binary, args, dnsNetns)
	if err != nil {
		return nil, "", nil, err
	}
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	kube, err := client(kubeconfig)
	if err != nil {
		sa.stop()
		return nil, "", nil, err
	}
	return sa, kubeconfig, kube, nil
}

// start runs the standalone and returns when it printed KUBECONFIG, which
// it does once the node is Ready, with the time that took.
// started is how long a start took to each milestone.
type started struct {
	controlPlane, node, dns time.Duration
}

// start runs the standalone and returns once it printed KUBECONFIG (the
// node Ready) and DNS answers in the node's namespace, netns.
func start(binary string, args []string, netns string) (*standalone, started, error) {
	var took started
	cmd := exec.Command(binary, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, took, err
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, took, err
	}
	dns := make(chan time.Duration, 1)
	go func() { dns <- dnsAnswering(netns, began, 60*time.Second) }()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "KUBECONFIG=") {
			took.node = time.Since(began)
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			took.dns = <-dns
			// The standalone logs when its control plane is ready.
			if _, after, ok := strings.Cut(stderr.String(), `"Control plane ready"`); ok {
				if _, v, ok := strings.Cut(after, `after="`); ok {
					took.controlPlane, _ = time.ParseDuration(v[:strings.IndexByte(v, '"')])
				}
			}
			return &standalone{cmd: cmd}, took, nil
		}
	}
	_ = cmd.Wait()
	return nil, took, fmt.Errorf("the standalone exited before printing KUBECONFIG:\n%s", stderr.String())
}

// dnsAnswering asks kube-dns's Service, from the node's namespace as a
// pod's resolver would (kube-proxy's rules, then CoreDNS), for the
// kubernetes Service until it answers, and returns how long after began
// that was (the deadline if never).
func dnsAnswering(netnsName string, began time.Time, deadline time.Duration) time.Duration {
	for time.Since(began) < deadline {
		if dnsAnswers(netnsName) {
			return time.Since(began)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return deadline
}

func dnsAnswers(netnsName string) bool {
	ns, err := netns.GetFromName(netnsName)
	if err != nil {
		return false
	}
	defer func() { _ = ns.Close() }()
	var conn net.Conn
	if err := linux.InNetns(ns, func() (err error) {
		conn, err = net.Dial("udp", "10.0.0.10:53")
		return err
	}); err != nil {
		return false
	}
	c := &dns.Conn{Conn: conn}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	q := new(dns.Msg)
	q.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeA)
	if err := c.WriteMsg(q); err != nil {
		return false
	}
	answer, err := c.ReadMsg()
	if err != nil {
		return false
	}
	for _, rr := range answer.Answer {
		if a, ok := rr.(*dns.A); ok && a.A.String() == "10.0.0.1" {
			return true
		}
	}
	return false
}

// lockedBuffer is a strings.Builder written by one goroutine (the child's
// stderr) and read by another.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// stop sends Ctrl-C and returns how long the standalone took to exit.
func (s *standalone) stop() time.Duration {
	began := time.Now()
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	_ = s.cmd.Wait()
	return time.Since(began)
}

func client(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return kubernetes.NewForConfig(cfg)
}

func percentiles(took []float64) (p50, p99 float64) {
	slices.Sort(took)
	return took[len(took)/2], took[min(len(took)-1, len(took)*99/100)]
}

// runPods creates n pods named prefix-NNN at once, each declaring network
// if given, and returns, for each, the time from its create request to the
// watch event that shows it Running, and from the first event that shows
// it stored to the one that shows its addresses allocated.
func runPods(kube kubernetes.Interface, prefix string, n int, network string, shape ...func(*corev1.Pod)) ([]float64, []float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return nil, nil, errors.New("no default ServiceAccount")
	}
	// A watch that resumes where it stopped: the API server may end one
	// while the node is saturated.
	selector := metav1.ListOptions{LabelSelector: "bench=" + prefix}
	list, err := kube.CoreV1().Pods("default").List(ctx, selector)
	if err != nil {
		return nil, nil, err
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector.LabelSelector
			return kube.CoreV1().Pods("default").Watch(ctx, o)
		},
	})
	if err != nil {
		return nil, nil, err
	}
	defer w.Stop()
	var mu sync.Mutex
	sent := map[string]time.Time{}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprintf("%s-%03d", prefix, i)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": prefix}},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{Name: "c", Image: "busybox", Command: []string{"sleep", "3600"}}}}}
			if network != "" {
				pod.Annotations = map[string]string{netselect.NetworksAnnotation: network}
			}
			for _, f := range shape {
				f(pod)
			}
			mu.Lock()
			sent[name] = time.Now()
			mu.Unlock()
			if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, nil, fmt.Errorf("creating pods: %w", err)
	}
	// stored: when the watch first showed the pod, which under load is
	// long after the create was sent; allocation is timed from there, so
	// that it is netop's share alone.
	running, allocated, stored := map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	for len(running) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, nil, errors.New("watch closed")
			}
			if ev.Type == watch.Error {
				return nil, nil, fmt.Errorf("watch: %v", ev.Object)
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if _, seen := stored[pod.Name]; !seen {
				stored[pod.Name] = time.Now()
			}
			if _, seen := allocated[pod.Name]; !seen && pod.Annotations[netselect.AllocationsAnnotation] != "" {
				allocated[pod.Name] = time.Now()
			}
			if pod.Status.Phase == corev1.PodRunning {
				if _, seen := running[pod.Name]; !seen {
					running[pod.Name] = time.Now()
				}
			}
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%d of %d pods Running", len(running), n)
		}
	}
	var took, allocation []float64
	mu.Lock()
	for name, at := range running {
		took = append(took, at.Sub(sent[name]).Seconds())
	}
	for name, at := range allocated {
		allocation = append(allocation, at.Sub(stored[name]).Seconds())
	}
	mu.Unlock()
	if network != "" && len(allocation) != n {
		return nil, nil, fmt.Errorf("%d of %d pods Running without an allocation", n-len(allocation), n)
	}
	return took, allocation, nil
}

func deletePods(kube kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := kube.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "bench"}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "bench"})
		return err == nil && len(list.Items) == 0, nil
	})
}

func netopClient(kubeconfig string) (versioned.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return versioned.NewForConfig(cfg)
}

// createPolicies makes n policies for example-network that each select
// every pod of default and allow it TCP port 1000+i from every other: each
// pod is an element of every policy's sets, so that every pod that comes
// or goes changes them all.
func createPolicies(netop versioned.Interface, n int) error {
	for i := range n {
		p := &v1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%03d", i),
			Annotations: map[string]string{v1beta1.PolicyForAnnotation: "example-network"}},
			Spec: v1beta1.MultiNetworkPolicySpec{Ingress: []v1beta1.MultiNetworkPolicyIngressRule{{
				From:  []v1beta1.MultiNetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
				Ports: []v1beta1.MultiNetworkPolicyPort{{Port: &intstr.IntOrString{IntVal: int32(1000 + i)}}},
			}}}}
		if _, err := netop.K8sCniCncfIoV1beta1().MultiNetworkPolicies("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating policy %s: %w", p.Name, err)
		}
	}
	return nil
}

// measureEnforcement times changes to enforcement on a UDP stream from a
// client pod to a server pod, one datagram every 2 ms: the client
// labelled into and out of the server's policy's peers (pod changes), and
// a policy opening the server to every pod created and deleted (policy
// changes), each changes times.
func measureEnforcement(kube kubernetes.Interface, netop versioned.Interface, dataDir string, changes int) (podChanges, policyChanges []float64, err error) {
	ctx := context.Background()
	handles := map[string]netns.NsHandle{}
	addrs := map[string]string{}
	for _, name := range []string{"enforce-server", "enforce-client"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": "enforce", "role": name},
			Annotations: map[string]string{netselect.NetworksAnnotation: "example-network"}},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "c", Image: "busybox", Command: []string{"sleep", "3600"}}}}}
		if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return nil, nil, err
		}
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || got.Status.Phase != corev1.PodRunning {
				return false, nil
			}
			allocations, err := netselect.ParseAllocations(got.Annotations[netselect.AllocationsAnnotation])
			if err != nil || len(allocations) != 1 {
				return false, nil
			}
			addrs[name], _, _ = strings.Cut(allocations[0].IPs[0], "/")
			h, ok, err := podprobe.Netns(dataDir, "default/"+name)
			if ok {
				handles[name] = h
			}
			return ok, err
		}); err != nil {
			return nil, nil, fmt.Errorf("pod %s: %w", name, err)
		}
	}
	defer func() {
		for _, h := range handles {
			_ = h.Close()
		}
	}()
	closeServer, err := podprobe.Serve(handles["enforce-server"], []podprobe.Port{{Number: 80, Protocol: podprobe.UDP}})
	if err != nil {
		return nil, nil, err
	}
	defer closeServer()
	stream, err := podprobe.StartStream(handles["enforce-client"], addrs["enforce-server"], 80, 2*time.Millisecond)
	if err != nil {
		return nil, nil, err
	}
	defer stream.Close()

	policies := netop.K8sCniCncfIoV1beta1().MultiNetworkPolicies("default")
	policy := func(name string, from *metav1.LabelSelector) *v1beta1.MultiNetworkPolicy {
		return &v1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{v1beta1.PolicyForAnnotation: "example-network"}},
			Spec: v1beta1.MultiNetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "enforce-server"}},
				Ingress: []v1beta1.MultiNetworkPolicyIngressRule{{From: []v1beta1.MultiNetworkPolicyPeer{{PodSelector: from}},
					Ports: []v1beta1.MultiNetworkPolicyPort{{Protocol: ptr.To(v1beta1.ProtocolUDP), Port: &intstr.IntOrString{IntVal: 80}}}}}}}
	}
	if _, err := policies.Create(ctx, policy("enforce-friends", &metav1.LabelSelector{MatchLabels: map[string]string{"friend": "yes"}}), metav1.CreateOptions{}); err != nil {
		return nil, nil, err
	}
	// timed runs change and waits for the stream to open (or close).
	timed := func(what string, open bool, change func() error) (float64, error) {
		since := time.Now()
		if err := change(); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		var took time.Duration
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			var ok bool
			if open {
				took, ok = stream.Opened(since)
			} else {
				took, ok = stream.Closed(since, 300*time.Millisecond)
			}
			return ok, nil
		})
		if err != nil {
			return 0, fmt.Errorf("%s: not enforced within 30 s", what)
		}
		return took.Seconds(), nil
	}
	label := func(value any) func() error {
		return func() error {
			body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{"friend": value}}})
			if err == nil {
				_, err = kube.CoreV1().Pods("default").Patch(ctx, "enforce-client", types.MergePatchType, body, metav1.PatchOptions{})
			}
			return err
		}
	}
	if _, err := timed("the server isolated", false, func() error { return nil }); err != nil {
		return nil, nil, err
	}
	for range changes {
		for _, step := range []struct {
			what   string
			open   bool
			change func() error
			into   *[]float64
		}{
			{"the client labelled a friend", true, label("yes"), &podChanges},
			{"the client's label removed", false, label(nil), &podChanges},
			{"a policy opening the server created", true, func() error {
				_, err := policies.Create(ctx, policy("enforce-open", &metav1.LabelSelector{}), metav1.CreateOptions{})
				return err
			}, &policyChanges},
			{"the policy opening the server deleted", false, func() error {
				return policies.Delete(ctx, "enforce-open", metav1.DeleteOptions{})
			}, &policyChanges},
		} {
			took, err := timed(step.what, step.open, step.change)
			if err != nil {
				return nil, nil, err
			}
			*step.into = append(*step.into, took)
		}
	}
	if err := policies.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return nil, nil, err
	}
	return podChanges, policyChanges, deletePods(kube)
}

// memory sums the resident memory of the node's processes, found by the
// data directory (or containerd's socket) on their command line.
func memory(dataDir string) (kubelet, containerd, shims float64, nShims int) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		raw, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.Contains(string(raw), dataDir) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		rss := rssMiB(p)
		switch {
		case len(args) > 1 && args[1] == "kubelet":
			kubelet += rss
		case filepath.Base(args[0]) == "containerd":
			containerd += rss
		case strings.HasPrefix(filepath.Base(args[0]), "containerd-shim"):
			shims += rss
			nShims++
		}
	}
	return kubelet, containerd, shims, nShims
}

func rssMiB(proc string) float64 {
	status, err := os.ReadFile(filepath.Join(proc, "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
