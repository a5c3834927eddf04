// Command bench measures netop as a whole: a real control plane, the
// operator with the linux backend in a throwaway network namespace, and N
// Networks created at once, timed until every one is Ready. In the same run
// it measures two reference points: the floor (the same creates and one
// status write per Network from a bare client-go loop, the least any
// controller could do) and the tutorial controller's defaults (client-go's
// 5 QPS / 10 burst, 2 workers, finalizer added by the controller). With
// --restart it also restarts the controller over N Ready Networks.
//
// --networks takes several N (--networks 1000,4000,10000): each N is
// measured in turn, netop and the floor side by side, so that the cost per
// Network can be compared across N from one run.
//
// --plot-dir DIR draws the ratio to the floor against N and the Networks
// Ready over time at the last N as SVG files in DIR (BENCHMARKS.md's are in
// docs/benchmarks).
//
// Run it as root: go run ./test/bench --networks 100
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/standalone/controlplane"
	"github.com/netop-dev/netop/internal/testing/gobuild"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
	"github.com/netop-dev/netop/test/bench/benchplot"
	"github.com/netop-dev/netop/test/bench/benchproc"
)

type config struct {
	// networks are the N measured, in order; the restart and the tutorial
	// use the largest and the first.
	networks                         []int
	concurrency, workers, burst      int
	qps                              float32
	tutorialNetworks                 int
	skipFloor, skipTutorial, restart bool
	profileDir                       string
	// contentType is netop's --kube-api-content-type; "" is its default.
	contentType string
}

func main() {
	var c config
	networks := flag.String("networks", "2000", "Networks to create at once; a comma-separated list measures each N in turn")
	flag.IntVar(&c.concurrency, "concurrency", 64, "creates in flight at once")
	flag.IntVar(&c.workers, "workers", 4, "controller workers (and the floor's status writers)")
	qps := flag.Float64("qps", 100, "controller client QPS (and the floor's)")
	flag.IntVar(&c.burst, "burst", 200, "controller client burst (and the floor's)")
	flag.IntVar(&c.tutorialNetworks, "tutorial-networks", 0, "Networks for the tutorial reference (default --networks)")
	flag.BoolVar(&c.skipFloor, "skip-floor", false, "skip the floor reference")
	flag.BoolVar(&c.skipTutorial, "skip-tutorial", false, "skip the tutorial reference")
	flag.BoolVar(&c.restart, "restart", false, "also restart the controller over the Ready Networks")
	flag.StringVar(&c.contentType, "kube-api-content-type", "", "netop's --kube-api-content-type (encoding of built-in resources: Events here); default: netop's")
	flag.StringVar(&c.profileDir, "profile-dir", "", "write netop's CPU profile (creates to all Ready) and allocation profile here (go tool pprof DIR/cpu.pprof)")
	plots := benchplot.Flags(flag.CommandLine)
	flag.Parse()
	c.qps = float32(*qps)
	for _, f := range strings.Split(*networks, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n > 256*256 {
			fmt.Fprintf(os.Stderr, "bench: --networks: %q is not a number of Networks from 1 to 65536\n", f)
			os.Exit(2)
		}
		c.networks = append(c.networks, n)
	}
	if c.tutorialNetworks == 0 {
		c.tutorialNetworks = c.networks[0]
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: run as root: the controller makes real Linux bridges in a throwaway network namespace")
		os.Exit(2)
	}
	if c.profileDir != "" {
		// Made now: the profiles are written after the largest N's run.
		if err := os.MkdirAll(c.profileDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bench: --profile-dir:", err)
			os.Exit(2)
		}
	}
	if err := run(c, plots); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// result is one measured run.
type result struct {
	name          string
	networks      int
	seconds       float64
	createSeconds float64 // start to the last create answered
	p50, p99      float64
	// readyAfter is, for each Network, the seconds from the first create
	// to it Ready, in no order.
	readyAfter []float64
	writes     map[string]float64 // "verb resource" → count
	cpuSeconds float64
	// cpuSystemSeconds is the kernel's share of cpuSeconds (netlink: the
	// bridges themselves).
	cpuSystemSeconds float64
	peakRSSMiB       float64
	eventsDropped    float64
	// webhookRejected: admission reviews answered 429 (the API server
	// retries them within the webhook's timeout).
	webhookRejected float64
	backendChanges  float64
	// apiBytes are the bytes of API bodies, "direction encoding" → bytes
	// (netop_api_bytes_total).
	apiBytes map[string]float64
	// conversions are the conversion webhook calls the API server made
	// for Networks during the run, "from → to" → calls (its own metric).
	conversions    map[string]float64
	syncedSeconds  float64 // restart: start to caches synced
	settledSeconds float64 // restart: caches synced to first resync done
	// restart, as the controller measured them from its start: the initial
	// list of Networks, and caches synced after it.
	listSeconds, syncedAfterListSeconds float64
}

func (r result) networkWrites() float64 {
	var n float64
	for k, v := range r.writes {
		if strings.HasSuffix(k, " networks") || strings.Contains(k, " networks/") {
			n += v
		}
	}
	return n
}

func (r result) eventWrites() float64 {
	var n float64
	for k, v := range r.writes {
		if strings.HasSuffix(k, " events") {
			n += v
		}
	}
	return n
}

type bench struct {
	// netopBinary is cmd/netop, built for the run: the controller is
	// measured as it ships, a client-go-only process of its own.
	netopBinary string
	cfg         config
	cp          *controlplane.ControlPlane
	dir         string
	admin       *rest.Config
	netop       versioned.Interface
	kube        kubernetes.Interface
	// netns prefixes the network namespaces made, netnses.
	netns   string
	netnses []string
	// conversion serves Networks' conversion webhook while no netop with
	// webhooks does: the bench writes v1, the storage version is v2.
	conversion *testenv.ConversionServer
}

func run(c config, plots *benchplot.Output) error {
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(io.Discard))))
	b, tearDown, err := setUp(ctx, c)
	if err != nil {
		return err
	}
	defer tearDown()
	var steps []step
	largest := slices.Max(c.networks)
	for k, n := range c.networks {
		st, err := b.measureStep(ctx, k, n, n == largest)
		if err != nil {
			return err
		}
		steps = append(steps, st)
	}
	tutorial, err := b.measureTutorial(ctx)
	if err != nil {
		return err
	}
	report(c, steps, tutorial)
	return drawNetworks(plots, c, steps)
}

