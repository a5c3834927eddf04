// Command peers measures netop's pod attachment side by side with a
// peer's, in one run on one control plane: whereabouts (Multus's IPAM,
// built from its Go module at bench time, its CRDs installed from the same
// module) under the reference bridge plugin, against netop's CNI plugin as
// a delegate for one Network. Both are driven through libcni as containerd
// drives them; each "pod" is a real pod object bound to a Node without a
// kubelet, and a throwaway network namespace.
//
// Scenarios, each with both IPAMs, netop's first: exact (N pods at once,
// at most C in flight, exactly N free addresses), recreate (every pod of
// exact deleted, then N new ones), wide (the same in a /16). For each: the
// time until all N are attached, ADD p50/p99, failures, duplicate
// addresses, the API server's requests per pod by verb and resource (its
// own request metrics), and CPU: the plugin processes', netop's
// operator's, and the bench process's, split by a CPU profile of it into
// the embedded control plane's and the driver's (--profile-dir keeps the
// profiles).
//
// The whole run is in a network namespace of its own, which goes with it.
// Then (--node-pods) pods at once through the kubelet on netop-standalone's
// real node with each IPAM: test/bench/node --only peers.
//
// --plot-dir DIR draws the pods attached over time in each scenario as an
// SVG file in DIR (BENCHMARKS.md's is in docs/benchmarks).
//
// Run it as root: go run ./test/bench/peers --pods 1000 --concurrency 50
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/controlplane"
	"github.com/netop-dev/netop/internal/testing/gobuild"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	"github.com/netop-dev/netop/test/bench/benchplot"
	"github.com/netop-dev/netop/test/bench/benchproc"
	"github.com/netop-dev/netop/test/bench/whereabouts"
)

// The bench's second self, the one inside its namespace, is told where
// the binaries are built (inNetnsEnv: DIR/bin) and where whereabouts'
// module is.
const (
	inNetnsEnv     = "NETOP_PEERS_DIR"
	whereaboutsEnv = "NETOP_PEERS_WHEREABOUTS"
)

type config struct {
	pods, concurrency  int
	whereaboutsVersion string
	only               string
	profileDir         string
	nodePods           int
}

func main() {
	var c config
	flag.IntVar(&c.pods, "pods", 1000, "pods per scenario (N)")
	flag.IntVar(&c.concurrency, "concurrency", 50, "CNI ADDs in flight at once")
	flag.StringVar(&c.whereaboutsVersion, "whereabouts-version", whereabouts.DefaultVersion, "the version of "+whereabouts.Module+" to build")
	flag.StringVar(&c.only, "only", "", "run one IPAM: netop or whereabouts (default both)")
	flag.StringVar(&c.profileDir, "profile-dir", "", "save CPU profiles of each scenario here: the bench process's (bench-IPAM-SCENARIO.pprof: the embedded control plane and the driver, labelled part=driver) and netop's operator's over the scenario's first seconds (operator-SCENARIO.pprof)")
	flag.IntVar(&c.nodePods, "node-pods", 100, "then this many pods at once through the kubelet on netop-standalone's real node, with each IPAM (test/bench/node --only peers); 0: not")
	plots := benchplot.Flags(flag.CommandLine)
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "peers: run as root: the plugins make network namespaces, bridges and veths")
		os.Exit(2)
	}
	if c.pods < 1 || c.pods > 60000 || c.concurrency < 1 {
		fmt.Fprintln(os.Stderr, "peers: --pods from 1 to 60000, --concurrency at least 1")
		os.Exit(2)
	}
	if c.profileDir != "" {
		// Made now: the first profile is written after the first round.
		if err := os.MkdirAll(c.profileDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "peers: --profile-dir:", err)
			os.Exit(2)
		}
	}
	var err error
	if dir := os.Getenv(inNetnsEnv); dir == "" {
		err = inOwnNetns(c)
		if err == nil && c.nodePods > 0 {
			err = onTheNode(c)
		}
	} else {
		err = run(c, dir, os.Getenv(whereaboutsEnv), plots)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

// inOwnNetns builds the binaries (the module proxy is outside the bench's
// namespace), then runs the bench again inside a network namespace of its
// own (and, through ip netns exec, a mount namespace whose netns mounts
// go with it), then removes the namespace: whatever the run leaves,
// bridges, veths or pods' namespaces, goes with it.
func inOwnNetns(c config) error {
	dir, err := os.MkdirTemp("", "netop-bench-peers-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	whereaboutsDir, err := build(filepath.Join(dir, "bin"), c.whereaboutsVersion)
	if err != nil {
		return err
	}
	name := nettest.NetnsName("peers")
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", name, err, out)
	}
	defer func() { _ = nettest.DeleteNetns(name) }()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", name, self}, os.Args[1:]...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), inNetnsEnv+"="+dir, whereaboutsEnv+"="+whereaboutsDir)
	return cmd.Run()
}

// onTheNode runs the node bench's round of pods through the kubelet with
// each IPAM, on the host: the standalone's node makes namespaces of its own.
func onTheNode(c config) error {
	cmd := exec.Command("go", "run", "github.com/netop-dev/netop/test/bench/node", "--only", "peers",
		"--pods", strconv.Itoa(c.nodePods), "--whereabouts-version", c.whereaboutsVersion)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("through the kubelet (go run ./test/bench/node --only peers): %w", err)
	}
	return nil
}

