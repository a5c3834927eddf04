// Command agents measures netop on a cluster of many nodes (as root): N
// agents (`netop agent` processes, each building in a network namespace of
// its own, on an underlay, with a Node object but no kubelet) and one
// `netop controller` against one embedded control plane, with M Networks.
// It reports the time from creating the Networks to all of them Ready on
// all nodes, each agent's API requests and writes until converged, in a
// quiet minute after, and across a restart of every agent, and the CPU and
// memory of the controller and the agents. It prints a table and a JSON
// line.
//
// By default the agents build every Network on every node
// (--networks-on-demand=false). With --per-node K they build Networks on
// demand, and each node gets a pod (no kubelet: its allocations are what
// counts) on K of the Networks, two nodes per Network: the bench reports
// the time until every placement is usable (bridge up, VXLAN device
// flooding to the other node) and each node's links, VXLAN devices and
// flooding entries.
//
//	go run ./test/bench/agents [--agents 50] [--networks 1000] [--per-node 20]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/standalone/controlplane"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/internal/testing/gobuild"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	samplecrdv1client "github.com/netop-dev/netop/pkg/generated/clientset/versioned/typed/samplecrd/v1"
	"github.com/netop-dev/netop/test/bench/benchproc"
)

type result struct {
	Date     string `json:"date"`
	CPUs     int    `json:"cpus"`
	Agents   int    `json:"agents"`
	Networks int    `json:"networks"`
	// AllReadyS is from the first create to every Network Ready on
	// every node.
	AllReadyS float64 `json:"allReadyS"`
	// CreateRetries counts creates retried after an admission timeout.
	CreateRetries int64 `json:"createRetries"`
	// Per agent, mean and max: from its start to converged, in a quiet
	// minute after, and from a restart to converged again.
	StartRequests   stat `json:"startRequests"`
	StartWrites     stat `json:"startWrites"`
	SteadyRequests  stat `json:"steadyRequests"`
	SteadyWrites    stat `json:"steadyWrites"`
	RestartRequests stat `json:"restartRequests"`
	RestartWrites   stat `json:"restartWrites"`
	// CPU seconds and resident memory (MiB), at the end of the first
	// convergence.
	ControllerCPUS   float64 `json:"controllerCPUS"`
	ControllerRSSMiB float64 `json:"controllerRSSMiB"`
	AgentCPUS        stat    `json:"agentCPUS"`
	AgentRSSMiB      stat    `json:"agentRSSMiB"`
	ControllerWrites float64 `json:"controllerWrites"`
	// With --per-node: K, the time from creating the pods to every
	// placement usable, and per node its links, VXLAN devices and
	// flooding entries once usable.
	PerNode      int     `json:"perNode,omitempty"`
	PlacedS      float64 `json:"placedS,omitempty"`
	Links        stat    `json:"links"`
	VXLANDevices stat    `json:"vxlanDevices"`
	FloodEntries stat    `json:"floodEntries"`
}

