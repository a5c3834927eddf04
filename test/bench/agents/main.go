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
	dir, err := os.MkdirTemp("", "netop-bench-agents-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binary := filepath.Join(dir, "netop")
	if err := gobuild.Command(binary, "github.com/netop-dev/netop/cmd/netop"); err != nil {
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Config{DataDir: dir})
	if err != nil {
		return err
	}
	defer cp.Stop()
	cfg := cp.AdminConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	if err := install.CRDs(ctx, cfg); err != nil {
		return err
	}
	// The bench writes v1, the storage version is v2: conversion until the
	// controller serves it.
	conversion, err := testenv.ServeConversion(ctx, cfg)
	if err != nil {
		return err
	}
	defer conversion.Close()
	if err := install.Namespace(ctx, cfg, "netop-system"); err != nil {
		return err
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV1().Networks("default")

	// The nodes: a namespace each on an underlay, and a Node object with
	// its address.
	names := make([]string, agentCount)
	netnss := make([]string, agentCount)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%d", i+1)
		netnss[i] = fmt.Sprintf("netop-bench-%d", i+1)
	}
	underlay, err := node.NewUnderlay("netop-bench", netip.MustParsePrefix("10.253.0.0/24"), netnss)
	if err != nil {
		return err
	}
	defer func() {
		underlay.Remove()
		for _, ns := range netnss {
			_ = exec.Command("ip", "netns", "delete", ns).Run()
		}
	}()
	for i, name := range names {
		if err := testenv.RegisterNode(ctx, kube, name, underlay.Nodes[i].Address.String()); err != nil {
			return err
		}
	}

	controllerAddr := benchproc.FreePort()
	controller, err := benchproc.Start([]string{binary, "controller", "--kubeconfig", cp.KubeconfigPath, "--leader-elect=false",
		"--webhook-addr", "127.0.0.1:0", "--webhook-local", "--webhook-cert-dir", filepath.Join(dir, "webhook"),
		"--operator-namespace", "netop-system", "--metrics-addr", controllerAddr, "--profiling"}, controllerAddr, filepath.Join(dir, "controller.log"))
	if err != nil {
		return err
	}
	defer controller.Stop()
	startAgent := func(i int) (*benchproc.Proc, error) {
		addr := benchproc.FreePort()
		return benchproc.Start([]string{binary, "agent", "--kubeconfig", cp.KubeconfigPath, "--node-name", names[i], "--netns", netnss[i],
			"--metrics-addr", addr, "--profiling", fmt.Sprintf("--networks-on-demand=%t", perNode > 0)}, addr, filepath.Join(dir, names[i]+".log"))
	}
	agents := make([]*benchproc.Proc, agentCount)
	for i := range agents {
		if agents[i], err = startAgent(i); err != nil {
			return err
		}
	}
	defer func() {
		for _, a := range agents {
			a.Stop()
		}
	}()
	waitReady := func(procs []*benchproc.Proc) error {
		return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
			for _, p := range procs {
				if !p.Ready() {
					return false, nil
				}
			}
			return true, nil
		})
	}
	if err := waitReady(append(slices.Clone(agents), controller)); err != nil {
		return fmt.Errorf("netop processes not ready: %w", err)
	}
	fmt.Fprintf(os.Stderr, "%d agents and the controller ready (pprof: controller %s, first agent %s); creating %d Networks\n", agentCount, controller.Metrics, agents[0].Metrics, networkCount)

	res := result{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Agents: agentCount, Networks: networkCount, PerNode: perNode}
	began := time.Now()
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
				_, err := nets.Create(ctx, n, metav1.CreateOptions{})
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
	res.CreateRetries = retries.Load()
	close(errs)
	for err := range errs {
		return fmt.Errorf("creating Networks: %w", err)
	}
	// On demand, a Network is Ready on the nodes that realise it: none
	// before the pods come.
	want := fmt.Sprintf("%d/%d", agentCount, agentCount)
	if perNode > 0 {
		want = "any"
	}
	allReady := func() (bool, string) {
		list, err := nets.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, n := range list.Items {
			if n.Status.Nodes != nil && (perNode > 0 || n.Status.Nodes.Summary == want) && len(n.Status.Conditions) > 0 && n.Status.Conditions[0].Status == metav1.ConditionTrue {
				ready++
			}
		}
		return ready == networkCount, fmt.Sprintf("%d of %d Ready on %s", ready, networkCount, want)
	}
	var last string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Minute, true, func(context.Context) (bool, error) {
		ok, msg := allReady()
		if msg != last {
			fmt.Fprintf(os.Stderr, "%5.0fs %s\n", time.Since(began).Seconds(), msg)
			last = msg
		}
		return ok, nil
	}); err != nil {
		return fmt.Errorf("not all Ready: %s", last)
	}
	res.AllReadyS = time.Since(began).Seconds()
	if perNode > 0 {
		list, err := nets.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		byName := map[string]types.UID{}
		for _, n := range list.Items {
			byName[n.Name] = n.UID
		}
		if err := place(ctx, kube, names, netnss, underlay, perNode, byName, &res); err != nil {
			return err
		}
	}
	// The agents' last report may still be on its way: converged is when
	// no agent writes for a few seconds.
	quiet := func() ([]float64, []float64) {
		var writes, requests []float64
		prev := -1.0
		for {
			writes, requests = nil, nil
			total := 0.0
			for _, a := range agents {
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
	startWrites, startRequests := quiet()
	res.StartWrites, res.StartRequests = statOf(startWrites), statOf(startRequests)
	res.ControllerWrites = controller.Metric("netop_api_writes_total")
	res.ControllerCPUS, res.ControllerRSSMiB = controller.Usage()
	var cpus, rss []float64
	for _, a := range agents {
		c, r := a.Usage()
		cpus, rss = append(cpus, c), append(rss, r)
	}
	res.AgentCPUS, res.AgentRSSMiB = statOf(cpus), statOf(rss)

	fmt.Fprintln(os.Stderr, "converged; a quiet minute")
	time.Sleep(time.Minute)
	steadyWrites, steadyRequests := quiet()
	res.SteadyWrites = statOf(diff(steadyWrites, startWrites))
	res.SteadyRequests = statOf(diff(steadyRequests, startRequests))

	fmt.Fprintln(os.Stderr, "restarting every agent")
	for i, a := range agents {
		a.Stop()
		if agents[i], err = startAgent(i); err != nil {
			return err
		}
	}
	if err := waitReady(agents); err != nil {
		return fmt.Errorf("agents not ready after the restart: %w", err)
	}
	restartWrites, restartRequests := quiet()
	res.RestartWrites, res.RestartRequests = statOf(restartWrites), statOf(restartRequests)
	if ok, msg := allReady(); !ok {
		return fmt.Errorf("after the restart: %s", msg)
	}

	fmt.Printf("%d agents, %d Networks, %d CPUs, %s\n", agentCount, networkCount, res.CPUs, res.Date)
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
	if perNode > 0 {
		fmt.Printf("%-44s %10.1f\n", fmt.Sprintf("%d Networks per node usable (s)", perNode), res.PlacedS)
		row("links per node", res.Links)
		row("VXLAN devices per node", res.VXLANDevices)
		row("flooding entries per node", res.FloodEntries)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	return nil
}

func diff(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}