// setUp builds netop, starts a control plane with netop's CRDs, the
// bench's conversion webhook and the namespaces every step shares, and
// returns the bench on it; tearDown undoes it, last first.
func setUp(ctx context.Context, c config) (b *bench, tearDown func(), err error) {
	undo := &benchproc.Cleanup{}
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	dir, err := os.MkdirTemp("", "netop-bench-")
	if err != nil {
		return nil, nil, err
	}
	undo.Add(func() { _ = os.RemoveAll(dir) })
	netopBinary := filepath.Join(dir, "netop")
	if err := gobuild.Command(netopBinary, "github.com/netop-dev/netop/cmd/netop"); err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(os.Stderr, "starting a control plane in %s\n", dir)
	cp, err := controlplane.Start(ctx, controlplane.Config{DataDir: dir})
	if err != nil {
		return nil, nil, err
	}
	undo.Add(cp.Stop)
	admin := cp.AdminConfig()
	admin.QPS, admin.Burst = 5000, 10000
	if err := install.CRDs(ctx, admin); err != nil {
		return nil, nil, err
	}
	conversion, err := testenv.ServeConversion(ctx, admin)
	if err != nil {
		return nil, nil, err
	}
	undo.Add(conversion.Close)
	b = &bench{netopBinary: netopBinary, cfg: c, cp: cp, dir: dir, admin: admin,
		netop: versioned.NewForConfigOrDie(admin), kube: kubernetes.NewForConfigOrDie(admin),
		netns: fmt.Sprintf("netop-bench-%d", os.Getpid()), conversion: conversion}
	undo.Add(b.deleteNetnses)
	for _, ns := range []string{"tutorial", "netop-system"} {
		if err := install.Namespace(ctx, admin, ns); err != nil {
			return nil, nil, err
		}
	}
	return b, undo.Run, nil
}

// deleteNetnses removes the network namespaces the controllers built in.
func (b *bench) deleteNetnses() {
	for _, ns := range b.netnses {
		// The bridges first, in one batch, waited for: left to the
		// namespace's end, the kernel tears them down after this
		// process is gone, holding the RTNL lock for minutes at
		// N=10000, and the next run's controller waits for it.
		if out, err := exec.Command("ip", "-n", ns, "link", "delete", "group", strconv.Itoa(linux.BridgeGroup)).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "deleting the bridges in %s: %v: %s\n", ns, err, out)
		}
		_ = nettest.DeleteNetns(ns)
	}
}

