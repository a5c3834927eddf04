// Package netpolicy resolves MultiNetworkPolicies into what a node's
// firewall enforces: for each policy, the interfaces of the pods it
// selects on the netop Networks its policy-for annotation names, and its
// rules with their peers as interfaces and blocks and its ports resolved
// (named ports from the destination pods' containers). It follows
// NetworkPolicy's semantics: policies are namespaced, a podSelector-only
// peer is of the policy's namespace, unset policyTypes are Ingress and
// Egress if there are egress rules, and the allowed is the union of what
// every policy selecting a pod allows.
//
// A policy names a Network it may use only if the Network exists and
// admits the policy's namespace (the tenancy rules of who may join it):
// otherwise that Network is not enforced, and Outcome says why.
package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netpolicy/resolved"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/tenancy"
	"github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Inputs are what the policies are resolved against.
type Inputs struct {
	Policies []*v1beta1.MultiNetworkPolicy
	Pods     []*corev1.Pod
	// NamespaceLabels are the labels of each namespace.
	NamespaceLabels map[string]map[string]string
	// Network returns the Network of namespace/name, or nil.
	Network func(namespace, name string) *samplecrdv2.Network
}

// Outcome is what one policy comes to.
type Outcome struct {
	// Networks are the netop Networks it applies to, namespace/name.
	Networks []string
	// Pods is how many pods it selects on them.
	Pods int
	// Problems say what of it is not enforced, and why.
	Problems []string
}