// ipam is one side of the comparison.
type ipam struct {
	name    string
	conf    func(scenario) (*libcni.NetworkConfigList, error)
	podMeta func(scenario) map[string]string
	// free waits until every address of the scenario is free again.
	free func(context.Context, scenario) error
}

// settle waits for the machine to be idle again after a round, so that
// the next does not pay for what it left to the kernel and the control
// plane (network namespaces torn down after the bench deleted them,
// objects collected).
func settle(ctx context.Context) {
	waited, err := benchproc.Settle(ctx, 0.15, time.Minute)
	if err != nil {
		fmt.Fprintf(os.Stderr, "  not settled, going on: %v\n", err)
		return
	}
	fmt.Fprintf(os.Stderr, "  settled in %.1f s\n", waited.Seconds())
}

// warmupPods are attached and detached by each IPAM before the scenarios.
const warmupPods = 200

// scenario is what a run of N pods is on.
type scenario struct {
	name string
	// prefix is the range's; netop's Network has its gateway first and
	// every address after the first N reserved, whereabouts' range the
	// same N.
	prefix netip.Prefix
	exact  bool
}

// outcome is one IPAM's run of one scenario.
type outcome struct {
	IPAM       string             `json:"ipam"`
	Scenario   string             `json:"scenario"`
	Pods       int                `json:"pods"`
	Seconds    float64            `json:"seconds"`
	P50S       float64            `json:"addP50S"`
	P99S       float64            `json:"addP99S"`
	Failures   int                `json:"failures"`
	Errors     []string           `json:"errors,omitempty"`
	Duplicates int                `json:"duplicates"`
	Requests   map[string]float64 `json:"requestsPerPod"`
	PluginCPU  float64            `json:"pluginCPUPerPodMs"`
	NetopCPU   float64            `json:"operatorCPUPerPodMs"`
	// ControlPlaneCPU and DriverCPU split the bench process's CPU by a
	// profile of it (profile.go).
	ControlPlaneCPU float64 `json:"controlPlaneCPUPerPodMs"`
	DriverCPU       float64 `json:"driverCPUPerPodMs"`
	// CreateMs is the mean time of the driver's pod creates, admission
	// webhooks included; Webhooks are the API server's calls of them.
	CreateMs float64                 `json:"podCreateMeanMs"`
	Webhooks map[string]webhookCalls `json:"webhookCalls"`
	// StealPercent is the share of the machine's time its hypervisor
	// took during the scenario (/proc/stat's steal): runs to compare
	// should have about the same.
	StealPercent float64 `json:"stealPercent"`
	// Phases are netop's means, in ms, of where an ADD waits.
	Phases map[string]float64 `json:"netopPhasesMeanMs,omitempty"`
	// attachedAfter is, for each pod attached, the seconds from the
	// scenario's start to its ADD done, in order.
	attachedAfter []float64
}