// measureStep measures the k-th N, n Networks: netop, then (on the
// largest N, with --restart) netop restarted over them, then the floor.
func (b *bench) measureStep(ctx context.Context, k, n int, largest bool) (step, error) {
	c := b.cfg
	st := step{networks: n}
	ours, floor := fmt.Sprintf("ours-%d", k), fmt.Sprintf("floor-%d", k)
	for _, ns := range []string{ours, floor} {
		if err := install.Namespace(ctx, b.admin, ns); err != nil {
			return st, err
		}
	}
	// Each N has its own namespaces, network namespace and cidrs, and
	// the Networks of the step before are gone from the API (their
	// finalizers removed, their bridges left in place in their own
	// network namespace: deleting them would hold the kernel's lock
	// for minutes): the controller (of every namespace, as its
	// webhooks require) sees exactly N Networks.
	args := controllerArgs{
		workers: c.workers, qps: c.qps, burst: c.burst, webhooks: true, netns: fmt.Sprintf("%s-%d", b.netns, k),
		profiling: c.profileDir != "" && largest, contentType: c.contentType,
		restartNext: c.restart && largest,
	}
	var err error
	if args.restartNext {
		if args.webhookAddr, err = freeAddr(); err != nil {
			return st, err
		}
	}
	b.netnses = append(b.netnses, args.netns)
	fmt.Fprintf(os.Stderr, "netop: %d Networks\n", n)
	if st.ours, err = b.measure(ctx, "netop", ours, n, 10+k, args); err != nil {
		return st, fmt.Errorf("netop, %d Networks: %w", n, err)
	}
	if args.restartNext {
		fmt.Fprintf(os.Stderr, "restart over %d Ready Networks\n", n)
		args.profiling, args.restartNext = false, false
		if st.restart, err = b.restartRun(ctx, n, args); err != nil {
			return st, fmt.Errorf("restart: %w", err)
		}
	}
	if err := b.removeWebhooks(ctx, floor); err != nil {
		return st, err
	}
	if err := b.purge(ctx, ours); err != nil {
		return st, err
	}
	// The floor runs after netop, whose configurations it must not
	// meet, with netop stopped.
	if !c.skipFloor {
		fmt.Fprintf(os.Stderr, "floor: %d creates and status writes\n", n)
		if st.floor, err = b.floor(ctx, floor, n, 100+k); err != nil {
			return st, fmt.Errorf("floor, %d Networks: %w", n, err)
		}
		if err := b.purge(ctx, floor); err != nil {
			return st, err
		}
	}
	return st, nil
}

// measureTutorial measures the tutorial controller's defaults, unless
// --skip-tutorial (nil then).
func (b *bench) measureTutorial(ctx context.Context) (*result, error) {
	c := b.cfg
	if c.skipTutorial {
		return nil, nil
	}
	fmt.Fprintf(os.Stderr, "tutorial: %d Networks at 5 QPS / 10 burst, 2 workers\n", c.tutorialNetworks)
	args := controllerArgs{workers: 2, qps: 5, burst: 10, webhooks: false, netns: b.netns + "-t", namespace: "tutorial"}
	b.netnses = append(b.netnses, args.netns)
	tutorial, err := b.measure(ctx, "tutorial", "tutorial", c.tutorialNetworks, 172, args)
	if err != nil {
		return nil, fmt.Errorf("tutorial: %w", err)
	}
	return tutorial, nil
}

// step is what was measured at one N.
type step struct {
	networks             int
	ours, floor, restart *result
}

// purge removes every Network of namespace from the API, with no
// controller running: their finalizers dropped, then deleted, in v2, the
// storage version, so that no request waits for a conversion (a
// DeleteCollection in v1 of 10000 Networks outlasted the API server's
// request timeout once each deletion needed one).
func (b *bench) purge(ctx context.Context, namespace string) error {
	nets := b.netop.SamplecrdV2().Networks(namespace)
	list, err := nets.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	work := make(chan string)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range b.cfg.concurrency {
		wg.Go(func() {
			for name := range work {
				_, err := nets.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				if err == nil {
					err = nets.Delete(ctx, name, metav1.DeleteOptions{})
				}
				if err != nil && !apierrors.IsNotFound(err) {
					failed.Add(1)
				}
			}
		})
	}
	for _, n := range list.Items {
		work <- n.Name
	}
	close(work)
	wg.Wait()
	if failed.Load() > 0 {
		return fmt.Errorf("%d Networks of %s could not be removed", failed.Load(), namespace)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := nets.List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(list.Items) == 0, nil
	})
}