// Resolve resolves in's policies. The firewall's policies are in the
// order of the policies' namespace/name; outcomes are by namespace/name.
func Resolve(in Inputs) (resolved.Policies, map[string]*Outcome) {
	if len(in.Policies) == 0 {
		// Pods change often; without a policy they cost nothing.
		return nil, map[string]*Outcome{}
	}
	pods := indexPods(in.Pods)
	policies := slices.Clone(in.Policies)
	slices.SortFunc(policies, func(a, b *v1beta1.MultiNetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var out resolved.Policies
	outcomes := make(map[string]*Outcome, len(policies))
	for _, p := range policies {
		key := p.Namespace + "/" + p.Name
		o := &Outcome{}
		outcomes[key] = o
		r := resolver{in: in, pods: pods, policy: p, outcome: o}
		if pol, ok := r.resolve(); ok {
			pol.Name = key
			out = append(out, pol)
		}
	}
	return out, outcomes
}

// pod is a pod as policies see it: its interfaces on each Network
// (namespace/name) and its named ports.
type pod struct {
	namespace  string
	labels     labels.Set
	interfaces map[string][]resolved.Endpoint
	ports      map[string][]namedPort
}

type namedPort struct {
	protocol uint8
	port     uint16
}

// indexPods are the pods that hold interfaces: not finished, with
// allocations.
func indexPods(list []*corev1.Pod) []pod {
	out := make([]pod, 0, len(list))
	for _, p := range list {
		if netselect.Finished(p) {
			continue
		}
		allocations, err := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
		if err != nil || len(allocations) == 0 {
			continue
		}
		ip := pod{namespace: p.Namespace, labels: p.Labels, interfaces: map[string][]resolved.Endpoint{}}
		for _, a := range allocations {
			bridge := ifname.Bridge(a.NetworkUID)
			for _, s := range a.IPs {
				if prefix, err := netip.ParsePrefix(s); err == nil {
					ip.interfaces[a.Network] = append(ip.interfaces[a.Network], resolved.Endpoint{Bridge: bridge, Addr: prefix.Addr()})
				}
			}
		}
		for _, c := range p.Spec.Containers {
			for _, port := range c.Ports {
				if port.Name == "" {
					continue
				}
				if ip.ports == nil {
					ip.ports = map[string][]namedPort{}
				}
				ip.ports[port.Name] = append(ip.ports[port.Name], namedPort{protocol: protocolNumber(port.Protocol), port: uint16(port.ContainerPort)})
			}
		}
		out = append(out, ip)
	}
	return out
}

func protocolNumber(p corev1.Protocol) uint8 {
	switch p {
	case corev1.ProtocolUDP:
		return unix.IPPROTO_UDP
	case corev1.ProtocolSCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}

// resolver resolves one policy.
type resolver struct {
	in      Inputs
	pods    []pod
	policy  *v1beta1.MultiNetworkPolicy
	outcome *Outcome
	// networks are the Networks the policy applies to, namespace/name.
	networks []string
}

func (r *resolver) problem(format string, args ...any) {
	r.outcome.Problems = append(r.outcome.Problems, fmt.Sprintf(format, args...))
}

func (r *resolver) resolve() (resolved.Policy, bool) {
	p := r.policy
	r.networks = r.policyFor()
	r.outcome.Networks = r.networks
	if len(r.networks) == 0 {
		return resolved.Policy{}, false
	}
	podSelector, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil {
		r.problem("spec.podSelector: %v", err)
		return resolved.Policy{}, false
	}
	var selected []pod
	var selectedEndpoints []resolved.Endpoint
	for _, candidate := range r.pods {
		if candidate.namespace != p.Namespace || !podSelector.Matches(candidate.labels) {
			continue
		}
		if endpoints := r.endpoints(candidate); len(endpoints) > 0 {
			selected = append(selected, candidate)
			selectedEndpoints = append(selectedEndpoints, endpoints...)
		}
	}
	r.outcome.Pods = len(selected)
	ingress, egress := false, len(p.Spec.Egress) > 0
	if len(p.Spec.PolicyTypes) == 0 {
		ingress = true
	} else {
		ingress = slices.Contains(p.Spec.PolicyTypes, v1beta1.PolicyTypeIngress)
		egress = slices.Contains(p.Spec.PolicyTypes, v1beta1.PolicyTypeEgress)
	}
	out := resolved.Policy{}
	if ingress {
		d := &resolved.PolicyDirection{Selected: selectedEndpoints}
		for i, rule := range p.Spec.Ingress {
			// The destinations of ingress, whose ports are named, are the
			// selected pods.
			d.Rules = append(d.Rules, r.rule(fmt.Sprintf("spec.ingress[%d]", i), rule.From, rule.Ports, selected))
		}
		out.Ingress = d
	}
	if egress {
		d := &resolved.PolicyDirection{Selected: selectedEndpoints}
		for i, rule := range p.Spec.Egress {
			d.Rules = append(d.Rules, r.rule(fmt.Sprintf("spec.egress[%d]", i), rule.To, rule.Ports, r.pods))
		}
		out.Egress = d
	}
	return out, true
}

// policyFor are the Networks the policy-for annotation names that exist
// and admit the policy's namespace.
func (r *resolver) policyFor() []string {
	p := r.policy
	annotation, ok := p.Annotations[v1beta1.PolicyForAnnotation]
	if !ok {
		r.problem("it has no %s annotation naming the Networks it is for", v1beta1.PolicyForAnnotation)
		return nil
	}
	var out []string
	for _, ref := range strings.Split(strings.ReplaceAll(annotation, " ", ""), ",") {
		if ref == "" {
			continue
		}
		namespace, name, found := strings.Cut(ref, "/")
		if !found {
			namespace, name = p.Namespace, ref
		}
		key := namespace + "/" + name
		n := r.in.Network(namespace, name)
		if n == nil {
			r.problem("Network %s: no such netop Network", key)
			continue
		}
		if err := tenancy.Admits(n, p.Namespace, r.in.NamespaceLabels[p.Namespace]); err != nil {
			var refused *tenancy.NotAdmittedError
			if errors.As(err, &refused) {
				r.problem("Network %s: policies of namespace %s may not apply to it, as its pods may not join it: %s", key, p.Namespace, refused.Why)
			} else {
				r.problem("Network %s: %v", key, err)
			}
			continue
		}
		if !slices.Contains(out, key) {
			out = append(out, key)
		}
	}
	if len(out) == 0 && len(r.outcome.Problems) == 0 {
		r.problem("its %s annotation names no Network", v1beta1.PolicyForAnnotation)
	}
	return out
}

// endpoints are p's interfaces on the policy's Networks.
func (r *resolver) endpoints(p pod) []resolved.Endpoint {
	var out []resolved.Endpoint
	for _, n := range r.networks {
		out = append(out, p.interfaces[n]...)
	}
	return out
}

// rule resolves one rule: its peers and its ports, named ones on
// destinations.
func (r *resolver) rule(path string, peers []v1beta1.MultiNetworkPolicyPeer, ports []v1beta1.MultiNetworkPolicyPort, destinations []pod) resolved.PolicyRule {
	out := resolved.PolicyRule{AnyPeer: len(peers) == 0}
	for i, peer := range peers {
		peerPath := fmt.Sprintf("%s.peers[%d]", path, i)
		if peer.IPBlock != nil {
			if b, err := block(peer.IPBlock); err != nil {
				r.problem("%s.ipBlock: %v", peerPath, err)
			} else {
				out.Blocks = append(out.Blocks, b)
			}
			continue
		}
		out.PodPeers = true
		matches, err := r.peerMatcher(peer)
		if err != nil {
			r.problem("%s: %v", peerPath, err)
			continue
		}
		for _, p := range r.pods {
			if matches(p) {
				out.Pods = append(out.Pods, r.endpoints(p)...)
			}
		}
	}
	names := map[string]uint8{}
	for i, port := range ports {
		protocol := protocolNumber(corev1.Protocol(ptr.Deref(port.Protocol, v1beta1.ProtocolTCP)))
		switch {
		case port.Port == nil:
			out.Ports = append(out.Ports, resolved.PortRange{Protocol: protocol})
		case port.Port.Type == intstr.String:
			out.NamedPorts = true
			names[port.Port.StrVal] = protocol
		default:
			first := port.Port.IntVal
			last := first
			if port.EndPort != nil {
				last = *port.EndPort
			}
			if first < 1 || last > 65535 || last < first {
				r.problem("%s.ports[%d]: no port from %d to %d", path, i, first, last)
				continue
			}
			out.Ports = append(out.Ports, resolved.PortRange{Protocol: protocol, First: uint16(first), Last: uint16(last)})
		}
	}
	if len(names) > 0 {
		for _, d := range destinations {
			endpoints := r.endpoints(d)
			for name, protocol := range names {
				for _, np := range d.ports[name] {
					if np.protocol != protocol {
						continue
					}
					for _, e := range endpoints {
						out.Named = append(out.Named, resolved.PortEndpoint{Endpoint: e, Protocol: protocol, Port: np.port})
					}
				}
			}
		}
	}
	return out
}

// peerMatcher tells the pods a selector peer selects: with a
// namespaceSelector, of the namespaces it selects; without, of the
// policy's namespace.
func (r *resolver) peerMatcher(peer v1beta1.MultiNetworkPolicyPeer) (func(pod) bool, error) {
	podSelector := labels.Everything()
	if peer.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			return nil, fmt.Errorf("podSelector: %w", err)
		}
		podSelector = s
	}
	if peer.NamespaceSelector == nil {
		ns := r.policy.Namespace
		return func(p pod) bool { return p.namespace == ns && podSelector.Matches(p.labels) }, nil
	}
	nsSelector, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
	if err != nil {
		return nil, fmt.Errorf("namespaceSelector: %w", err)
	}
	return func(p pod) bool {
		return nsSelector.Matches(labels.Set(r.in.NamespaceLabels[p.namespace])) && podSelector.Matches(p.labels)
	}, nil
}

// block parses an ipBlock, for CRDs installed without netop's validation.
func block(b *v1beta1.IPBlock) (resolved.Block, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return resolved.Block{}, fmt.Errorf("cidr: %w", err)
	}
	out := resolved.Block{CIDR: cidr.Masked()}
	for _, e := range b.Except {
		except, err := netip.ParsePrefix(e)
		if err != nil {
			return resolved.Block{}, fmt.Errorf("except: %w", err)
		}
		if !cidr.Contains(except.Addr()) || except.Bits() <= cidr.Bits() {
			return resolved.Block{}, fmt.Errorf("except %s is not inside cidr %s", e, b.CIDR)
		}
		out.Except = append(out.Except, except.Masked())
	}
	return out, nil
}
