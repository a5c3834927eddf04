package standalone

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/controller/netpolicy"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/podprobe"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// A probed pod: in the matrix, namespace x, y or z, name a, b or c.
type probedPod struct {
	ns, name string
	addr     string
	netns    netns.NsHandle
}

func (p *probedPod) String() string { return p.ns + "/" + p.name }

var matrixPorts = []podprobe.Port{{Number: 80, Protocol: podprobe.TCP}, {Number: 81, Protocol: podprobe.TCP}, {Number: 80, Protocol: podprobe.UDP}, {Number: 81, Protocol: podprobe.UDP}, {Number: 80, Protocol: podprobe.SCTP}}

// expectation says whether from reaches to on port.
type expectation func(from, to *probedPod, port podprobe.Port) bool

func everything(*probedPod, *probedPod, podprobe.Port) bool { return true }

// Issue 34 on the standalone's real node: MultiNetworkPolicies on a netop
// Network, checked in the style of Kubernetes' network-policy e2e suite.
// Namespaces x, y and z each have pods a, b and c on Network x/pol, which
// admits every namespace; each listens on TCP and UDP ports 80 and 81 and
// takes SCTP on 80 (podprobe's sockets in the pod's network namespace).
// Each case applies its policies and compares the whole matrix of who
// reaches whom, probed from the pods' network namespaces, with what it
// expects; a busybox nc in a container is refused as the probes are.
func TestPolicyMatrix(t *testing.T) {
	sa, dataDir, stop := startWithNode(t)
	defer stop()
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)
	client := versioned.NewForConfigOrDie(cfg)
	ctx := t.Context()

	for _, ns := range []string{"x", "y", "z"} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"ns": ns}}},
			metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			_, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, fmt.Sprintf("no default ServiceAccount in %s: %v", ns, err)
		})
	}
	for name, cidr := range map[string]string{"pol": "10.181.0.0/24", "other": "10.182.0.0/24"} {
		if _, err := client.SamplecrdV2().Networks("x").Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{cidr}, NamespaceSelector: &metav1.LabelSelector{}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// newPod creates pod ns/name labelled pod=label on x/pol, declaring
	// the matrix's ports as named container ports.
	newPod := func(t *testing.T, ns, name, label string) *probedPod {
		t.Helper()
		p := busyboxPod(name, corev1.RestartPolicyAlways, "sleep 3600")
		p.Labels = map[string]string{"pod": label}
		p.Annotations = map[string]string{netselect.NetworksAnnotation: "x/pol"}
		for _, port := range matrixPorts {
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{
				Name: "serve-" + strings.ReplaceAll(port.String(), "/", "-"), ContainerPort: int32(port.Number), Protocol: corev1.Protocol(strings.ToUpper(port.Protocol))})
		}
		// Admission knows x/pol once its cache has it.
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			_, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err == nil, fmt.Sprintf("creating pod %s/%s: %v", ns, name, err)
		})
		return &probedPod{ns: ns, name: name}
	}
	var pods []*probedPod
	for _, ns := range []string{"x", "y", "z"} {
		for _, name := range []string{"a", "b", "c"} {
			pods = append(pods, newPod(t, ns, name, name))
		}
	}
	// Gone before the node stops.
	defer deletePods(t, kube, "x", "y", "z")

	for _, p := range pods {
		waitProbedPod(t, kube, dataDir, p)
	}

	policies := client.K8sCniCncfIoV1beta1()
	apply := func(t *testing.T, list ...*v1beta1.MultiNetworkPolicy) {
		t.Helper()
		for _, p := range list {
			if _, err := policies.MultiNetworkPolicies(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			for _, p := range list {
				_ = policies.MultiNetworkPolicies(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{})
			}
		})
	}
	pod := func(id string) *probedPod {
		for _, p := range pods {
			if p.String() == id {
				return p
			}
		}
		t.Fatalf("no pod %s", id)
		return nil
	}
	xa := pod("x/a")
	sel := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	named := func(name string) *intstr.IntOrString { return &intstr.IntOrString{Type: intstr.String, StrVal: name} }
	number := func(n int) *intstr.IntOrString { return &intstr.IntOrString{IntVal: int32(n)} }
	udp := ptr.To(v1beta1.ProtocolUDP)
	tcp := ptr.To(v1beta1.ProtocolTCP)
	sctp := ptr.To(v1beta1.ProtocolSCTP)
	// ingressTo expects only allowed(from, port) to reach target; every
	// other pair is open.
	ingressTo := func(target *probedPod, allowed func(from *probedPod, port podprobe.Port) bool) expectation {
		return func(from, to *probedPod, port podprobe.Port) bool { return to != target || allowed(from, port) }
	}
	egressFrom := func(source *probedPod, allowed func(to *probedPod, port podprobe.Port) bool) expectation {
		return func(from, to *probedPod, port podprobe.Port) bool { return from != source || allowed(to, port) }
	}
	nothing := func(*probedPod, podprobe.Port) bool { return false }
	mnp := func(ns, name, policyFor string, spec v1beta1.MultiNetworkPolicySpec) *v1beta1.MultiNetworkPolicy {
		return &v1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Annotations: map[string]string{v1beta1.PolicyForAnnotation: policyFor}}, Spec: spec}
	}
	ingressTypes := []v1beta1.MultiPolicyType{v1beta1.PolicyTypeIngress}
	egressTypes := []v1beta1.MultiPolicyType{v1beta1.PolicyTypeEgress}
	bothTypes := []v1beta1.MultiPolicyType{v1beta1.PolicyTypeIngress, v1beta1.PolicyTypeEgress}
	only := func(want podprobe.Port) func(*probedPod, podprobe.Port) bool {
		return func(_ *probedPod, port podprobe.Port) bool { return port == want }
	}
	ingressRule := func(from []v1beta1.MultiNetworkPolicyPeer, ports ...v1beta1.MultiNetworkPolicyPort) []v1beta1.MultiNetworkPolicyIngressRule {
		return []v1beta1.MultiNetworkPolicyIngressRule{{From: from, Ports: ports}}
	}
	// A case whose policies should change nothing adds control, created
	// last: the policies' informer delivers in order, so a matrix showing
	// control's effect was enforced with the others in place.
	control := mnp("y", "control", "x/pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "c"), PolicyTypes: ingressTypes})
	controlled := ingressTo(pod("y/c"), nothing)
	cases := []struct {
		name     string
		policies []*v1beta1.MultiNetworkPolicy
		want     expectation
		// then, if set, changes the cluster and checks the new matrix.
		then     func(t *testing.T)
		thenWant expectation
	}{
		{name: "no policy", want: everything},
		{name: "default deny ingress, policy-for by name",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "deny", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: ingressTypes})},
			want:     ingressTo(xa, nothing)},
		{name: "default deny egress, policy-for by namespace/name",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "deny", "x/pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressTypes})},
			want:     egressFrom(xa, nothing)},
		{name: "deny ingress to a whole namespace",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("y", "deny", "x/pol", v1beta1.MultiNetworkPolicySpec{PolicyTypes: ingressTypes})},
			want:     func(from, to *probedPod, _ podprobe.Port) bool { return to.ns != "y" }},
		{name: "allow from a pod selector (its namespace's pods)",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{PodSelector: sel("pod", "b")}})})},
			want: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.String() == "x/b" })},
		{name: "allow from a namespace",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}})})},
			want: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.ns == "y" })},
		{name: "allow from a pod selector in a namespace",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: sel("ns", "y"), PodSelector: sel("pod", "c")}})})},
			want: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.String() == "y/c" })},
		{name: "allow from every namespace's pods b",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("pod", "b")}})})},
			want: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.name == "b" })},
		{name: "allow from an ipBlock with an except",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{IPBlock: &v1beta1.IPBlock{CIDR: "10.181.0.0/24", Except: []string{pod("y/b").addr + "/32"}}}})})},
			want: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.String() != "y/b" })},
		{name: "egress to an ipBlock",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "out", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressTypes,
				Egress: []v1beta1.MultiNetworkPolicyEgressRule{{To: []v1beta1.MultiNetworkPolicyPeer{{IPBlock: &v1beta1.IPBlock{CIDR: pod("z/c").addr + "/32"}}}}}})},
			want: egressFrom(xa, func(to *probedPod, _ podprobe.Port) bool { return to.String() == "z/c" })},
		{name: "egress to a namespace, unset policyTypes",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "out", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: []v1beta1.MultiNetworkPolicyIngressRule{{}},
				Egress:  []v1beta1.MultiNetworkPolicyEgressRule{{To: []v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: sel("ns", "z")}}}}})},
			want: egressFrom(xa, func(to *probedPod, _ podprobe.Port) bool { return to.ns == "z" })},
		{name: "by port",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule(nil, v1beta1.MultiNetworkPolicyPort{Port: number(81)})})},
			want: ingressTo(xa, func(_ *probedPod, port podprobe.Port) bool {
				return port == podprobe.Port{Number: 81, Protocol: podprobe.TCP}
			})},
		{name: "by named port",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule(nil, v1beta1.MultiNetworkPolicyPort{Port: named("serve-80-tcp")})})},
			want: ingressTo(xa, func(_ *probedPod, port podprobe.Port) bool {
				return port == podprobe.Port{Number: 80, Protocol: podprobe.TCP}
			})},
		{name: "egress by named port of the destinations",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "out", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressTypes,
				Egress: []v1beta1.MultiNetworkPolicyEgressRule{{Ports: []v1beta1.MultiNetworkPolicyPort{{Protocol: udp, Port: named("serve-81-udp")}}}}})},
			want: egressFrom(xa, func(_ *probedPod, port podprobe.Port) bool {
				return port == podprobe.Port{Number: 81, Protocol: podprobe.UDP}
			})},
		{name: "UDP by port range",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule(nil, v1beta1.MultiNetworkPolicyPort{Protocol: udp, Port: number(80), EndPort: ptr.To[int32](81)})})},
			want: ingressTo(xa, func(_ *probedPod, port podprobe.Port) bool { return port.Protocol == podprobe.UDP })},
		{name: "the union of two policies",
			policies: []*v1beta1.MultiNetworkPolicy{
				mnp("x", "from-b", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
					Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{PodSelector: sel("pod", "b")}}, v1beta1.MultiNetworkPolicyPort{Port: number(80)})}),
				mnp("x", "from-c", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
					Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{PodSelector: sel("pod", "c")}}, v1beta1.MultiNetworkPolicyPort{Port: number(81)})}),
			},
			want: ingressTo(xa, func(from *probedPod, port podprobe.Port) bool {
				return from.String() == "x/b" && port == podprobe.Port{Number: 80, Protocol: podprobe.TCP} || from.String() == "x/c" && port == podprobe.Port{Number: 81, Protocol: podprobe.TCP}
			})},
		{name: "a policy for another Network has no effect",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "elsewhere", "x/other", v1beta1.MultiNetworkPolicySpec{PolicyTypes: ingressTypes}), control},
			want:     controlled},
		{name: "a policy for a Network that does not exist has no effect",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "nowhere", "x/missing", v1beta1.MultiNetworkPolicySpec{PolicyTypes: ingressTypes}), control},
			want:     controlled},
		{name: "SCTP by port",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule(nil, v1beta1.MultiNetworkPolicyPort{Protocol: sctp, Port: number(80)})})},
			want: ingressTo(xa, only(podprobe.Port{Number: 80, Protocol: podprobe.SCTP}))},
		{name: "egress by SCTP named port",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "out", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressTypes,
				Egress: []v1beta1.MultiNetworkPolicyEgressRule{{Ports: []v1beta1.MultiNetworkPolicyPort{{Protocol: sctp, Port: named("serve-80-sctp")}}}}})},
			want: egressFrom(xa, only(podprobe.Port{Number: 80, Protocol: podprobe.SCTP}))},
		{name: "egress by TCP port range",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "out", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressTypes,
				Egress: []v1beta1.MultiNetworkPolicyEgressRule{{Ports: []v1beta1.MultiNetworkPolicyPort{{Protocol: tcp, Port: number(81), EndPort: ptr.To[int32](90)}}}}})},
			want: egressFrom(xa, only(podprobe.Port{Number: 81, Protocol: podprobe.TCP}))},
		{name: "egress to an ipBlock with an except",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "out", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressTypes,
				Egress: []v1beta1.MultiNetworkPolicyEgressRule{{To: []v1beta1.MultiNetworkPolicyPeer{{IPBlock: &v1beta1.IPBlock{CIDR: "10.181.0.0/24", Except: []string{pod("z/c").addr + "/32"}}}}}}})},
			want: egressFrom(xa, func(to *probedPod, _ podprobe.Port) bool { return to.String() != "z/c" })},
		{name: "ingress and egress in one policy",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "both", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: bothTypes,
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}}),
				Egress:  []v1beta1.MultiNetworkPolicyEgressRule{{To: []v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: sel("ns", "z")}}}}})},
			want: func(from, to *probedPod, _ podprobe.Port) bool {
				switch {
				case to == xa:
					return from.ns == "y"
				case from == xa:
					return to.ns == "z"
				}
				return true
			}},
		{name: "default deny both ways in a namespace",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("y", "deny", "x/pol", v1beta1.MultiNetworkPolicySpec{PolicyTypes: bothTypes})},
			want:     func(from, to *probedPod, _ podprobe.Port) bool { return from.ns != "y" && to.ns != "y" }},
		{name: "allow from its own namespace",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("y", "same", "x/pol", v1beta1.MultiNetworkPolicySpec{
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}})})},
			want: func(from, to *probedPod, _ podprobe.Port) bool { return to.ns != "y" || from.ns == "y" }},
		{name: "allow all ingress beside a default deny",
			policies: []*v1beta1.MultiNetworkPolicy{
				mnp("x", "deny", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: ingressTypes}),
				mnp("x", "all", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), Ingress: []v1beta1.MultiNetworkPolicyIngressRule{{}}}),
				control,
			},
			want: controlled},
		{name: "selectors with expressions",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpIn, Values: []string{"a"}}}},
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "ns", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"x"}}}},
					PodSelector:       &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"c"}}}},
				}})})},
			want: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.ns != "x" && from.name != "c" })},
		{name: "policy-for naming two Networks",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "deny", "other, x/pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: ingressTypes})},
			want:     ingressTo(xa, nothing)},
		{name: "a policy edited",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule(nil, v1beta1.MultiNetworkPolicyPort{Port: number(80)})})},
			want: ingressTo(xa, only(podprobe.Port{Number: 80, Protocol: podprobe.TCP})),
			then: func(t *testing.T) {
				p, err := policies.MultiNetworkPolicies("x").Get(t.Context(), "allow", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				p.Spec.Ingress[0].Ports[0].Port = number(81)
				if _, err := policies.MultiNetworkPolicies("x").Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			thenWant: ingressTo(xa, only(podprobe.Port{Number: 81, Protocol: podprobe.TCP}))},
		{name: "a pod that joins after the policy",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "allow", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("pod", "b")}})})},
			want: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.name == "b" }),
			then: func(t *testing.T) {
				// x/d, labelled as the b pods are.
				d := newPod(t, "x", "d", "b")
				t.Cleanup(func() {
					pods = slices.DeleteFunc(pods, func(p *probedPod) bool { return p == d })
					_ = kube.CoreV1().Pods("x").Delete(context.Background(), "d", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
				})
				waitProbedPod(t, kube, dataDir, d)
				pods = append(pods, d)
			},
			thenWant: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.name == "b" || from.name == "d" })},
		{name: "a pod relabelled into and out of a peer selector",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "friends", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("friend", "yes")}})})},
			want:     ingressTo(xa, nothing),
			then:     func(t *testing.T) { labelPod(t, kube, "z", "b", "friend", "yes") },
			thenWant: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.String() == "z/b" })},
		{name: "a pod relabelled into the policy's selector",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "deny", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("friend", "no"), PolicyTypes: ingressTypes})},
			want:     everything,
			then:     func(t *testing.T) { labelPod(t, kube, "x", "a", "friend", "no") },
			thenWant: ingressTo(xa, nothing)},
		{name: "a namespace relabelled into a namespace selector",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "blue", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"),
				Ingress: ingressRule([]v1beta1.MultiNetworkPolicyPeer{{NamespaceSelector: sel("team", "blue")}})})},
			want: ingressTo(xa, nothing),
			then: func(t *testing.T) {
				if _, err := kube.CoreV1().Namespaces().Patch(t.Context(), "z", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"blue"}}}`), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			thenWant: ingressTo(xa, func(from *probedPod, _ podprobe.Port) bool { return from.ns == "z" })},
		{name: "a policy deleted",
			policies: []*v1beta1.MultiNetworkPolicy{mnp("x", "deny", "pol", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: ingressTypes})},
			want:     ingressTo(xa, nothing),
			then: func(t *testing.T) {
				if err := policies.MultiNetworkPolicies("x").Delete(t.Context(), "deny", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			thenWant: everything},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			apply(t, c.policies...)
			waitMatrix(t, pods, c.want)
			if c.then != nil {
				c.then(t)
				waitMatrix(t, pods, c.thenWant)
			}
		})
	}

	// The policies say what they come to.
	apply(t, mnp("x", "reported", "pol, x/missing", v1beta1.MultiNetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: ingressTypes}))
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		events, err := kube.CoreV1().Events("x").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=reported"})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range events.Items {
			if e.Reason == netpolicy.ReasonNotEnforced && strings.Contains(e.Message, "Applies to Networks x/pol: selects 1 pods") &&
				strings.Contains(e.Message, "Network x/missing: no such netop Network") {
				return true, ""
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Sprintf("Events %q", seen)
	})
	// A busybox in a container is refused as the probes were.
	if got := strings.TrimSpace(execInNamespace(t, cfg, kube, "x", "b", "sh", "-c", "nc -w 2 "+xa.addr+" 80 </dev/null >/dev/null 2>&1; echo $?")); got == "0" {
		t.Errorf("x/b's busybox opened a connection to x/a, isolated in ingress")
	}
}

// labelPod sets the label key of pod ns/name to value until the test ends.
func labelPod(t *testing.T, kube kubernetes.Interface, ns, name, key, value string) {
	t.Helper()
	patch := func(ctx context.Context, value any) error {
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}})
		if err == nil {
			_, err = kube.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		}
		return err
	}
	if err := patch(t.Context(), value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = patch(context.Background(), nil) })
}

// waitProbedPod waits until p runs with its net1 address, finds its
// network namespace in the CNI plugin's records, and serves the matrix's
// ports there.
func waitProbedPod(t *testing.T, kube kubernetes.Interface, dataDir string, p *probedPod) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, func(ctx context.Context) (bool, string) {
		got, err := kube.CoreV1().Pods(p.ns).Get(ctx, p.name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		allocations, _ := netselect.ParseAllocations(got.Annotations[netselect.AllocationsAnnotation])
		if got.Status.Phase != corev1.PodRunning || len(allocations) != 1 {
			return false, fmt.Sprintf("pod %s: %s, allocations %v", p, got.Status.Phase, allocations)
		}
		prefix, err := netip.ParsePrefix(allocations[0].IPs[0])
		if err != nil {
			return false, err.Error()
		}
		p.addr = prefix.Addr().String()
		var ok bool
		p.netns, ok, err = podprobe.Netns(dataDir, p.String())
		if err != nil {
			return false, err.Error()
		}
		return ok, fmt.Sprintf("no CNI record of pod %s under %s", p, dataDir)
	})
	t.Cleanup(func() { _ = p.netns.Close() })
	closeServers, err := podprobe.Serve(p.netns, matrixPorts)
	if err != nil {
		t.Fatalf("pod %s: %v", p, err)
	}
	t.Cleanup(closeServers)
}

// waitMatrix probes every pair of pods on every port until the matrix is
// what want expects, failing with the differences of the last probe.
func waitMatrix(t *testing.T, pods []*probedPod, want expectation) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, func(context.Context) (bool, string) {
		var mu sync.Mutex
		var wrong []string
		var wg sync.WaitGroup
		for _, from := range pods {
			for _, to := range pods {
				if from == to {
					continue
				}
				for _, port := range matrixPorts {
					wg.Go(func() {
						got, expected := podprobe.Reaches(from.netns, to.netns, to.addr, port), want(from, to, port)
						if got != expected {
							mu.Lock()
							wrong = append(wrong, fmt.Sprintf("%s→%s:%s %v (want %v)", from, to, port, got, expected))
							mu.Unlock()
						}
					})
				}
			}
		}
		wg.Wait()
		sort.Strings(wrong)
		return len(wrong) == 0, fmt.Sprintf("%d of the matrix differ: %s", len(wrong), strings.Join(wrong, ", "))
	})
}

// Issue 34 across nodes: on-1 (node 1) and on-3 (node 3) are pods of
// Network spans; the agents enforce policies on traffic that crosses the
// overlay: ingress allowed by a peer selector a pod is relabelled into,
// egress denied, replies of allowed flows passing both ways.
func checkOverlayPolicies(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, network string, addrs map[string]string) {
	t.Helper()
	ctx := t.Context()
	policies := versioned.NewForConfigOrDie(cfg).K8sCniCncfIoV1beta1().MultiNetworkPolicies("default")
	create := func(name string, spec v1beta1.MultiNetworkPolicySpec) {
		t.Helper()
		if _, err := policies.Create(ctx, &v1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{v1beta1.PolicyForAnnotation: network}}, Spec: spec}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = policies.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	pings := func(when string, want map[[2]string]bool) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
			var wrong []string
			for pair, reach := range want {
				if got := exitCode(t, cfg, kube, pair[0], "ping -c 1 -W 1 "+addrs[pair[1]]) == "0"; got != reach {
					wrong = append(wrong, fmt.Sprintf("%s pings %s: %v, want %v", pair[0], pair[1], got, reach))
				}
			}
			return len(wrong) == 0, when + ": " + strings.Join(wrong, "; ")
		})
	}
	create("on-3-from-friends", v1beta1.MultiNetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "on-3"}},
		Ingress: []v1beta1.MultiNetworkPolicyIngressRule{{From: []v1beta1.MultiNetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"friend": "yes"}}}}}}})
	pings("on-3 isolated in ingress", map[[2]string]bool{{"on-1", "on-3"}: false, {"on-3", "on-1"}: true})
	labelPod(t, kube, "default", "on-1", "friend", "yes")
	pings("on-1 a friend", map[[2]string]bool{{"on-1", "on-3"}: true, {"on-3", "on-1"}: true})
	create("on-1-no-egress", v1beta1.MultiNetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "on-1"}},
		PolicyTypes: []v1beta1.MultiPolicyType{v1beta1.PolicyTypeEgress}})
	pings("on-1 isolated in egress", map[[2]string]bool{{"on-1", "on-3"}: false, {"on-3", "on-1"}: true})
	for _, name := range []string{"on-3-from-friends", "on-1-no-egress"} {
		if err := policies.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pings("no policy", map[[2]string]bool{{"on-1", "on-3"}: true, {"on-3", "on-1"}: true})
}