// removeWebhooks deletes the configurations netop registered, which would
// refuse every create once its server is gone, and waits until a create in
// namespace no longer calls them (the API server learns of the deletion
// through a watch).
func (b *bench) removeWebhooks(ctx context.Context, namespace string) error {
	_ = b.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, admission.WebhookConfigurationName, metav1.DeleteOptions{})
	_ = b.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, admission.WebhookConfigurationName, metav1.DeleteOptions{})
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := b.netop.SamplecrdV1().Networks(namespace).Create(ctx, &samplecrdv1.Network{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec:       samplecrdv1.NetworkSpec{CIDR: "10.255.255.0/24"},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	}); err != nil {
		return errors.New("netop's webhooks were still called after their configurations were deleted")
	}
	return nil
}

// cidr gives Network i of a run its own /24 under first.
func cidr(first, i int) string {
	return fmt.Sprintf("%d.%d.%d.0/24", first, i/256, i%256)
}

// create makes n Networks in namespace with c.concurrency creates in
// flight and returns when each create was sent.
func (b *bench) create(ctx context.Context, namespace string, first, n int, created func(*samplecrdv1.Network)) (map[string]time.Time, error) {
	sent := make(map[string]time.Time, n)
	var mu sync.Mutex
	var firstErr error
	work := make(chan int)
	var wg sync.WaitGroup
	for range b.cfg.concurrency {
		wg.Go(func() {
			for i := range work {
				name := fmt.Sprintf("n%05d", i)
				start := time.Now()
				mu.Lock()
				sent[name] = start
				mu.Unlock()
				obj, err := b.netop.SamplecrdV1().Networks(namespace).Create(ctx, &samplecrdv1.Network{
					ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec:       samplecrdv1.NetworkSpec{CIDR: cidr(first, i)},
				}, metav1.CreateOptions{})
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("creating %s: %w", name, err)
					}
					mu.Unlock()
					continue
				}
				if created != nil {
					created(obj)
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return sent, firstErr
}

// floor creates n Networks in namespace and writes one status each with a
// bare client at the controller's rate limits and concurrency.
func (b *bench) floor(ctx context.Context, namespace string, n, first int) (*result, error) {
	limited := rest.CopyConfig(b.admin)
	limited.QPS, limited.Burst = b.cfg.qps, b.cfg.burst
	client := versioned.NewForConfigOrDie(limited)
	objs := make(chan *samplecrdv1.Network, n)
	done := make(map[string]time.Time, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var writeErr error
	for range b.cfg.workers {
		wg.Go(func() {
			for n := range objs {
				n.Status.ObservedGeneration = n.Generation
				meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: samplecrd.ConditionReady, Status: metav1.ConditionTrue, Reason: samplecrd.ReasonProvisioned, Message: "floor"})
				_, err := client.SamplecrdV1().Networks(n.Namespace).UpdateStatus(ctx, n, metav1.UpdateOptions{})
				mu.Lock()
				if err != nil && writeErr == nil {
					writeErr = err
				}
				done[n.Name] = time.Now()
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	sent, err := b.create(ctx, namespace, first, n, func(n *samplecrdv1.Network) { objs <- n })
	created := time.Since(start).Seconds()
	close(objs)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if writeErr != nil {
		return nil, writeErr
	}
	r := &result{name: "floor", networks: n, createSeconds: created, writes: map[string]float64{"put networks/status": float64(len(done))}}
	r.timing(start, sent, done)
	return r, nil
}

// timing sets r's time from start to the last Network Ready, each
// Network's, and the p50 and p99 from its create sent to it Ready.
func (r *result) timing(start time.Time, sent, ready map[string]time.Time) {
	var lat []float64
	last := start
	for name, at := range ready {
		if at.After(last) {
			last = at
		}
		lat = append(lat, at.Sub(sent[name]).Seconds())
		r.readyAfter = append(r.readyAfter, at.Sub(start).Seconds())
	}
	sort.Float64s(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	r.seconds, r.p50, r.p99 = last.Sub(start).Seconds(), pct(0.50), pct(0.99)
}

// controllerArgs configure a controller child process.
type controllerArgs struct {
	workers, burst   int
	qps              float32
	webhooks         bool
	netns, namespace string
	// profiling serves pprof on the metrics address.
	profiling   bool
	contentType string
	// restartNext leaves the child's webhook registrations in place when
	// it stops, for the restarted child, which finds them as a restarted
	// pod finds its own (a CA kept in a Secret): giving the conversion
	// webhook back to the bench in between would change the CRD, and the
	// API server would rebuild its storage (every cacher relisted, every
	// v1 object converted again) under the restarted controller.
	restartNext bool
	// webhookAddr is where the child serves its webhooks; empty, any free
	// port. A restarted child serves where the one before it did, as a
	// Service stays where it is, so that its registration is unchanged.
	webhookAddr string
}

type child struct {
	cmd         *exec.Cmd
	metricsAddr string
	// stopped runs once the child is gone.
	stopped func()
}

// freeAddr returns a local address nothing listens on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

func (b *bench) startController(a controllerArgs) (*child, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"run",
		"--kubeconfig=" + b.cp.KubeconfigPath,
		"--workers=" + strconv.Itoa(a.workers),
		"--kube-api-qps=" + strconv.FormatFloat(float64(a.qps), 'f', -1, 32),
		"--kube-api-burst=" + strconv.Itoa(a.burst),
		"--netns=" + a.netns,
		"--namespace=" + a.namespace,
		"--metrics-addr=" + addr,
		"--operator-namespace=netop-system",
		"--initialize-workloads=false",
		"--webhook-addr=0",
	}
	if a.profiling {
		args = append(args, "--profiling")
	}
	if a.contentType != "" {
		args = append(args, "--kube-api-content-type="+a.contentType)
	}
	if a.webhooks {
		webhookAddr := a.webhookAddr
		if webhookAddr == "" {
			webhookAddr = "127.0.0.1:0"
		}
		args = append(args, "--webhook-addr="+webhookAddr, "--webhook-local", "--webhook-cert-dir="+filepath.Join(b.dir, "webhook"))
	}
	cmd := exec.Command(b.netopBinary, args...)
	log, err := os.Create(filepath.Join(os.TempDir(), fmt.Sprintf("netop-bench-controller-%d.log", os.Getpid())))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, metricsAddr: addr}
	if a.webhooks && !a.restartNext {
		// It registered its own conversion webhook, which goes with it.
		c.stopped = func() {
			if err := b.conversion.Register(context.Background()); err != nil {
				fmt.Fprintf(os.Stderr, "registering the bench's conversion webhook again: %v\n", err)
			}
		}
	}
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("controller not ready (log: %s): %w", log.Name(), err)
	}
	return c, nil
}

// stop ends the child and returns its CPU seconds (all, and the kernel's)
// and peak RSS in MiB. The
// peak comes from VmHWM, which exec resets: rusage's maxrss of a forked
// child also counts the parent's image it was forked from.
func (c *child) stop() (cpu, system, rssMiB float64) {
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid)); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
				rssMiB = kb / 1024
			}
		}
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	_ = c.cmd.Wait()
	if c.stopped != nil {
		c.stopped()
	}
	if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		system = time.Duration(ru.Stime.Nano()).Seconds()
	}
	return cpu, system, rssMiB
}

