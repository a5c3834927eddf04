package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/controller/podnet"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	"github.com/netop-dev/netop/test/bench/benchproc"
)

// driver plays the runtime: it makes pods and their namespaces and runs
// the plugins on them, as containerd would for a kubelet.
type driver struct {
	kube        kubernetes.Interface
	runtime     *libcni.CNIConfig
	namespace   string
	node        string
	operator    *benchproc.Proc
	concurrency int
	// profileDir keeps the bench's CPU profiles, unless empty.
	profileDir string
}

// sandbox is a pod as the runtime sees it.
type sandbox struct {
	pod    *corev1.Pod
	netns  string
	create time.Duration
	add    time.Duration
	// attached is when its ADD succeeded.
	attached time.Time
	ips      []netip.Addr
	err      error
}

func (s *sandbox) rt() *libcni.RuntimeConf {
	id := "peers-" + string(s.pod.UID)
	return &libcni.RuntimeConf{ContainerID: id, NetNS: filepath.Join("/run/netns", s.netns), IfName: "net1", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", s.pod.Namespace}, {"K8S_POD_NAME", s.pod.Name},
		{"K8S_POD_INFRA_CONTAINER_ID", id}, {"K8S_POD_UID", string(s.pod.UID)},
	}}
}

// usage is what the run has cost so far.
type usage struct {
	requests map[string]float64
	// webhooks are the API server's admission webhook calls so far,
	// "webhook OPERATION" → the sum and count of their durations.
	webhooks                 map[string][2]float64
	plugins, bench, operator float64
	// phases are netop's histograms of where an ADD waits, by phase: the
	// sum and count of their samples.
	phases map[string][2]float64
}

// netopPhases are where a netop ADD's time goes, in order, by the
// operator's histogram and the labels of the series counted.
var netopPhases = []struct {
	phase, histogram string
	labels           map[string]string
}{
	{"allocation queue", "netop_workqueue_queue_duration_seconds", map[string]string{"name": podnet.Name}},
	{"allocation", "netop_workqueue_work_duration_seconds", map[string]string{"name": podnet.Name}},
	{"ADD waiting", "netop_cni_add_seconds", map[string]string{"phase": metrics.CNIPhaseAllocation, "result": metrics.ResultSuccess}},
	{"ADD attaching", "netop_cni_add_seconds", map[string]string{"phase": metrics.CNIPhaseAttach, "result": metrics.ResultSuccess}},
}

func (d *driver) usage(ctx context.Context) (usage, error) {
	var u usage
	var err error
	if u.requests, u.webhooks, err = d.requests(ctx); err != nil {
		return u, err
	}
	var children, self syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	u.plugins = seconds(children)
	u.bench = seconds(self)
	u.operator, _ = d.operator.Usage()
	families, err := benchproc.Scrape(d.operator.Metrics)
	if err != nil {
		return u, fmt.Errorf("netop's metrics: %w", err)
	}
	u.phases = map[string][2]float64{}
	for _, p := range netopPhases {
		sum, count := benchproc.Histogram(families, p.histogram, p.labels)
		u.phases[p.phase] = [2]float64{sum, count}
	}
	return u, nil
}

func seconds(r syscall.Rusage) float64 {
	return float64(r.Utime.Sec+r.Stime.Sec) + float64(r.Utime.Usec+r.Stime.Usec)/1e6
}

// requests are the API server's requests so far, "VERB resource" →
// count, and its calls of admission webhooks, "webhook OPERATION" → sum
// and count of their durations.
func (d *driver) requests(ctx context.Context) (map[string]float64, map[string][2]float64, error) {
	families, err := benchproc.APIServerMetrics(ctx, d.kube)
	if err != nil {
		return nil, nil, err
	}
	requests := map[string]float64{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		resource := benchproc.Label(m, "resource")
		if resource == "" {
			continue // /metrics, /readyz, discovery
		}
		if sub := benchproc.Label(m, "subresource"); sub != "" {
			resource += "/" + sub
		}
		requests[benchproc.Label(m, "verb")+" "+resource] += m.GetCounter().GetValue()
	}
	webhooks := map[string][2]float64{}
	for _, m := range families["apiserver_admission_webhook_admission_duration_seconds"].GetMetric() {
		k := benchproc.Label(m, "name") + " " + benchproc.Label(m, "operation")
		h := m.GetHistogram()
		webhooks[k] = [2]float64{webhooks[k][0] + h.GetSampleSum(), webhooks[k][1] + float64(h.GetSampleCount())}
	}
	return requests, webhooks, nil
}

