package podnet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/tenancy"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// With the webhooks off, the allocation controller, the one writer, still
// decides who may join: a pod of a namespace the Network does not admit
// gets no address, a Warning Event naming the reason, and its sandbox's
// CNI ADD fails at once with the same reason (what kubectl describe pod
// shows). Once the Network's selector selects its namespace, it gets its
// address, the refusal goes, and ADD attaches it.
func TestForeignNamespaceWithoutWebhooks(t *testing.T) {
	n := startCNINodeWith(t, func(o *operator.Options) { o.Namespace = "" }) // every namespace's pods
	env, ctx := n.env, t.Context()
	tenantB := env.Namespace(t)
	network := n.ns + "/example-network"
	s := n.newSandboxIn(t, tenantB, "foreign", network, false)
	why := fmt.Sprintf("pods of namespace %s may not join Network %s: the Network admits pods of its own namespace only (it has no spec.namespaceSelector)",
		tenantB, network)
	waitEvent(t, env, tenantB, "foreign", tenancy.Reason, why)
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		pod, err := env.Kube.CoreV1().Pods(tenantB).Get(ctx, "foreign", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return pod.Annotations[netselect.RefusedAnnotation] == why && pod.Annotations[netselect.AllocationsAnnotation] == "",
			fmt.Sprintf("annotations %v", pod.Annotations)
	})
	conf := n.conf(t, "1.1.0", "")
	_, err := n.runtime.AddNetworkList(ctx, conf, s.rt("eth0"))
	if err == nil || !strings.Contains(err.Error(), "netop refuses its Networks: "+why) {
		t.Fatalf("ADD of a refused pod: %v, want the refusal's reason", err)
	}
	if _, err := s.handle.LinkByName("net1"); err == nil {
		t.Fatal("a refused pod got net1")
	}

	// The Network selects team=b, which the namespace is not yet: still
	// refused. Once the namespace is labelled (the allocator watches
	// namespaces), admitted, the refusal removed in the same write.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		net, err := env.Netop.SamplecrdV2().Networks(n.ns).Get(ctx, "example-network", metav1.GetOptions{})
		if err != nil {
			return err
		}
		net.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}}
		_, err = env.Netop.SamplecrdV2().Networks(n.ns).Update(ctx, net, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, env, tenantB, "foreign", tenancy.Reason, fmt.Sprintf(
		"pods of namespace %s may not join Network %s: its spec.namespaceSelector (team=b) does not select the namespace", tenantB, network))
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"team": "b"}}})
	if _, err := env.Kube.CoreV1().Namespaces().Patch(ctx, tenantB, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		pod, err := env.Kube.CoreV1().Pods(tenantB).Get(ctx, "foreign", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s.pod = pod
		s.allocations, _ = netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		_, refused := pod.Annotations[netselect.RefusedAnnotation]
		return len(s.allocations) == 1 && !refused, fmt.Sprintf("annotations %v", pod.Annotations)
	})
	if _, err := n.runtime.AddNetworkList(ctx, conf, s.rt("eth0")); err != nil {
		t.Fatalf("ADD once admitted: %v", err)
	}
	n.requireAttached(t, s)
}