// webhookCalls are one admission webhook's calls for one operation.
type webhookCalls struct {
	PerPod float64 `json:"perPod"`
	MeanMs float64 `json:"meanMs"`
}

// run is the bench inside its namespace: dir holds the binaries (bin),
// whereaboutsDir is whereabouts' module.
func run(c config, dir, whereaboutsDir string, plots *benchplot.Output) error {
	ctx := context.Background()
	if err := bringUpLoopback(); err != nil {
		return err
	}
	bin := filepath.Join(dir, "bin")
	cl, err := startCluster(ctx, dir, whereaboutsDir, c)
	if err != nil {
		return err
	}
	defer cl.stop()
	scenarios := []scenario{
		{name: "exact", prefix: netip.MustParsePrefix("10.200.0.0/16"), exact: true},
		{name: "wide", prefix: netip.MustParsePrefix("10.201.0.0/16")},
	}
	// The plugins' stderr (whereabouts logs its leader election there)
	// goes to a file, as containerd's goes to its log.
	pluginLog, err := os.Create(filepath.Join(dir, "plugins.log"))
	if err != nil {
		return err
	}
	defer func() { _ = pluginLog.Close() }()
	runtime := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cni-cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: pluginLog}, PluginDecoder: version.PluginDecoder{}})
	ipams, err := cl.ipams(c, dir)
	if err != nil {
		return err
	}
	// Each IPAM first attaches and detaches a few pods on a Network of its
	// own, unmeasured: neither is measured on a cold control plane (caches,
	// connections, heaps), which would otherwise fall on whichever runs
	// first.
	warmup := scenario{name: "warmup", prefix: netip.MustParsePrefix("10.202.0.0/16")}
	for _, s := range append(scenarios, warmup) {
		if err := createNetwork(ctx, cl.netop, peersNamespace, s, c.pods); err != nil {
			return err
		}
	}
	d := &driver{kube: cl.kube, runtime: runtime, namespace: peersNamespace, node: peersNode, operator: cl.operator, concurrency: c.concurrency, profileDir: c.profileDir}
	if err := d.warmUp(ctx, ipams, warmup, c); err != nil {
		return err
	}
	outcomes, err := d.measureScenarios(ctx, ipams, scenarios, c)
	if err != nil {
		return err
	}
	report(c, outcomes)
	return drawAttached(plots, c, outcomes)
}

// The namespace of the bench's pods and Networks, and its Node.
const (
	peersNamespace = "peers"
	peersNode      = "peers-node"
)

// cluster is the embedded control plane, with netop's CRDs, the bench's
// namespace and Node, and netop's operator running on it.
type cluster struct {
	cp       *controlplane.ControlPlane
	cfg      *rest.Config
	kube     kubernetes.Interface
	netop    versioned.Interface
	operator *benchproc.Proc
}

// startCluster starts the control plane in dir/cp, with netop's CRDs and
// whereabouts' (from its module, whereaboutsDir), and netop's operator
// (dir/bin/netop) against it, and waits until the operator is ready.
func startCluster(ctx context.Context, dir, whereaboutsDir string, c config) (cl *cluster, err error) {
	cl = &cluster{}
	if cl.cp, err = controlplane.Start(ctx, controlplane.Config{DataDir: filepath.Join(dir, "cp")}); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			cl.stop()
		}
	}()
	cl.cfg = cl.cp.AdminConfig()
	cl.cfg.QPS, cl.cfg.Burst = 500, 1000
	if err := install.CRDs(ctx, cl.cfg); err != nil {
		return nil, err
	}
	if err := whereabouts.InstallCRDs(ctx, cl.cfg, whereaboutsDir); err != nil {
		return nil, err
	}
	for _, ns := range []string{"netop-system", peersNamespace} {
		if err := install.Namespace(ctx, cl.cfg, ns); err != nil {
			return nil, err
		}
	}
	cl.kube = kubernetes.NewForConfigOrDie(cl.cfg)
	cl.netop = versioned.NewForConfigOrDie(cl.cfg)
	if err := testenv.RegisterNode(ctx, cl.kube, peersNode, "10.254.0.1"); err != nil {
		return nil, err
	}
	metricsAddr := benchproc.FreePort()
	args := []string{filepath.Join(dir, "bin", "netop"), "run", "--kubeconfig", cl.cp.KubeconfigPath, "--leader-elect=false",
		"--webhook-addr", "127.0.0.1:0", "--webhook-local", "--webhook-cert-dir", filepath.Join(dir, "webhook"),
		"--operator-namespace", "netop-system", "--metrics-addr", metricsAddr}
	if c.profileDir != "" {
		args = append(args, "--profiling")
	}
	if cl.operator, err = benchproc.Start(args, metricsAddr, filepath.Join(dir, "netop.log")); err != nil {
		return nil, err
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return cl.operator.Ready(), nil
	}); err != nil {
		return nil, fmt.Errorf("netop not ready (its log: %s): %w", filepath.Join(dir, "netop.log"), err)
	}
	return cl, nil
}