// attach makes n pods named after label and attaches each with conf, at
// most d.concurrency at once, and measures it.
func (d *driver) attach(ctx context.Context, i ipam, s scenario, conf *libcni.NetworkConfigList, label string, n int) (outcome, []*sandbox, error) {
	sandboxes, err := d.sandboxes(i, s, label, n)
	if err != nil {
		return outcome{}, nil, err
	}
	before, err := d.usage(ctx)
	if err != nil {
		return outcome{}, nil, err
	}
	prof, err := startCPUProfile()
	if err != nil {
		return outcome{}, nil, err
	}
	defer pprof.StopCPUProfile() // on the way out early; a no-op after prof.stop
	operatorProfiled := make(chan error, 1)
	if d.profileDir != "" && i.name == "netop" {
		go func() {
			path := filepath.Join(d.profileDir, "operator-"+label+".pprof")
			operatorProfiled <- benchproc.SaveProfile(d.operator.Metrics, "profile?seconds="+strconv.Itoa(operatorProfileSeconds), path)
		}()
	} else {
		operatorProfiled <- nil
	}
	machine, err := benchproc.ReadCPU()
	if err != nil {
		return outcome{}, nil, err
	}
	start := time.Now()
	asDriver(ctx, func(ctx context.Context) { d.attachAll(ctx, sandboxes, conf) })
	elapsed := time.Since(start)
	var steal float64
	if now, err := benchproc.ReadCPU(); err == nil {
		steal = now.StealShare(machine)
	}
	// Read before waiting for the operator's profile, which may outlast
	// the scenario, and before reading the bench's own: neither is the
	// scenario's CPU.
	after, err := d.usage(ctx)
	if err != nil {
		return outcome{}, nil, err
	}
	var profilePath string
	if d.profileDir != "" {
		profilePath = filepath.Join(d.profileDir, fmt.Sprintf("bench-%s-%s.pprof", i.name, label))
	}
	driverShare, err := prof.stop(profilePath)
	if err != nil {
		return outcome{}, nil, err
	}
	if err := <-operatorProfiled; err != nil {
		return outcome{}, nil, fmt.Errorf("profiling netop's operator: %w", err)
	}
	o := outcome{IPAM: i.name, Scenario: label, Pods: n, Seconds: elapsed.Seconds(), Requests: map[string]float64{}, StealPercent: steal * 100}
	o.count(sandboxes, start)
	o.cost(before, after, driverShare)
	return o, sandboxes, nil
}

// sandboxes makes n sandboxes, each a network namespace and a pod to
// create, named after i and label.
func (d *driver) sandboxes(i ipam, s scenario, label string, n int) ([]*sandbox, error) {
	sandboxes := make([]*sandbox, n)
	for k := range sandboxes {
		name := nettest.NetnsName("pp")
		if err := linux.EnsureNetns(name); err != nil {
			return nil, err
		}
		sandboxes[k] = &sandbox{netns: name, pod: &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: d.namespace, Name: fmt.Sprintf("%s-%s-%d", i.name, label, k), Annotations: i.podMeta(s)},
			Spec: corev1.PodSpec{NodeName: d.node, Containers: []corev1.Container{{Name: "c", Image: "none"}},
				TerminationGracePeriodSeconds: new(int64)},
		}}
	}
	return sandboxes, nil
}

// count sets what the sandboxes say of the scenario begun at start: its
// failures (and the first errors), duplicate addresses, ADD p50 and p99,
// mean pod create, and when each pod was attached.
func (o *outcome) count(sandboxes []*sandbox, start time.Time) {
	var adds []time.Duration
	var creating time.Duration
	created := 0
	seen := map[netip.Addr]int{}
	for _, sb := range sandboxes {
		if sb.pod.UID != "" {
			creating += sb.create
			created++
		}
		if sb.err != nil {
			o.Failures++
			if len(o.Errors) < 5 {
				o.Errors = append(o.Errors, fmt.Sprintf("%s: %v", sb.pod.Name, sb.err))
			}
			continue
		}
		if len(sb.ips) == 0 {
			o.Failures++
			continue
		}
		adds = append(adds, sb.add)
		o.attachedAfter = append(o.attachedAfter, sb.attached.Sub(start).Seconds())
		for _, ip := range sb.ips {
			if seen[ip]++; seen[ip] == 2 {
				o.Duplicates++
			}
		}
	}
	slices.Sort(adds)
	slices.Sort(o.attachedAfter)
	if len(adds) > 0 {
		o.P50S = adds[len(adds)*50/100].Seconds()
		o.P99S = adds[min(len(adds)-1, len(adds)*99/100)].Seconds()
	}
	if created > 0 {
		o.CreateMs = float64(creating.Milliseconds()) / float64(created)
	}
}