type stat struct {
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

func statOf(values []float64) stat {
	var s stat
	for _, v := range values {
		s.Mean += v / float64(len(values))
		s.Max = max(s.Max, v)
	}
	return s
}

func main() {
	agents := flag.Int("agents", 50, "node agents, each a process with a network namespace of its own")
	networks := flag.Int("networks", 1000, "Networks")
	perNode := flag.Int("per-node", 0, "Networks on demand, each node with a pod on this many of them (two nodes per Network); 0: every Network on every node")
	flag.Parse()
	if err := run(*agents, *networks, *perNode); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(agentCount, networkCount, perNode int) error {
	if perNode > 0 && perNode*((agentCount+1)/2) > networkCount {
		return fmt.Errorf("--per-node %d: %d agents in pairs need %d Networks, not %d", perNode, agentCount, perNode*((agentCount+1)/2), networkCount)
	}
	ctx := context.Background()
	b, tearDown, err := setUp(ctx, agentCount, perNode)
	if err != nil {
		return err
	}
	defer tearDown()
	fmt.Fprintf(os.Stderr, "%d agents and the controller ready (pprof: controller %s, first agent %s); creating %d Networks\n", agentCount, b.controller.Metrics, b.agents[0].Metrics, networkCount)

	res := result{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Agents: agentCount, Networks: networkCount, PerNode: perNode}
	began := time.Now()
	if res.CreateRetries, err = b.createNetworks(ctx, networkCount); err != nil {
		return err
	}
	if err := b.waitAllReady(ctx, networkCount, began); err != nil {
		return err
	}
	res.AllReadyS = time.Since(began).Seconds()
	if perNode > 0 {
		if err := b.placePods(ctx, &res); err != nil {
			return err
		}
	}
	if err := b.measureAgents(ctx, networkCount, &res); err != nil {
		return err
	}
	res.print()
	return nil
}

// bench is the cluster measured: one control plane, the nodes (a network
// namespace each on an underlay, and a Node object), the controller and
// an agent per node.
type bench struct {
	binary, dir string
	cp          *controlplane.ControlPlane
	kube        kubernetes.Interface
	nets        samplecrdv1client.NetworkInterface
	// names are the nodes', netnss their network namespaces'.
	names, netnss []string
	underlay      *node.Underlay
	perNode       int
	controller    *benchproc.Proc
	agents        []*benchproc.Proc
}

// setUp builds netop and starts the cluster, and returns once every netop
// process is ready; tearDown undoes it, last first.
func setUp(ctx context.Context, agentCount, perNode int) (b *bench, tearDown func(), err error) {
	undo := &benchproc.Cleanup{}
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	b = &bench{perNode: perNode}
	if b.dir, err = os.MkdirTemp("", "netop-bench-agents-"); err != nil {
		return nil, nil, err
	}
	undo.Add(func() { _ = os.RemoveAll(b.dir) })
	b.binary = filepath.Join(b.dir, "netop")
	if err := gobuild.Command(b.binary, "github.com/netop-dev/netop/cmd/netop"); err != nil {
		return nil, nil, err
	}
	if b.cp, err = controlplane.Start(ctx, controlplane.Config{DataDir: b.dir}); err != nil {
		return nil, nil, err
	}
	undo.Add(b.cp.Stop)
	cfg := b.cp.AdminConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	if err := install.CRDs(ctx, cfg); err != nil {
		return nil, nil, err
	}
	// The bench writes v1, the storage version is v2: conversion until the
	// controller serves it.
	conversion, err := testenv.ServeConversion(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	undo.Add(conversion.Close)
	if err := install.Namespace(ctx, cfg, "netop-system"); err != nil {
		return nil, nil, err
	}
	b.kube = kubernetes.NewForConfigOrDie(cfg)
	b.nets = versioned.NewForConfigOrDie(cfg).SamplecrdV1().Networks("default")
	if err := b.makeNodes(ctx, agentCount, undo); err != nil {
		return nil, nil, err
	}
	if err := b.startNetop(agentCount, undo); err != nil {
		return nil, nil, err
	}
	if err := b.waitReady(ctx, append(slices.Clone(b.agents), b.controller)); err != nil {
		return nil, nil, fmt.Errorf("netop processes not ready: %w", err)
	}
	return b, undo.Run, nil
}

// makeNodes makes the nodes: a namespace each on an underlay, and a Node
// object with its address; undo removes them.
func (b *bench) makeNodes(ctx context.Context, agentCount int, undo *benchproc.Cleanup) error {
	b.names = make([]string, agentCount)
	b.netnss = make([]string, agentCount)
	for i := range b.names {
		b.names[i] = fmt.Sprintf("bench-%d", i+1)
		b.netnss[i] = fmt.Sprintf("netop-bench-%d", i+1)
	}
	var err error
	if b.underlay, err = node.NewUnderlay("netop-bench", netip.MustParsePrefix("10.253.0.0/24"), b.netnss); err != nil {
		return err
	}
	undo.Add(func() {
		b.underlay.Remove()
		for _, ns := range b.netnss {
			_ = exec.Command("ip", "netns", "delete", ns).Run()
		}
	})
	for i, name := range b.names {
		if err := testenv.RegisterNode(ctx, b.kube, name, b.underlay.Nodes[i].Address.String()); err != nil {
			return err
		}
	}
	return nil
}

// startNetop starts the controller and an agent per node; undo stops
// them.
func (b *bench) startNetop(agentCount int, undo *benchproc.Cleanup) error {
	controllerAddr := benchproc.FreePort()
	var err error
	b.controller, err = benchproc.Start([]string{b.binary, "controller", "--kubeconfig", b.cp.KubeconfigPath, "--leader-elect=false",
		"--webhook-addr", "127.0.0.1:0", "--webhook-local", "--webhook-cert-dir", filepath.Join(b.dir, "webhook"),
		"--operator-namespace", "netop-system", "--metrics-addr", controllerAddr, "--profiling"}, controllerAddr, filepath.Join(b.dir, "controller.log"))
	if err != nil {
		return err
	}
	undo.Add(b.controller.Stop)
	b.agents = make([]*benchproc.Proc, agentCount)
	undo.Add(func() {
		for _, a := range b.agents {
			if a != nil {
				a.Stop()
			}
		}
	})
	for i := range b.agents {
		if b.agents[i], err = b.startAgent(i); err != nil {
			return err
		}
	}
	return nil
}

// startAgent starts node i's agent.
func (b *bench) startAgent(i int) (*benchproc.Proc, error) {
	addr := benchproc.FreePort()
	return benchproc.Start([]string{b.binary, "agent", "--kubeconfig", b.cp.KubeconfigPath, "--node-name", b.names[i], "--netns", b.netnss[i],
		"--metrics-addr", addr, "--profiling", fmt.Sprintf("--networks-on-demand=%t", b.perNode > 0)}, addr, filepath.Join(b.dir, b.names[i]+".log"))
}

// waitReady waits until every one of procs is ready.
func (b *bench) waitReady(ctx context.Context, procs []*benchproc.Proc) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		for _, p := range procs {
			if !p.Ready() {
				return false, nil
			}
		}
		return true, nil
	})
}