// metrics scrapes the child's counters of interest.
func (c *child) metrics() (map[string]float64, error) {
	families, err := benchproc.Scrape(c.metricsAddr)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range families["netop_api_writes_total"].GetMetric() {
		out[benchproc.Label(m, "verb")+" "+benchproc.Label(m, "resource")] = m.GetCounter().GetValue()
	}
	for _, m := range families["netop_backend_changes_total"].GetMetric() {
		out["backend "+benchproc.Label(m, "action")] += m.GetCounter().GetValue()
	}
	for _, m := range families["netop_backend_operation_duration_seconds"].GetMetric() {
		if benchproc.Label(m, "operation") == backend.OperationList {
			out["backend list"] += float64(m.GetHistogram().GetSampleCount())
		}
	}
	for _, m := range families["netop_webhook_rejected_total"].GetMetric() {
		out["webhook rejected"] += m.GetCounter().GetValue()
	}
	for _, m := range families["netop_api_bytes_total"].GetMetric() {
		out["bytes "+benchproc.Label(m, "direction")+" "+benchproc.Label(m, "encoding")] = m.GetCounter().GetValue()
	}
	for _, m := range families["netop_events_dropped_total"].GetMetric() {
		out["events dropped"] += m.GetCounter().GetValue()
	}
	for _, m := range families["netop_startup_seconds"].GetMetric() {
		out["startup "+benchproc.Label(m, "phase")] = m.GetGauge().GetValue()
	}
	for _, m := range families["netop_workqueue_depth"].GetMetric() {
		if benchproc.Label(m, "name") == "network" {
			out["queue depth"] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}

// watchReady records when each Network of namespace first turns Ready.
func (b *bench) watchReady(ctx context.Context, namespace string) (ready func() map[string]time.Time, stop func(), err error) {
	var mu sync.Mutex
	seen := map[string]time.Time{}
	factory := informers.NewSharedInformerFactoryWithOptions(b.netop, 0, informers.WithNamespace(namespace))
	record := func(obj any) {
		n, ok := obj.(*samplecrdv1.Network)
		if !ok || !meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady) {
			return
		}
		mu.Lock()
		if _, done := seen[n.Name]; !done {
			seen[n.Name] = time.Now()
		}
		mu.Unlock()
	}
	if _, err := factory.Samplecrd().V1().Networks().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: record, UpdateFunc: func(_, n any) { record(n) },
	}); err != nil {
		return nil, nil, err
	}
	stopCh := make(chan struct{})
	factory.Start(stopCh)
	factory.WaitForCacheSync(stopCh)
	return func() map[string]time.Time {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(seen)
		}, func() {
			close(stopCh)
			factory.Shutdown()
		}, nil
}

