package netpolicy

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netpolicy/resolved"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

const netUID = types.UID("0123456789abcdef")

func testPod(ns, name, addr string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	a, _ := json.Marshal([]netselect.Allocation{{Network: "x/net", NetworkUID: netUID, Interface: "net1", IPs: []string{addr + "/24"}}})
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels,
		Annotations: map[string]string{netselect.AllocationsAnnotation: string(a)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}}}
}

func inputs(policies ...*v1beta1.MultiNetworkPolicy) Inputs {
	return Inputs{
		Policies: policies,
		Pods: []*corev1.Pod{
			testPod("x", "a", "10.0.0.2", map[string]string{"pod": "a"}, corev1.ContainerPort{Name: "web", ContainerPort: 8080}),
			testPod("x", "b", "10.0.0.3", map[string]string{"pod": "b"}),
			testPod("y", "a", "10.0.0.4", map[string]string{"pod": "a"}, corev1.ContainerPort{Name: "web", ContainerPort: 9090}),
			{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "none", Labels: map[string]string{"pod": "a"}}},
		},
		NamespaceLabels: map[string]map[string]string{"x": {"ns": "x"}, "y": {"ns": "y"}},
		Network: func(namespace, name string) *samplecrdv2.Network {
			if namespace == "x" && name == "net" {
				return &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "net", UID: netUID}}
			}
			return nil
		},
	}
}

func policy(ns, policyFor string, spec v1beta1.MultiNetworkPolicySpec) *v1beta1.MultiNetworkPolicy {
	p := &v1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: spec}
	if policyFor != "-" {
		p.Annotations = map[string]string{v1beta1.PolicyForAnnotation: policyFor}
	}
	return p
}

func addrs(endpoints []resolved.Endpoint) []string {
	var out []string
	for _, e := range endpoints {
		out = append(out, e.Addr.String())
	}
	slices.Sort(out)
	return out
}

func TestResolve(t *testing.T) {
	br := ifname.Bridge(netUID)
	sel := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}

	// A podSelector-only peer is of the policy's namespace; a
	// namespaceSelector widens it; named ports resolve on the selected
	// pods (ingress) or every destination (egress).
	got, outcomes := Resolve(inputs(policy("x", " net ", v1beta1.MultiNetworkPolicySpec{
		PodSelector: *sel("pod", "a"),
		Ingress: []v1beta1.MultiNetworkPolicyIngressRule{
			{From: []v1beta1.MultiNetworkPolicyPeer{{PodSelector: sel("pod", "a")}}},
			{From: []v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("pod", "a")}},
				Ports: []v1beta1.MultiNetworkPolicyPort{{Port: &intstr.IntOrString{Type: intstr.String, StrVal: "web"}}}},
		},
		Egress: []v1beta1.MultiNetworkPolicyEgressRule{{Ports: []v1beta1.MultiNetworkPolicyPort{{Port: &intstr.IntOrString{Type: intstr.String, StrVal: "web"}}}}},
	})))
	if o := outcomes["x/p"]; len(got) != 1 || o.Pods != 1 || !slices.Equal(o.Networks, []string{"x/net"}) || len(o.Problems) > 0 {
		t.Fatalf("resolved %+v, outcome %+v", got, o)
	}
	p := got[0]
	if p.Ingress == nil || p.Egress == nil {
		t.Fatalf("directions %+v: egress rules make it isolate egress too", p)
	}
	if s := addrs(p.Ingress.Selected); !slices.Equal(s, []string{"10.0.0.2"}) || p.Ingress.Selected[0].Bridge != br {
		t.Errorf("selected %v", p.Ingress.Selected)
	}
	if s := addrs(p.Ingress.Rules[0].Pods); !slices.Equal(s, []string{"10.0.0.2"}) {
		t.Errorf("podSelector-only peers %v, want the policy's namespace's", s)
	}
	if s := addrs(p.Ingress.Rules[1].Pods); !slices.Equal(s, []string{"10.0.0.2", "10.0.0.4"}) {
		t.Errorf("peers of every namespace %v", s)
	}
	if n := p.Ingress.Rules[1].Named; len(n) != 1 || n[0].Port != 8080 || n[0].Addr != netip.MustParseAddr("10.0.0.2") {
		t.Errorf("ingress named ports %+v, want the selected pod's 8080", n)
	}
	if n := p.Egress.Rules[0]; !n.AnyPeer || len(n.Named) != 2 {
		t.Errorf("egress named ports %+v, want every destination's", n)
	}

	for _, c := range []struct{ name, ns, policyFor, problem string }{
		{"no annotation", "x", "-", "has no k8s.v1.cni.cncf.io/policy-for annotation"},
		{"missing Network", "x", "x/other", "Network x/other: no such netop Network"},
		{"foreign namespace", "y", "x/net", "Network x/net: policies of namespace y may not apply to it"},
	} {
		got, outcomes := Resolve(inputs(policy(c.ns, c.policyFor, v1beta1.MultiNetworkPolicySpec{})))
		if o := outcomes[c.ns+"/p"]; len(got) != 0 || len(o.Problems) != 1 || !strings.Contains(o.Problems[0], c.problem) {
			t.Errorf("%s: resolved %+v, outcome %+v, want %q", c.name, got, o, c.problem)
		}
	}
}