// stop stops the operator, then the control plane.
func (cl *cluster) stop() {
	if cl.operator != nil {
		cl.operator.Stop()
	}
	cl.cp.Stop()
}

// ipams are the IPAMs --only asks for, in order: netop's, then
// whereabouts'.
func (cl *cluster) ipams(c config, dir string) ([]ipam, error) {
	netopIPAM := ipam{
		name: "netop",
		conf: func(s scenario) (*libcni.NetworkConfigList, error) {
			pc := cniapi.Config{DataDir: filepath.Join(dir, "netop-cni"), Network: peersNamespace + "/" + s.name, Timeout: "5m", LogLevel: "error"}
			pc.Type = cniapi.Type
			return confList("netop-"+s.name, pc)
		},
		podMeta: func(s scenario) map[string]string { return map[string]string{netselect.NetworksAnnotation: s.name} },
		free: func(ctx context.Context, s scenario) error {
			return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
				n, err := cl.netop.SamplecrdV2().Networks(peersNamespace).Get(ctx, s.name, metav1.GetOptions{})
				return err == nil && n.Status.Addresses != nil && n.Status.Addresses.Allocated == 0, nil
			})
		},
	}
	// The flat file whereabouts' DaemonSet installs on every node: its DEL
	// refuses to work without one.
	flatFile := filepath.Join(dir, "whereabouts.conf")
	if err := whereabouts.FlatFile(flatFile, cl.cp.KubeconfigPath); err != nil {
		return nil, err
	}
	peer := ipam{
		name: "whereabouts",
		conf: func(s scenario) (*libcni.NetworkConfigList, error) {
			first, last := rangeOf(s, c.pods)
			r := map[string]any{"type": "whereabouts", "range": s.prefix.String(), "range_start": first.String(), "range_end": last.String(),
				"gateway": s.prefix.Addr().Next().String(), "kubernetes": map[string]any{"kubeconfig": cl.cp.KubeconfigPath}, "configuration_path": flatFile,
				"log_file": filepath.Join(dir, "whereabouts.log"), "log_level": "error"}
			if !s.exact {
				delete(r, "range_end")
			}
			return confList("whereabouts-"+s.name, map[string]any{"type": "bridge", "bridge": "wb-" + s.name, "isGateway": true, "ipam": r})
		},
		podMeta: func(scenario) map[string]string { return nil },
		// DEL releases the addresses before it returns.
		free: func(context.Context, scenario) error { return nil },
	}
	var ipams []ipam
	for _, i := range []ipam{netopIPAM, peer} {
		if c.only == "" || c.only == i.name {
			ipams = append(ipams, i)
		}
	}
	if len(ipams) == 0 {
		return nil, fmt.Errorf("--only %q: netop or whereabouts", c.only)
	}
	return ipams, nil
}