// measure runs a controller, creates n Networks and waits until all are
// Ready.
func (b *bench) measure(ctx context.Context, name, namespace string, n, first int, a controllerArgs) (*result, error) {
	ready, stopWatch, err := b.watchReady(ctx, namespace)
	if err != nil {
		return nil, err
	}
	defer stopWatch()
	c, err := b.startController(a)
	if err != nil {
		return nil, err
	}
	if a.webhooks {
		if err := b.waitWebhooks(ctx, namespace); err != nil {
			c.stop()
			return nil, err
		}
	}
	conversionsBefore, err := b.conversions(ctx)
	if err != nil {
		c.stop()
		return nil, err
	}
	start := time.Now()
	profiled := make(chan error, 1)
	if a.profiling {
		// The CPU profile covers the creates and the convergence: at the
		// QPS limit that is about n/qps seconds.
		go func() {
			profiled <- benchproc.SaveProfile(c.metricsAddr, "profile?seconds="+strconv.Itoa(int(float64(n)/float64(a.qps))+3), filepath.Join(b.cfg.profileDir, "cpu.pprof"))
		}()
	}
	sent, err := b.create(ctx, namespace, first, n, nil)
	if err != nil {
		c.stop()
		return nil, err
	}
	created := time.Since(start).Seconds()
	deadline := time.Duration(float64(n)*3/float64(a.qps)*float64(time.Second)) + 2*time.Minute
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, deadline, true, func(context.Context) (bool, error) {
		return len(ready()) >= n, nil
	})
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("%d of %d Networks Ready within %v", len(ready()), n, deadline)
	}
	r := &result{name: name, networks: n, createSeconds: created}
	r.timing(start, sent, ready())
	if a.profiling {
		err := errors.Join(<-profiled, benchproc.SaveProfile(c.metricsAddr, "allocs", filepath.Join(b.cfg.profileDir, "allocs.pprof")))
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("profiling: %w", err)
		}
	}
	r.record(ctx, c)
	conversions, err := b.conversions(ctx)
	if err != nil {
		return nil, err
	}
	r.conversions = map[string]float64{}
	for k, v := range conversions {
		if d := v - conversionsBefore[k]; d > 0 {
			r.conversions[k] = d
		}
	}
	return r, nil
}

// conversions are the conversion webhook calls the API server made for
// Networks so far, "from → to" → calls.
func (b *bench) conversions(ctx context.Context) (map[string]float64, error) {
	families, err := benchproc.APIServerMetrics(ctx, b.kube)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range families["apiserver_crd_conversion_webhook_duration_seconds"].GetMetric() {
		if benchproc.Label(m, "crd_name") == "networks.samplecrd.k8s.io" {
			out[benchproc.Label(m, "from_version")+" → "+benchproc.Label(m, "to_version")] += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out, nil
}

// record counts, once the child's counters stop moving (the last status
// writes and Events land after the last Ready), its writes and backend
// changes, then stops it for its CPU time and peak RSS.
func (r *result) record(ctx context.Context, c *child) {
	var m map[string]float64
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		prev := m
		next, err := c.metrics()
		if err != nil {
			return false, nil
		}
		m = next
		return prev != nil && fmt.Sprint(prev) == fmt.Sprint(m), nil
	})
	r.writes, r.apiBytes = map[string]float64{}, map[string]float64{}
	for k, v := range m {
		if b, ok := strings.CutPrefix(k, "bytes "); ok {
			r.apiBytes[b] = v
			continue
		}
		if !strings.HasPrefix(k, "backend ") && !strings.HasPrefix(k, "startup ") && k != "queue depth" && k != "events dropped" && k != "webhook rejected" {
			r.writes[k] = v
		}
	}
	r.backendChanges = m["backend Created"] + m["backend Updated"] + m["backend Deleted"] + m["backend Swept"]
	r.eventsDropped = m["events dropped"]
	r.webhookRejected = m["webhook rejected"]
	r.cpuSeconds, r.cpuSystemSeconds, r.peakRSSMiB = c.stop()
}

