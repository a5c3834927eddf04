package admission

import (
	"context"
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// A pod's edited Networks (hot-plug) go through the same checks as a new
// pod's, at the API server: who may join, and an interface the pod keeps
// is never renamed. An edit that adds a Network it may join is admitted.
func TestEditedPodNetworksAreReviewed(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	ns, other := env.Namespace(t), env.Namespace(t)
	for _, n := range []*samplecrdv2.Network{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.172.0.0/24"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.172.1.0/24"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "closed"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.172.2.0/24"}}},
	} {
		if _, err := env.Netop.SamplecrdV2().Networks(n.Namespace).Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventuallyAdmitted(t, env, networkPod(ns, "p", "a"))
	waitAllocated(t, env, ns, "p", ns+"/a")
	edit := func(networks string) func(context.Context) error {
		return func(ctx context.Context) error {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{netselect.NetworksAnnotation: networks}}})
			_, err := env.Kube.CoreV1().Pods(ns).Patch(ctx, "p", types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		}
	}
	requireRefused(t, "renaming net1", edit("a@data"), "pod "+ns+"/p", `"data": the pod's interface on Network `+ns+`/a is net1, and a running pod's interface is not renamed`)
	requireRefused(t, "joining a Network it may not", edit("a,"+other+"/closed"), "pods of namespace "+ns+" may not join Network "+other+"/closed")
	if err := edit("a,b")(ctx); err != nil {
		t.Fatalf("adding a Network of its own namespace: %v", err)
	}
}