// createNetworks creates networkCount Networks, 8 at once, and returns how
// many creates were retried.
func (b *bench) createNetworks(ctx context.Context, networkCount int) (int64, error) {
	var wg sync.WaitGroup
	errs := make(chan error, networkCount)
	sem := make(chan struct{}, 8)
	var retries atomic.Int64
	for i := range networkCount {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			n := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)},
				Spec: samplecrdv1.NetworkSpec{CIDR: fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256)}}
			// As kubectl apply run again would: a webhook call that timed
			// out on a saturated machine is retried, and counted.
			for attempt := 0; ; attempt++ {
				_, err := b.nets.Create(ctx, n, metav1.CreateOptions{})
				if err == nil || apierrors.IsAlreadyExists(err) {
					return
				}
				if attempt == 5 || !apierrors.IsInternalError(err) && !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) {
					errs <- err
					return
				}
				retries.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return retries.Load(), fmt.Errorf("creating Networks: %w", err)
	}
	return retries.Load(), nil
}

// allReady reports whether all networkCount Networks are Ready on every
// node (on demand: on the nodes that realise them), and how many are.
func (b *bench) allReady(ctx context.Context, networkCount int) (bool, string) {
	// On demand, a Network is Ready on the nodes that realise it: none
	// before the pods come.
	want := fmt.Sprintf("%d/%d", len(b.agents), len(b.agents))
	if b.perNode > 0 {
		want = "any"
	}
	list, err := b.nets.List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	ready := 0
	for _, n := range list.Items {
		if n.Status.Nodes != nil && (b.perNode > 0 || n.Status.Nodes.Summary == want) && len(n.Status.Conditions) > 0 && n.Status.Conditions[0].Status == metav1.ConditionTrue {
			ready++
		}
	}
	return ready == networkCount, fmt.Sprintf("%d of %d Ready on %s", ready, networkCount, want)
}

// waitAllReady waits until allReady, printing its progress since began.
func (b *bench) waitAllReady(ctx context.Context, networkCount int, began time.Time) error {
	var last string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Minute, true, func(context.Context) (bool, error) {
		ok, msg := b.allReady(ctx, networkCount)
		if msg != last {
			fmt.Fprintf(os.Stderr, "%5.0fs %s\n", time.Since(began).Seconds(), msg)
			last = msg
		}
		return ok, nil
	}); err != nil {
		return fmt.Errorf("not all Ready: %s", last)
	}
	return nil
}

// placePods gives each node its pod on --per-node Networks (place).
func (b *bench) placePods(ctx context.Context, res *result) error {
	list, err := b.nets.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	byName := map[string]types.UID{}
	for _, n := range list.Items {
		byName[n.Name] = n.UID
	}
	return place(ctx, b.kube, b.names, b.netnss, b.underlay, b.perNode, byName, res)
}

