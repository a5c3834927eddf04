// Package networks admits Networks: validation (a parsable cidr outside
// the reserved ranges, a gateway inside it, no overlap with any other
// Network in any namespace) and defaulting (the gateway, the controller's
// finalizer), so that bad Networks never reach the controller and a new one
// costs the controller a single write, its status.
package networks

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Admission holds what the Network webhooks need: every Network's cidr,
// from an informer, for the overlap check (no List per request), and the
// decoder of admitted objects.
type Admission struct {
	CIDRs   *CIDRs
	Decoder *webhook.Decoder
	// Resolver says what a spec means; the controller uses the same
	// policy (--allow-reserved-prefixes).
	Resolver netspec.Resolver
	// Addresses, if set, says which pods hold a Network's addresses: its
	// cidr and gateway cannot change under them.
	Addresses AddressHolders
}

// AddressHolders counts the pods that hold addresses of family (one of the
// Network's cidrs) in a Network (the allocation controller), naming up to
// limit of them.
type AddressHolders interface {
	Held(n *samplecrdv2.Network, family netip.Prefix, limit int) (netselect.Holders, error)
}

func (a *Admission) decode(req *admissionv1.AdmissionRequest) (*samplecrdv1.Network, *admissionv1.AdmissionResponse) {
	n := &samplecrdv1.Network{}
	if err := a.Decoder.Decode(req.Object, n); err != nil {
		return nil, webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding Network: %v", err))
	}
	return n, nil
}

// decodeOld decodes the object an update replaces; nil when it cannot.
func (a *Admission) decodeOld(req *admissionv1.AdmissionRequest) *samplecrdv1.Network {
	old := &samplecrdv1.Network{}
	if a.Decoder.Decode(req.OldObject, old) != nil {
		return nil
	}
	return old
}

// Validate rejects Networks that cannot be realised, with messages that
// name the field, and warns about a cidr with host bits set.
func (a *Admission) Validate(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	n, denied := a.decode(req)
	if denied != nil {
		return denied
	}
	if req.Operation == admissionv1.Update {
		// Metadata changes (the controller removing its finalizer) must
		// never be blocked by a spec that an older rule let in.
		if old := a.decodeOld(req); n.DeletionTimestamp != nil || old != nil && old.Spec == n.Spec &&
			old.Annotations[samplecrdv1.SpecFamiliesAnnotation] == n.Annotations[samplecrdv1.SpecFamiliesAnnotation] {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
	}
	stored, err := toV2(n)
	if err != nil {
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("converting Network %s: %v", n.Name, err))
	}
	families, errs := a.resolve(n, stored)
	if len(errs) == 0 {
		errs = a.overlaps(n, stored, families)
	}
	if len(errs) == 0 && req.Operation == admissionv1.Update {
		errs = a.addressesHeld(a.decodeOld(req), stored, families)
	}
	if len(errs) > 0 {
		klog.FromContext(ctx).V(2).Info("Rejected Network", "network", klog.KObj(n), "errors", errs.ToAggregate().Error())
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			fmt.Sprintf("Network %s is invalid: %s", n.Name, errs.ToAggregate().Error()))
	}
	return &admissionv1.AdmissionResponse{Allowed: true, Warnings: warnings(n.Spec, families[0])}
}

