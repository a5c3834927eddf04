package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/node"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdclient "github.com/netop-dev/netop/pkg/generated/clientset/versioned/typed/samplecrd/v2"
)

// measureHotPlug times hot-plug on one running pod of example-network:
// from the annotation naming a second Network to net2 usable in the pod
// (up, with its address), and from the annotation no longer naming it to
// net2 gone, changes times each.
func measureHotPlug(kube kubernetes.Interface, nets samplecrdclient.NetworkInterface, dataDir string, changes int) (plug, unplug []float64, err error) {
	ctx := context.Background()
	second := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "hotplug-b"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.186.0.0/24"}}}
	if _, err := nets.Create(ctx, second, metav1.CreateOptions{}); err != nil {
		return nil, nil, err
	}
	if _, _, err := runPods(kube, "hotplug", 1, "example-network"); err != nil {
		return nil, nil, err
	}
	defer func() {
		if derr := deletePods(kube); err == nil {
			err = derr
		}
	}()
	netnsPath, err := podNetns(dataDir, "default/hotplug-000")
	if err != nil {
		return nil, nil, err
	}
	annotate := func(networks string) error {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{netselect.NetworksAnnotation: networks}}})
		_, err := kube.CoreV1().Pods("default").Patch(ctx, "hotplug-000", types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	for range changes {
		began := time.Now()
		if err := annotate("example-network,hotplug-b"); err != nil {
			return nil, nil, err
		}
		if err := waitNet2(netnsPath, true); err != nil {
			return nil, nil, fmt.Errorf("plugging net2: %w", err)
		}
		plug = append(plug, time.Since(began).Seconds())
		began = time.Now()
		if err := annotate("example-network"); err != nil {
			return nil, nil, err
		}
		if err := waitNet2(netnsPath, false); err != nil {
			return nil, nil, fmt.Errorf("unplugging net2: %w", err)
		}
		unplug = append(unplug, time.Since(began).Seconds())
		// The next plug waits for the address to be freed: the pod's
		// allocation of net2 gone.
		if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := kube.CoreV1().Pods("default").Get(ctx, "hotplug-000", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			have, _ := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
			return !slices.ContainsFunc(have, func(a netselect.Allocation) bool { return a.Interface == "net2" }), nil
		}); err != nil {
			return nil, nil, fmt.Errorf("net2's address freed: %w", err)
		}
	}
	return plug, unplug, nil
}

// podNetns is the network namespace of the running pod named, from the
// CNI plugin's record of its sandbox on the node.
func podNetns(dataDir, pod string) (string, error) {
	records, _, err := cni.Store{Dir: node.CNIDataDir(dataDir)}.List()
	if err != nil {
		return "", err
	}
	for _, r := range records {
		if r.Pod == pod {
			return r.Netns, nil
		}
	}
	return "", fmt.Errorf("no CNI record of pod %s in %s", pod, filepath.Join(dataDir, "node"))
}

// waitNet2 polls the pod's namespace until net2 is up with an address
// (present) or gone.
func waitNet2(netnsPath string, present bool) error {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		usable := false
		err := linux.InNetns(ns, func() error {
			link, err := netlink.LinkByName("net2")
			if err != nil {
				return nil //nolint:nilerr // not there (yet)
			}
			addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
			usable = err == nil && len(addrs) > 0 && link.Attrs().OperState == netlink.OperUp
			return nil
		})
		if err != nil {
			return err
		}
		if usable == present {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("net2 in %s: not %v within 30s", netnsPath, map[bool]string{true: "usable", false: "gone"}[present])
}

// runHotPlug starts the standalone and measures hot-plug alone.
func runHotPlug(changes int) error {
	binary, dataDir, netnsName, done, err := workspace()
	if err != nil {
		return err
	}
	defer done()
	sa, kubeconfig, kube, err := startStandalone(binary, dataDir, netnsName, netnsName)
	if err != nil {
		return err
	}
	defer sa.stop()
	if err := createNetwork(kubeconfig); err != nil {
		return err
	}
	netop, err := netopClient(kubeconfig)
	if err != nil {
		return err
	}
	plug, unplug, err := measureHotPlug(kube, netop.SamplecrdV2().Networks("default"), dataDir, changes)
	if err != nil {
		return err
	}
	p50, p99 := percentiles(plug)
	u50, u99 := percentiles(unplug)
	fmt.Printf("| date | CPUs | hot-plug changes | annotation to net2 usable, p50 | p99 | annotation to net2 gone, p50 | p99 |\n")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")
	fmt.Printf("| %s | %d | %d | %.0f ms | %.0f ms | %.0f ms | %.0f ms |\n", time.Now().UTC().Format(time.DateOnly), runtime.NumCPU(), changes, 1000*p50, 1000*p99, 1000*u50, 1000*u99)
	return nil
}