// quiet waits until the agents converge, when no agent writes for a few
// seconds (their last report may still be on its way), and returns each
// agent's API writes and requests so far.
func (b *bench) quiet() (writes, requests []float64) {
	prev := -1.0
	for {
		writes, requests = nil, nil
		total := 0.0
		for _, a := range b.agents {
			w := a.Metric("netop_api_writes_total")
			writes = append(writes, w)
			requests = append(requests, a.Metric("netop_api_requests_total"))
			total += w
		}
		if total == prev {
			return writes, requests
		}
		prev = total
		time.Sleep(5 * time.Second)
	}
}

// measureAgents records, once converged, what the agents and the
// controller wrote and cost; then the agents' writes in a quiet minute,
// and from a restart of every agent to converged again.
func (b *bench) measureAgents(ctx context.Context, networkCount int, res *result) error {
	startWrites, startRequests := b.quiet()
	res.StartWrites, res.StartRequests = statOf(startWrites), statOf(startRequests)
	res.ControllerWrites = b.controller.Metric("netop_api_writes_total")
	res.ControllerCPUS, res.ControllerRSSMiB = b.controller.Usage()
	var cpus, rss []float64
	for _, a := range b.agents {
		c, r := a.Usage()
		cpus, rss = append(cpus, c), append(rss, r)
	}
	res.AgentCPUS, res.AgentRSSMiB = statOf(cpus), statOf(rss)

	fmt.Fprintln(os.Stderr, "converged; a quiet minute")
	time.Sleep(time.Minute)
	steadyWrites, steadyRequests := b.quiet()
	res.SteadyWrites = statOf(diff(steadyWrites, startWrites))
	res.SteadyRequests = statOf(diff(steadyRequests, startRequests))

	fmt.Fprintln(os.Stderr, "restarting every agent")
	for i, a := range b.agents {
		a.Stop()
		var err error
		if b.agents[i], err = b.startAgent(i); err != nil {
			return err
		}
	}
	if err := b.waitReady(ctx, b.agents); err != nil {
		return fmt.Errorf("agents not ready after the restart: %w", err)
	}
	restartWrites, restartRequests := b.quiet()
	res.RestartWrites, res.RestartRequests = statOf(restartWrites), statOf(restartRequests)
	if ok, msg := b.allReady(ctx, networkCount); !ok {
		return fmt.Errorf("after the restart: %s", msg)
	}
	return nil
}

// print prints the result as a table and a JSON line.
func (res result) print() {
	fmt.Printf("%d agents, %d Networks, %d CPUs, %s\n", res.Agents, res.Networks, res.CPUs, res.Date)
	fmt.Printf("%-44s %10s %10s\n", "", "mean", "max")
	row := func(name string, s stat) { fmt.Printf("%-44s %10.1f %10.1f\n", name, s.Mean, s.Max) }
	fmt.Printf("%-44s %10.1f\n", "all Ready on all nodes (s)", res.AllReadyS)
	fmt.Printf("%-44s %10d\n", "creates retried (admission timed out)", res.CreateRetries)
	row("agent API requests, start to converged", res.StartRequests)
	row("agent API writes, start to converged", res.StartWrites)
	row("agent API requests, quiet minute", res.SteadyRequests)
	row("agent API writes, quiet minute", res.SteadyWrites)
	row("agent API requests, restart to converged", res.RestartRequests)
	row("agent API writes, restart to converged", res.RestartWrites)
	row("agent CPU (s) to converged", res.AgentCPUS)
	row("agent RSS (MiB)", res.AgentRSSMiB)
	fmt.Printf("%-44s %10.1f\n", "controller API writes", res.ControllerWrites)
	fmt.Printf("%-44s %10.1f\n", "controller CPU (s)", res.ControllerCPUS)
	fmt.Printf("%-44s %10.1f\n", "controller RSS (MiB)", res.ControllerRSSMiB)
	if res.PerNode > 0 {
		fmt.Printf("%-44s %10.1f\n", fmt.Sprintf("%d Networks per node usable (s)", res.PerNode), res.PlacedS)
		row("links per node", res.Links)
		row("VXLAN devices per node", res.VXLANDevices)
		row("flooding entries per node", res.FloodEntries)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

func diff(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}