// warmUp has each IPAM attach and detach min(warmupPods, --pods) pods on
// warmup, unmeasured and unprofiled.
func (d *driver) warmUp(ctx context.Context, ipams []ipam, warmup scenario, c config) error {
	unprofiled := *d
	unprofiled.profileDir = ""
	for _, i := range ipams {
		conf, err := i.conf(warmup)
		if err != nil {
			return err
		}
		n := min(warmupPods, c.pods)
		fmt.Fprintf(os.Stderr, "%s, %s: %d pods, %d at once, not measured\n", i.name, warmup.name, n, c.concurrency)
		o, pods, err := unprofiled.attach(ctx, i, warmup, conf, warmup.name, n)
		if err != nil {
			return err
		}
		if err := d.detach(ctx, conf, pods); err != nil {
			return err
		}
		if o.Failures > 0 {
			return fmt.Errorf("%s, %s: %d of %d pods failed: %v", i.name, warmup.name, o.Failures, n, o.Errors)
		}
		if err := i.free(ctx, warmup); err != nil {
			return fmt.Errorf("%s, %s: addresses not free after every pod left: %w", i.name, warmup.name, err)
		}
		settle(ctx)
	}
	return nil
}

// measureScenarios runs every scenario with each IPAM, --pods pods each,
// and on exact every pod deleted and made again (recreate).
func (d *driver) measureScenarios(ctx context.Context, ipams []ipam, scenarios []scenario, c config) ([]outcome, error) {
	// Each IPAM runs all its scenarios before the next IPAM's. With the
	// scenarios interleaved, netop's /16 came after whereabouts' two rounds
	// and was its slowest in both full runs of 2026-11-27 (ADD p99 0.8 and
	// 1.6 s, attaching three times as long), which no netop-only run
	// showed: the round after whereabouts' paid for something they left,
	// not pinned down (docs/benchmarks/journal.md, 2026-11-27, session 30).
	var outcomes []outcome
	for _, i := range ipams {
		for _, s := range scenarios {
			conf, err := i.conf(s)
			if err != nil {
				return nil, err
			}
			// N pods attached, then all deleted; on exact, N new ones.
			rounds := []string{s.name}
			if s.exact {
				rounds = append(rounds, "recreate")
			}
			for _, label := range rounds {
				fmt.Fprintf(os.Stderr, "%s, %s: %d pods, %d at once\n", i.name, label, c.pods, c.concurrency)
				o, pods, err := d.attach(ctx, i, s, conf, label, c.pods)
				if err != nil {
					return nil, err
				}
				outcomes = append(outcomes, o)
				if err := d.detach(ctx, conf, pods); err != nil {
					return nil, err
				}
				if err := i.free(ctx, s); err != nil {
					return nil, fmt.Errorf("%s, %s: addresses not free after every pod left: %w", i.name, label, err)
				}
				settle(ctx)
			}
		}
	}
	return outcomes, nil
}

// drawAttached draws, for each IPAM and scenario, the pods attached over
// the scenario's time.
func drawAttached(plots *benchplot.Output, c config, outcomes []outcome) error {
	var series []benchplot.Series
	for _, o := range outcomes {
		series = append(series, benchplot.Cumulative(o.IPAM+", "+o.Scenario, o.attachedAfter, float64(len(o.attachedAfter))))
	}
	return plots.Draw("pods-attached-over-time", benchplot.Chart{
		Title:      "Pods attached over time through libcni: netop against whereabouts " + c.whereaboutsVersion,
		Conditions: fmt.Sprintf("N = %d pods per scenario, %d ADDs at once", c.pods, c.concurrency),
		XLabel:     "seconds from the scenario's start (log scale)", YLabel: "pods attached",
		LogX: true, Series: series,
	})
}

// build builds netop, its CNI plugin and whereabouts' into bin, and
// returns where whereabouts' module is.
func build(bin, version string) (string, error) {
	if err := gobuild.Command(filepath.Join(bin, "netop"), "./cmd/netop"); err != nil {
		return "", err
	}
	if err := gobuild.Static(filepath.Join(bin, cniapi.Type), gobuild.Plugin); err != nil {
		return "", err
	}
	moduleDir, err := whereabouts.Build(filepath.Join(bin, "whereabouts"), version)
	if err != nil {
		return "", err
	}
	// The reference bridge plugin, as Debian ships it.
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return "", fmt.Errorf("the bridge plugin (apt install containernetworking-plugins): %w", err)
	}
	return moduleDir, os.Symlink("/usr/lib/cni/bridge", filepath.Join(bin, "bridge"))
}
