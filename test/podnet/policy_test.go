package podnet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/testing/podprobe"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
)

// Issue 34, delegate mode: pods that Multus attaches through the
// NetworkAttachmentDefinition of a Network (the plugin called once per
// Network, as a delegate) are on the same bridge with the same addresses,
// and MultiNetworkPolicies hold for them as for pods the plugin attaches
// whole.
func TestPolicyOnDelegatedPods(t *testing.T) {
	n := startCNINode(t)
	ctx := t.Context()
	delegate := n.conf(t, "1.1.0", n.ns+"/example-network")
	open := func(s *sandbox) netns.NsHandle {
		t.Helper()
		if _, err := n.runtime.AddNetworkList(ctx, delegate, s.rt("net1")); err != nil {
			t.Fatalf("ADD of %s: %v", s.pod.Name, err)
		}
		t.Cleanup(func() { _ = n.runtime.DelNetworkList(context.Background(), delegate, s.rt("net1")) })
		h, err := netns.GetFromPath(s.netns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		closeServers, err := podprobe.Serve(h, []podprobe.Port{{Number: 80, Protocol: podprobe.TCP}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeServers)
		return h
	}
	web, db := n.newSandbox(t, "web", "example-network", true), n.newSandbox(t, "db", "example-network", true)
	if _, err := n.env.Kube.CoreV1().Pods(n.ns).Patch(ctx, "db", types.MergePatchType, []byte(`{"metadata":{"labels":{"role":"db"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	webNetns, dbNetns := open(web), open(db)
	port := podprobe.Port{Number: 80, Protocol: podprobe.TCP}
	waitReach := func(when string, webToDB, dbToWeb bool) {
		t.Helper()
		testenv.Eventually(t, 15*time.Second, func(context.Context) (bool, string) {
			a, b := podprobe.Reaches(webNetns, dbNetns, addr(db.allocations[0]), port), podprobe.Reaches(dbNetns, webNetns, addr(web.allocations[0]), port)
			return a == webToDB && b == dbToWeb, fmt.Sprintf("%s: web reaches db %v (want %v), db reaches web %v (want %v)", when, a, webToDB, b, dbToWeb)
		})
	}
	waitReach("no policy", true, true)

	policies := n.env.Netop.K8sCniCncfIoV1beta1().MultiNetworkPolicies(n.ns)
	if _, err := policies.Create(ctx, &v1beta1.MultiNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "db-ingress", Annotations: map[string]string{v1beta1.PolicyForAnnotation: "example-network"}},
		Spec: v1beta1.MultiNetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "db"}},
			PolicyTypes: []v1beta1.MultiPolicyType{v1beta1.PolicyTypeIngress}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReach("db isolated in ingress", false, true)
	if err := policies.Delete(ctx, "db-ingress", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReach("the policy deleted", true, true)
}
