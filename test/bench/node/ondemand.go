package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// onDemandResult is what --only ondemand measures: pod create to Running
// on node 1 of two, one pod at a time, on a Network no node realises yet
// (the node builds it for the pod) and on one it already has.
type onDemandResult struct {
	Date        string  `json:"date"`
	CPUs        int     `json:"cpus"`
	Pods        int     `json:"pods"`
	OnDemandP50 float64 `json:"onDemandP50S"`
	OnDemandP99 float64 `json:"onDemandP99S"`
	LocalP50    float64 `json:"localP50S"`
	LocalP99    float64 `json:"localP99S"`
}

// runOnDemand starts the standalone with two nodes (a controller and an
// agent per node, building Networks on demand, keeping them an hour), makes
// pods Networks, and times, one pod at a time on node 1, a pod on each
// Network (realised on demand for it), then a second pod on each (the
// Network already there).
func runOnDemand(pods int) error {
	binary, dataDir, netnsName, done, err := workspace()
	if err != nil {
		return err
	}
	defer done()
	nodes := []string{netnsName + "-1", netnsName + "-2"}
	defer func() {
		for _, ns := range nodes {
			_ = exec.Command("ip", "netns", "delete", ns).Run()
		}
	}()
	sa, kubeconfig, kube, err := startStandalone(binary, dataDir, netnsName, nodes[0], "--nodes", "2", "--network-release-delay", "1h")
	if err != nil {
		return err
	}
	defer sa.stop()
	netop, err := netopClient(kubeconfig)
	if err != nil {
		return err
	}
	ctx := context.Background()
	nets := netop.SamplecrdV2().Networks("default")
	for i := range pods {
		n := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("od-%03d", i)},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{fmt.Sprintf("10.%d.%d.0/24", 200+i/256, i%256)}}}
		if _, err := nets.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := nets.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // retried
		}
		ready := 0
		for _, n := range list.Items {
			if meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady) {
				ready++
			}
		}
		return ready == pods, nil
	}); err != nil {
		return fmt.Errorf("the Networks are not Ready: %w", err)
	}
	onNode1 := func(p *corev1.Pod) { p.Spec.NodeName = "bench-node-1" }
	time1 := func(prefix string) ([]float64, error) {
		var took []float64
		for i := range pods {
			t, _, err := runPods(kube, fmt.Sprintf("%s-%03d", prefix, i), 1, fmt.Sprintf("od-%03d", i), onNode1)
			if err != nil {
				return nil, err
			}
			took = append(took, t...)
		}
		return took, nil
	}
	r := onDemandResult{Date: time.Now().UTC().Format(time.DateOnly), CPUs: runtime.NumCPU(), Pods: pods}
	onDemand, err := time1("ondemand")
	if err != nil {
		return err
	}
	local, err := time1("local")
	if err != nil {
		return err
	}
	r.OnDemandP50, r.OnDemandP99 = percentiles(onDemand)
	r.LocalP50, r.LocalP99 = percentiles(local)
	fmt.Printf("%d pods one at a time on node 1 of 2, each on a Network of its own\n", pods)
	fmt.Printf("%-44s p50 %6.3f s  p99 %6.3f s\n", "the Network realised on demand for the pod", r.OnDemandP50, r.OnDemandP99)
	fmt.Printf("%-44s p50 %6.3f s  p99 %6.3f s\n", "the Network already on the node", r.LocalP50, r.LocalP99)
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	return deletePods(kube)
}