// cost sets, per pod, what the scenario cost between before and after:
// the API server's requests and webhook calls, netop's phases, and CPU,
// the bench process's split by driverShare.
func (o *outcome) cost(before, after usage, driverShare float64) {
	n := o.Pods
	for k, v := range after.requests {
		// Below one request per hundred pods is the control plane's own
		// background (its controllers' watches and leases), not the IPAM.
		if perPod := (v - before.requests[k]) / float64(n); perPod >= 0.01 {
			o.Requests[k] = perPod
		}
	}
	o.Webhooks = map[string]webhookCalls{}
	for k, a := range after.webhooks {
		b := before.webhooks[k]
		if calls := a[1] - b[1]; calls > 0 {
			o.Webhooks[k] = webhookCalls{PerPod: calls / float64(n), MeanMs: (a[0] - b[0]) / calls * 1000}
		}
	}
	if o.IPAM == "netop" {
		o.Phases = map[string]float64{}
		for _, p := range netopPhases {
			a, b := after.phases[p.phase], before.phases[p.phase]
			if n := a[1] - b[1]; n > 0 {
				o.Phases[p.phase] = (a[0] - b[0]) / n * 1000
			}
		}
	}
	o.PluginCPU = (after.plugins - before.plugins) / float64(n) * 1000
	o.NetopCPU = (after.operator - before.operator) / float64(n) * 1000
	bench := (after.bench - before.bench) / float64(n) * 1000
	o.DriverCPU = bench * driverShare
	o.ControlPlaneCPU = bench - o.DriverCPU
}

// operatorProfileSeconds is how long netop's operator is profiled from a
// scenario's start: pprof profiles a fixed time, and a scenario of 1000
// pods takes longer than this.
const operatorProfileSeconds = 8

// attachAll creates each sandbox's pod and runs ADD on it, at most
// d.concurrency at once.
func (d *driver) attachAll(ctx context.Context, sandboxes []*sandbox, conf *libcni.NetworkConfigList) {
	sem := make(chan struct{}, d.concurrency)
	var wg sync.WaitGroup
	for _, sb := range sandboxes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			creating := time.Now()
			created, err := d.kube.CoreV1().Pods(d.namespace).Create(ctx, sb.pod, metav1.CreateOptions{})
			sb.create = time.Since(creating)
			if err != nil {
				sb.err = fmt.Errorf("creating the pod: %w", err)
				return
			}
			sb.pod = created
			began := time.Now()
			res, err := d.runtime.AddNetworkList(ctx, conf, sb.rt())
			sb.attached = time.Now()
			sb.add = sb.attached.Sub(began)
			if err != nil {
				sb.err = err
				return
			}
			r, err := current.NewResultFromResult(res)
			if err != nil {
				sb.err = err
				return
			}
			for _, ip := range r.IPs {
				if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
					sb.ips = append(sb.ips, a.Unmap())
				}
			}
		})
	}
	wg.Wait()
}

// detach runs DEL on every sandbox, deletes its pod and its namespace.
func (d *driver) detach(ctx context.Context, conf *libcni.NetworkConfigList, sandboxes []*sandbox) error {
	sem := make(chan struct{}, d.concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, sb := range sandboxes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			var err error
			if sb.pod.UID != "" {
				err = d.runtime.DelNetworkList(ctx, conf, sb.rt())
				if delErr := d.kube.CoreV1().Pods(d.namespace).Delete(ctx, sb.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err == nil {
					err = delErr
				}
			}
			if nsErr := nettest.DeleteNetns(sb.netns); err == nil {
				err = nsErr
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", sb.pod.Name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d pods not detached, the first: %w", len(errs), errs[0])
	}
	// Without a kubelet, a deleted pod goes at once (no grace period).
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := d.kube.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, nil
	})
}