// waitWebhooks waits until the webhooks answer: a Network only they refuse
// is refused.
func (b *bench) waitWebhooks(ctx context.Context, namespace string) error {
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := b.netop.SamplecrdV1().Networks(namespace).Create(ctx, &samplecrdv1.Network{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec:       samplecrdv1.NetworkSpec{CIDR: "10.255.255.0/24", Gateway: "10.255.255.0"},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "admission webhook"), nil
	})
}

// restartRun restarts the controller over the Ready Networks and measures
// how long it takes to be synced and to finish its first resync, and what
// it writes and changes meanwhile.
func (b *bench) restartRun(ctx context.Context, n int, a controllerArgs) (*result, error) {
	start := time.Now()
	c, err := b.startController(a)
	if err != nil {
		return nil, err
	}
	r := &result{name: "restart", networks: n, syncedSeconds: time.Since(start).Seconds()}
	synced := time.Now()
	var m map[string]float64
	err = wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		m, err = c.metrics()
		return err == nil && m["backend list"] >= 1 && m["queue depth"] == 0, nil
	})
	if err != nil {
		c.stop()
		return nil, errors.New("the first resync never finished")
	}
	r.settledSeconds = time.Since(synced).Seconds()
	r.listSeconds = m["startup networks_listed"]
	r.syncedAfterListSeconds = m["startup caches_synced"] - m["startup networks_listed"]
	r.record(ctx, c)
	return r, nil
}

// perNetwork divides each value by n.
func perNetwork(values map[string]float64, n int) map[string]float64 {
	out := make(map[string]float64, len(values))
	for k, v := range values {
		out[k] = v / float64(n)
	}
	return out
}

func report(c config, steps []step, tutorial *result) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(w, "run\tnetworks\tseconds\tcreates s\tnetworks/s\tp50 s\tp99 s\tnetwork writes/net\tevent writes/net\tevents dropped\tCPU s\tCPU ms/net\tkernel ms/net\tpeak RSS MiB\t")
	row := func(r *result) {
		if r == nil {
			return
		}
		perNet := func(v float64) float64 { return v / float64(r.networks) }
		_, _ = fmt.Fprintf(w, "%s\t%d\t%.2f\t%.2f\t%.1f\t%.3f\t%.3f\t%.3f\t%.3f\t%.0f\t%.2f\t%.3f\t%.3f\t%.1f\t\n", r.name, r.networks, r.seconds, r.createSeconds, float64(r.networks)/r.seconds,
			r.p50, r.p99, perNet(r.networkWrites()), perNet(r.eventWrites()), r.eventsDropped, r.cpuSeconds, 1000*perNet(r.cpuSeconds), 1000*perNet(r.cpuSystemSeconds), r.peakRSSMiB)
	}
	for _, st := range steps {
		row(st.floor)
		row(st.ours)
	}
	row(tutorial)
	_ = w.Flush()
	for _, st := range steps {
		ours := st.ours
		fmt.Printf("\nnetop's API writes at N=%d by verb and resource:\n", st.networks)
		for _, k := range slices.Sorted(maps.Keys(ours.writes)) {
			fmt.Printf("  %-28s %8.0f  (%.3f per Network)\n", k, ours.writes[k], ours.writes[k]/float64(ours.networks))
		}
		fmt.Printf("the API server's conversion webhook calls at N=%d, creates to converged:\n", st.networks)
		for _, k := range slices.Sorted(maps.Keys(ours.conversions)) {
			fmt.Printf("  %-28s %8.0f  (%.3f per Network)\n", k, ours.conversions[k], ours.conversions[k]/float64(ours.networks))
		}
		fmt.Printf("netop's API bytes at N=%d by direction and encoding:\n", st.networks)
		for _, k := range slices.Sorted(maps.Keys(ours.apiBytes)) {
			fmt.Printf("  %-28s %12.0f  (%.0f per Network)\n", k, ours.apiBytes[k], ours.apiBytes[k]/float64(ours.networks))
		}
		if r := st.restart; r != nil {
			fmt.Printf("restart over %d Ready Networks: synced %.3f s after start (the initial list took %.3f s, synced %.3f s after it), first resync done %.3f s later, %.0f API writes, %.0f backend changes\n",
				r.networks, r.syncedSeconds, r.listSeconds, r.syncedAfterListSeconds, r.settledSeconds, r.networkWrites()+r.eventWrites(), r.backendChanges)
		}
	}
	if len(steps) > 1 {
		first, last := steps[0].ours, steps[len(steps)-1].ours
		perNet := func(r *result) float64 { return r.cpuSeconds / float64(r.networks) }
		fmt.Printf("\ncontroller CPU per Network: %.3f ms at N=%d, %.3f ms at N=%d: %.2fx\n",
			1000*perNet(first), first.networks, 1000*perNet(last), last.networks, perNet(last)/perNet(first))
	}
	fmt.Println()
	for _, st := range steps {
		ours := st.ours
		out := map[string]any{
			"networks":                             ours.networks,
			"seconds":                              ours.seconds,
			"create_seconds":                       ours.createSeconds,
			"networks_per_second":                  float64(ours.networks) / ours.seconds,
			"p50_seconds":                          ours.p50,
			"p99_seconds":                          ours.p99,
			"writes_per_network":                   ours.networkWrites() / float64(ours.networks),
			"event_writes_per_network":             ours.eventWrites() / float64(ours.networks),
			"events_dropped":                       ours.eventsDropped,
			"webhook_rejected":                     ours.webhookRejected,
			"controller_cpu_seconds":               ours.cpuSeconds,
			"controller_cpu_ms_per_network":        1000 * ours.cpuSeconds / float64(ours.networks),
			"controller_kernel_cpu_ms_per_network": 1000 * ours.cpuSystemSeconds / float64(ours.networks),
			"controller_peak_rss_mib":              ours.peakRSSMiB,
			"workers":                              c.workers,
			"qps":                                  c.qps,
			"burst":                                c.burst,
			"api_bytes_per_network":                perNetwork(ours.apiBytes, ours.networks),
			"conversions_per_network":              perNetwork(ours.conversions, ours.networks),
		}
		if floor := st.floor; floor != nil {
			out["floor_seconds"] = floor.seconds
			out["floor_create_seconds"] = floor.createSeconds
			out["ratio_to_floor"] = ours.seconds / floor.seconds
		}
		if tutorial != nil && ours.networks == tutorial.networks {
			out["tutorial_networks"] = tutorial.networks
			out["tutorial_seconds"] = tutorial.seconds
			// Per Network, so that a tutorial run on fewer Networks compares.
			out["speedup_vs_tutorial"] = (tutorial.seconds / float64(tutorial.networks)) / (ours.seconds / float64(ours.networks))
		}
		if restart := st.restart; restart != nil {
			out["restart_synced_seconds"] = restart.syncedSeconds
			out["restart_list_seconds"] = restart.listSeconds
			out["restart_synced_after_list_seconds"] = restart.syncedAfterListSeconds
			out["restart_first_resync_seconds"] = restart.settledSeconds
			out["restart_writes"] = restart.networkWrites() + restart.eventWrites()
			out["restart_backend_changes"] = restart.backendChanges
		}
		line, _ := json.Marshal(out)
		fmt.Println(string(line))
	}
}