// toV2 converts an admitted v1 Network, with the families its annotation
// keeps, to v2, the version netop's caches hold, through the hub.
func toV2(n *samplecrdv1.Network) (*samplecrdv2.Network, error) {
	hub := &samplecrd.Network{}
	if err := samplecrdv1.Convert_v1_Network_To_samplecrd_Network(n, hub, nil); err != nil {
		return nil, err
	}
	out := &samplecrdv2.Network{}
	if err := samplecrdv2.Convert_samplecrd_Network_To_v2_Network(hub, out, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// dualStack reports whether stored has a second family (or a second
// gateway without one, which resolving it refuses).
func dualStack(stored *samplecrdv2.Network) bool {
	return len(stored.Spec.CIDRs) > 1 || len(stored.Spec.Gateways) > 1
}

// resolve resolves n's families as the controller will. A Network of one
// family is resolved as v1 sees it, so that the tutorial's users read
// errors about spec.cidr; a second family, from a v2 client or the
// annotation that keeps it in v1, is resolved as v2, naming spec.cidrs[i].
func (a *Admission) resolve(n *samplecrdv1.Network, stored *samplecrdv2.Network) (netspec.Families, field.ErrorList) {
	if dualStack(stored) {
		return a.Resolver.ResolveFamilies(stored.Spec)
	}
	resolved, errs := a.Resolver.Resolve(n.Spec)
	if len(errs) > 0 {
		return nil, errs
	}
	return netspec.Families{resolved}, nil
}

// overlaps finds another Network, in any namespace, whose cidrs overlap one
// of n's.
func (a *Admission) overlaps(n *samplecrdv1.Network, stored *samplecrdv2.Network, families netspec.Families) field.ErrorList {
	for i, f := range families {
		other, ok := a.CIDRs.Overlapping(f.Prefix, n.Namespace, n.Name)
		if !ok {
			continue
		}
		path, value := field.NewPath("spec", "cidr"), n.Spec.CIDR
		if dualStack(stored) {
			path, value = field.NewPath("spec", "cidrs").Index(i), stored.Spec.CIDRs[i]
		}
		return field.ErrorList{field.Invalid(path, value, fmt.Sprintf("overlaps Network %s/%s (%s)", other.Namespace, other.Name, other.Overlapping(f.Prefix)))}
	}
	return nil
}

// addressesHeld refuses to move or remove a family of a Network that pods
// hold addresses of: they would keep addresses outside it. A family is
// matched to the old one of the same IP version; one may be added.
func (a *Admission) addressesHeld(old *samplecrdv1.Network, n *samplecrdv2.Network, families netspec.Families) field.ErrorList {
	if a.Addresses == nil || old == nil {
		return nil
	}
	stored, err := toV2(old)
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("spec"), err)}
	}
	was, errs := a.resolve(old, stored)
	if len(errs) > 0 {
		return nil // nothing was allocated under a spec that does not resolve
	}
	for i, w := range was {
		j := slices.IndexFunc(families, func(f netspec.Resolved) bool { return f.Prefix.Addr().Is4() == w.Prefix.Addr().Is4() })
		if j >= 0 && families[j].Prefix == w.Prefix && families[j].Gateway == w.Gateway {
			continue
		}
		holders, err := a.Addresses.Held(stored, w.Prefix, 3)
		if err != nil {
			return field.ErrorList{field.InternalError(field.NewPath("spec"), err)}
		}
		if holders.Count == 0 {
			continue
		}
		// The path is the field that changed, as the client wrote it: v1's
		// fields for a Network of one family, v2's items otherwise.
		cidr, gateway := field.NewPath("spec", "cidr"), field.NewPath("spec", "gateway")
		if dualStack(stored) || dualStack(n) {
			cidr, gateway = field.NewPath("spec", "cidrs").Index(i), field.NewPath("spec", "gateways").Index(i)
		}
		path, value := cidr, stored.Spec.CIDRs[i]
		if j >= 0 && families[j].Prefix == w.Prefix {
			path, value = gateway, w.Gateway.String()
			if i < len(stored.Spec.Gateways) {
				value = stored.Spec.Gateways[i]
			}
		}
		return field.ErrorList{field.Forbidden(path, fmt.Sprintf("%s: it can change once they are gone (was %q)", holders, value))}
	}
	return nil
}

// warnings are about a spec that means something other than it says (host
// bits set) or says it in a form other than the canonical one (IPv6 in
// upper case or not compressed, worded as Kubernetes warns about its own
// fields), since the spec is stored as written.
func warnings(spec samplecrdv1.NetworkSpec, resolved netspec.Resolved) []string {
	var w []string
	switch {
	case !resolved.Canonical:
		w = append(w, fmt.Sprintf("spec.cidr %q has host bits set: it means the network %s", spec.CIDR, resolved.Prefix))
	case resolved.Prefix.Addr().Is6() && spec.CIDR != resolved.Prefix.String():
		w = append(w, fmt.Sprintf("spec.cidr: IPv6 CIDR value %q should be in RFC 5952 canonical format (%q)", spec.CIDR, resolved.Prefix))
	}
	if spec.Gateway != "" && resolved.Gateway.Is6() && spec.Gateway != resolved.Gateway.String() {
		w = append(w, fmt.Sprintf("spec.gateway: IPv6 address %q should be in RFC 5952 canonical format (%q)", spec.Gateway, resolved.Gateway))
	}
	return w
}