// confList is a configuration list of one plugin, at CNI 1.0.0.
func confList(name string, pluginConf any) (*libcni.NetworkConfigList, error) {
	data, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": []any{pluginConf}})
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(data)
}

// rangeOf is the first and last of the n addresses a scenario hands out:
// after the prefix's first (the network) and second (the gateway).
func rangeOf(s scenario, n int) (first, last netip.Addr) {
	first = s.prefix.Addr().Next().Next()
	return first, addrPlus(first, n-1)
}

func addrPlus(a netip.Addr, n int) netip.Addr {
	v := binary.BigEndian.Uint32(a.AsSlice()) + uint32(n)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// createNetwork makes the scenario's Network and waits for it: with
// exactly n addresses free when the scenario is exact, every address after
// them reserved.
func createNetwork(ctx context.Context, client versioned.Interface, namespace string, s scenario, n int) error {
	spec := samplecrdv2.NetworkSpec{CIDRs: []string{s.prefix.String()}, Gateways: []string{s.prefix.Addr().Next().String()}}
	if s.exact {
		_, last := rangeOf(s, n)
		broadcast := netspec.LastAddr(s.prefix)
		if last.Next() != broadcast {
			spec.Reserved = []string{last.Next().String() + "-" + broadcast.Prev().String()}
		}
	}
	nw := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: s.name}, Spec: spec}
	if _, err := client.SamplecrdV2().Networks(namespace).Create(ctx, nw, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Network %s: %w", s.name, err)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := client.SamplecrdV2().Networks(namespace).Get(ctx, s.name, metav1.GetOptions{})
		return err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, samplecrd.ConditionReady), nil
	})
}

// bringUpLoopback brings up the namespace's lo: the control plane
// listens there.
func bringUpLoopback() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}

// report prints the outcomes as a table and as JSON lines.
func report(c config, outcomes []outcome) {
	fmt.Printf("%d pods per scenario, %d at once, whereabouts %s, %s\n", c.pods, c.concurrency, c.whereaboutsVersion, time.Now().UTC().Format(time.RFC3339))
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(w, "scenario\tipam\tall attached\tADD p50\tADD p99\tfailures\tduplicates\tplugin CPU/pod\tnetop CPU/pod\tcontrol plane CPU/pod\tdriver CPU/pod\tAPI requests/pod")
	for _, o := range outcomes {
		var reqs []string
		for _, k := range slices.Sorted(maps.Keys(o.Requests)) {
			reqs = append(reqs, fmt.Sprintf("%s %.2f", k, o.Requests[k]))
		}
		_, _ = fmt.Fprintf(w, "%s\t%s\t%.1f s\t%.0f ms\t%.0f ms\t%d\t%d\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%s\n", o.Scenario, o.IPAM, o.Seconds, o.P50S*1000, o.P99S*1000,
			o.Failures, o.Duplicates, o.PluginCPU, o.NetopCPU, o.ControlPlaneCPU, o.DriverCPU, strings.Join(reqs, ", "))
	}
	_ = w.Flush()
	for _, o := range outcomes {
		calls := []string{fmt.Sprintf("pod create mean %.1f ms", o.CreateMs), fmt.Sprintf("CPU steal %.1f %%", o.StealPercent)}
		for _, k := range slices.Sorted(maps.Keys(o.Webhooks)) {
			calls = append(calls, fmt.Sprintf("webhook %s %.2f/pod, mean %.1f ms", k, o.Webhooks[k].PerPod, o.Webhooks[k].MeanMs))
		}
		fmt.Printf("%s, %s: %s\n", o.IPAM, o.Scenario, strings.Join(calls, "; "))
	}
	for _, o := range outcomes {
		if o.Phases == nil {
			continue
		}
		var phases []string
		for _, p := range netopPhases {
			phases = append(phases, fmt.Sprintf("%s %.1f ms", p.phase, o.Phases[p.phase]))
		}
		fmt.Printf("%s, %s, mean per pod: %s\n", o.IPAM, o.Scenario, strings.Join(phases, ", "))
	}
	for _, o := range outcomes {
		for _, e := range o.Errors {
			fmt.Printf("%s, %s: %s\n", o.IPAM, o.Scenario, e)
		}
	}
	for _, o := range outcomes {
		line, _ := json.Marshal(o)
		fmt.Println(string(line))
	}
}