// drawNetworks draws netop's time to all Ready over the floor's at each N
// (with the floor), and the Networks Ready over time at the last N,
// netop's and the floor's.
func drawNetworks(plots *benchplot.Output, c config, steps []step) error {
	var ns []string
	for _, n := range c.networks {
		ns = append(ns, strconv.Itoa(n))
	}
	conditions := fmt.Sprintf("N = %s; netop %d workers, %g QPS / %d burst; %d creates in flight, v1 clients, v2 served",
		strings.Join(ns, ", "), c.workers, c.qps, c.burst, c.concurrency)
	if !c.skipFloor {
		ratio := benchplot.Series{Name: "netop"}
		for _, st := range steps {
			ratio.X = append(ratio.X, float64(st.networks))
			ratio.Y = append(ratio.Y, st.ours.seconds/st.floor.seconds)
		}
		if err := plots.Draw("networks-ratio-to-floor", benchplot.Chart{
			Title:      "Creating N Networks: netop's time to all Ready over the API floor's",
			Conditions: conditions, XLabel: "Networks created at once (N)", YLabel: "netop's time / the floor's",
			Marks: true, Series: []benchplot.Series{ratio}, Goals: []benchplot.Goal{{Name: "goal: at most 1.05", Y: 1.05}},
		}); err != nil {
			return err
		}
	}
	last := steps[len(steps)-1]
	series := []benchplot.Series{benchplot.Cumulative("netop", last.ours.readyAfter, float64(last.networks))}
	if last.floor != nil {
		series = append(series, benchplot.Cumulative("floor (bare client: create, one status write)", last.floor.readyAfter, float64(last.networks)))
	}
	return plots.Draw("networks-ready-over-time", benchplot.Chart{
		Title:      fmt.Sprintf("Creating %d Networks: Networks Ready over time", last.networks),
		Conditions: conditions, XLabel: "seconds from the first create", YLabel: "Networks Ready",
		Series: series,
	})
}