// Default fills in the gateway when it is missing and adds the
// controller's finalizer on create, answering with a JSON patch.
func (a *Admission) Default(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	n, denied := a.decode(req)
	if denied != nil {
		return denied
	}
	var ops []jsonpatch.Operation
	if req.Operation == admissionv1.Update && n.Spec.Gateway != "" {
		// A gateway that was defaulted stays in the spec; when the cidr
		// moves and the gateway is still the old default, it moves too,
		// or the user's `kubectl apply` of a new cidr alone would fail.
		if old := a.decodeOld(req); old != nil && old.Spec.CIDR != n.Spec.CIDR {
			if oldResolved, errs := a.Resolver.Resolve(samplecrdv1.NetworkSpec{CIDR: old.Spec.CIDR}); len(errs) == 0 && oldResolved.Gateway.String() == n.Spec.Gateway {
				if resolved, errs := a.Resolver.Resolve(samplecrdv1.NetworkSpec{CIDR: n.Spec.CIDR}); len(errs) == 0 {
					ops = append(ops, jsonpatch.NewOperation("replace", "/spec/gateway", resolved.Gateway.String()))
				}
			}
		}
	}
	if n.Spec.Gateway == "" {
		// An invalid cidr is left for validation to report.
		if resolved, errs := a.Resolver.Resolve(n.Spec); len(errs) == 0 {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/gateway", resolved.Gateway.String()))
		}
	}
	if op, ok := a.defaultSecondGateway(n); ok {
		ops = append(ops, op)
	}
	if req.Operation == admissionv1.Create && n.DeletionTimestamp == nil && !slices.Contains(n.Finalizers, samplecrdv1.Finalizer) {
		if len(n.Finalizers) == 0 {
			ops = append(ops, jsonpatch.NewOperation("add", "/metadata/finalizers", []string{samplecrdv1.Finalizer}))
		} else {
			ops = append(ops, jsonpatch.NewOperation("add", "/metadata/finalizers/-", samplecrdv1.Finalizer))
		}
	}
	return webhook.Patched(ops)
}

// defaultSecondGateway fills in the gateway of a second family that has
// none, in the annotation that keeps the families in v1 (v2's
// spec.gateways[1]), as Default does for the first in spec.gateway. An
// invalid cidr is left for validation to report.
func (a *Admission) defaultSecondGateway(n *samplecrdv1.Network) (jsonpatch.Operation, bool) {
	stored, err := toV2(n)
	if err != nil || len(stored.Spec.CIDRs) != 2 || len(stored.Spec.Gateways) == 2 && stored.Spec.Gateways[1] != "" {
		return jsonpatch.Operation{}, false
	}
	second, errs := a.Resolver.Resolve(samplecrdv1.NetworkSpec{CIDR: stored.Spec.CIDRs[1]})
	if len(errs) > 0 {
		return jsonpatch.Operation{}, false
	}
	stored.Spec.Gateways = []string{n.Spec.Gateway, second.Gateway.String()}
	hub := &samplecrd.Network{}
	v1 := &samplecrdv1.Network{}
	if samplecrdv2.Convert_v2_Network_To_samplecrd_Network(stored, hub, nil) != nil || samplecrdv1.Convert_samplecrd_Network_To_v1_Network(hub, v1, nil) != nil {
		return jsonpatch.Operation{}, false
	}
	key := strings.ReplaceAll(samplecrdv1.SpecFamiliesAnnotation, "/", "~1")
	return jsonpatch.NewOperation("replace", "/metadata/annotations/"+key, v1.Annotations[samplecrdv1.SpecFamiliesAnnotation]), true
}
