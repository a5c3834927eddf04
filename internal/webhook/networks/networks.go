// Package networks admits Networks: validation (a parsable cidr outside
// the reserved ranges, a gateway inside it, no overlap with any other
// Network in any namespace) and defaulting (the gateway, the controller's
// finalizer), so that bad Networks never reach the controller and a new one
// costs the controller a single write, its status.
package networks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/ipam"
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
// Network's cidrs) in a Network (the allocation controller's allocator),
// naming up to limit of them.
type AddressHolders interface {
	Held(n *samplecrdv2.Network, family netip.Prefix, limit int) (netselect.Holders, error)
	// HeldIn counts those that hold addresses in r.
	HeldIn(n *samplecrdv2.Network, r ipam.Range, limit int) (netselect.Holders, error)
}

// fieldsOf says how errors name the fields of a request's Network, given
// the Network it replaces on an update (nil on create): as its client
// wrote them, v1's spec.cidr and spec.gateway for a v1 client's Network of
// one family, so that the tutorial's users read about the fields they
// wrote; v2's list items otherwise (a v2 client, or a second family, which
// v1 keeps in an annotation).
func fieldsOf(req *admissionv1.AdmissionRequest, n, old *samplecrdv2.Network) netspec.Fields {
	return netspec.Fields{V1: req.Kind.Version == samplecrdv1.SchemeGroupVersion.Version && !dualStack(n) && (old == nil || !dualStack(old))}
}

// decode reads an admitted Network, of either version, as v2, the version
// netop's caches hold (a v1 Network's second family comes from the
// annotation that keeps it).
func (a *Admission) decode(raw runtime.RawExtension) (*samplecrdv2.Network, *admissionv1.AdmissionResponse) {
	n := &samplecrdv2.Network{}
	if err := a.Decoder.Decode(raw, n); err != nil {
		return nil, webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding Network: %v", err))
	}
	return n, nil
}

// decodeOld decodes the object an update replaces; nil when there is none
// or it cannot be read.
func (a *Admission) decodeOld(req *admissionv1.AdmissionRequest) *samplecrdv2.Network {
	if req.Operation != admissionv1.Update {
		return nil
	}
	old, denied := a.decode(req.OldObject)
	if denied != nil {
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
	n, denied := a.decode(req.Object)
	if denied != nil {
		return denied
	}
	old := a.decodeOld(req)
	// Metadata changes (the controller removing its finalizer) must never
	// be blocked by a spec that an older rule let in.
	if n.DeletionTimestamp != nil || old != nil && apiequality.Semantic.DeepEqual(old.Spec, n.Spec) {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	f := fieldsOf(req, n, old)
	families, errs := a.resolve(n, f)
	errs = append(errs, namespaceSelector(req, n)...)
	if len(errs) == 0 {
		errs = a.overlaps(ctx, n, f, families)
	}
	if len(errs) == 0 {
		errs = a.addressesHeld(old, f, families)
	}
	if len(errs) == 0 {
		errs = a.reservedHeld(old, n)
	}
	if len(errs) > 0 {
		klog.FromContext(ctx).V(2).Info("Rejected Network", "network", klog.KObj(n), "errors", errs.ToAggregate().Error())
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			fmt.Sprintf("Network %s is invalid: %s", n.Name, errs.ToAggregate().Error()))
	}
	if req.DryRun == nil || !*req.DryRun {
		a.CIDRs.Admitted(n)
	}
	return &admissionv1.AdmissionResponse{Allowed: true, Warnings: warnings(n, f, families)}
}

// namespaceSelector validates spec.namespaceSelector, or for a v1
// client the annotation that holds it (one that does not parse would be
// dropped, admitting the Network's own namespace only: refused instead).
func namespaceSelector(req *admissionv1.AdmissionRequest, n *samplecrdv2.Network) field.ErrorList {
	path := field.NewPath("spec", "namespaceSelector")
	if req.Kind.Version == samplecrdv1.SchemeGroupVersion.Version {
		path = field.NewPath("metadata", "annotations").Key(samplecrdv1.NamespaceSelectorAnnotation)
		var written metav1.PartialObjectMetadata
		if err := json.Unmarshal(req.Object.Raw, &written); err == nil {
			if value, ok := written.Annotations[samplecrdv1.NamespaceSelectorAnnotation]; ok {
				if _, err := samplecrdv1.ParseNamespaceSelector(value); err != nil {
					return field.ErrorList{field.Invalid(path, value, err.Error())}
				}
			}
		}
	}
	return metav1validation.ValidateLabelSelector(n.Spec.NamespaceSelector, metav1validation.LabelSelectorValidationOptions{}, path)
}

// dualStack reports whether n has a second family (or a second gateway
// without one, which resolving it refuses).
func dualStack(n *samplecrdv2.Network) bool {
	return len(n.Spec.CIDRs) > 1 || len(n.Spec.Gateways) > 1
}

// first is a list's first item, or "".
func first(list []string) string {
	if len(list) == 0 {
		return ""
	}
	return list[0]
}

// resolve resolves n's families as the controller will, with errors that
// name the fields as f does. A v1 client's Network is resolved as v1 shows
// it: its one family.
func (a *Admission) resolve(n *samplecrdv2.Network, f netspec.Fields) (netspec.Families, field.ErrorList) {
	var spec samplecrd.NetworkSpec
	switch {
	case f.V1 && len(n.Spec.CIDRs) == 0:
		// Named as v1 names a missing spec.cidr.
		spec.CIDRs, spec.Gateways = []string{""}, n.Spec.Gateways
	case f.V1:
		// At most one of each: Fields.V1 is for a Network of one family.
		spec.CIDRs, spec.Gateways = n.Spec.CIDRs, n.Spec.Gateways
	default:
		// v2's spec is the hub's field for field: a copy that cannot fail.
		_ = samplecrdv2.Convert_v2_NetworkSpec_To_samplecrd_NetworkSpec(&n.Spec, &spec, nil)
	}
	return a.Resolver.Resolve(&spec, f)
}

// overlaps finds another Network, in any namespace, whose cidrs overlap one
// of n's.
func (a *Admission) overlaps(ctx context.Context, n *samplecrdv2.Network, f netspec.Fields, families netspec.Families) field.ErrorList {
	for i, family := range families {
		other, ok, err := a.CIDRs.Overlapping(ctx, family.Prefix, n.Namespace, n.Name)
		if err != nil {
			return field.ErrorList{field.InternalError(f.CIDR(i), err)}
		}
		if ok {
			return field.ErrorList{field.Invalid(f.CIDR(i), n.Spec.CIDRs[i],
				fmt.Sprintf("overlaps Network %s/%s (%s)", other.Namespace, other.Name, other.Overlapping(family.Prefix)))}
		}
	}
	return nil
}

// addressesHeld refuses to move or remove a family of a Network that pods
// hold addresses of: they would keep addresses outside it. A family is
// matched to the old one of the same IP version; one may be added.
func (a *Admission) addressesHeld(old *samplecrdv2.Network, f netspec.Fields, families netspec.Families) field.ErrorList {
	if a.Addresses == nil || old == nil {
		return nil
	}
	was, errs := a.resolve(old, f)
	if len(errs) > 0 {
		return nil // nothing was allocated under a spec that does not resolve
	}
	for i, w := range was {
		j := slices.IndexFunc(families, func(r netspec.Resolved) bool { return r.Prefix.Addr().Is4() == w.Prefix.Addr().Is4() })
		if j >= 0 && families[j].Prefix == w.Prefix && families[j].Gateway == w.Gateway {
			continue
		}
		holders, err := a.Addresses.Held(old, w.Prefix, 3)
		if err != nil {
			return field.ErrorList{field.InternalError(field.NewPath("spec"), err)}
		}
		if holders.Count == 0 {
			continue
		}
		path, value := f.CIDR(i), old.Spec.CIDRs[i]
		if j >= 0 && families[j].Prefix == w.Prefix {
			path, value = f.Gateway(i), w.Gateway.String()
			if i < len(old.Spec.Gateways) {
				value = old.Spec.Gateways[i]
			}
		}
		return field.ErrorList{field.Forbidden(path, fmt.Sprintf("%s: it can change once they are gone (was %q)", holders, value))}
	}
	return nil
}

// reservedHeld refuses to reserve addresses that pods hold, naming them:
// they would keep addresses the Network says are for others. Entries the
// Network reserved already are not asked about again.
func (a *Admission) reservedHeld(old, n *samplecrdv2.Network) field.ErrorList {
	if a.Addresses == nil || old == nil {
		return nil
	}
	path := field.NewPath("spec", "reserved")
	for i, entry := range n.Spec.Reserved {
		if slices.Contains(old.Spec.Reserved, entry) {
			continue
		}
		r, err := netspec.ParseRange(entry)
		if err != nil {
			continue // refused by resolve already
		}
		holders, err := a.Addresses.HeldIn(old, r, 3)
		if err != nil {
			return field.ErrorList{field.InternalError(path.Index(i), err)}
		}
		if holders.Count > 0 {
			return field.ErrorList{field.Forbidden(path.Index(i), fmt.Sprintf("%s in %s: it can be reserved once they are gone", holders, r))}
		}
	}
	return nil
}

// warnings are about a spec that means something other than it says (host
// bits set) or says it in a form other than the canonical one (IPv6 in
// upper case or not compressed, worded as Kubernetes warns about its own
// fields), since the spec is stored as written.
func warnings(n *samplecrdv2.Network, f netspec.Fields, families netspec.Families) []string {
	var w []string
	for i, resolved := range families {
		cidr := n.Spec.CIDRs[i]
		switch {
		case !resolved.Canonical:
			w = append(w, fmt.Sprintf("%s %q has host bits set: it means the network %s", f.CIDR(i), cidr, resolved.Prefix))
		case resolved.Prefix.Addr().Is6() && cidr != resolved.Prefix.String():
			w = append(w, fmt.Sprintf("%s: IPv6 CIDR value %q should be in RFC 5952 canonical format (%q)", f.CIDR(i), cidr, resolved.Prefix))
		}
		if i < len(n.Spec.Gateways) {
			if gateway := n.Spec.Gateways[i]; gateway != "" && resolved.Gateway.Is6() && gateway != resolved.Gateway.String() {
				w = append(w, fmt.Sprintf("%s: IPv6 address %q should be in RFC 5952 canonical format (%q)", f.Gateway(i), gateway, resolved.Gateway))
			}
		}
	}
	return w
}

// Default fills in the gateways that are missing and adds the controller's
// finalizer on create, answering with a JSON patch of the version the
// client wrote.
func (a *Admission) Default(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	n, denied := a.decode(req.Object)
	if denied != nil {
		return denied
	}
	var ops []jsonpatch.Operation
	if gateways := a.defaultGateways(n, a.decodeOld(req)); !slices.Equal(gateways, n.Spec.Gateways) {
		gatewayOps, err := a.gatewayPatch(req, n, gateways)
		if err != nil {
			return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("defaulting Network %s: %v", n.Name, err))
		}
		ops = append(ops, gatewayOps...)
	}
	if req.Operation == admissionv1.Create && n.DeletionTimestamp == nil && !slices.Contains(n.Finalizers, samplecrd.Finalizer) {
		if len(n.Finalizers) == 0 {
			ops = append(ops, jsonpatch.NewOperation("add", "/metadata/finalizers", []string{samplecrd.Finalizer}))
		} else {
			ops = append(ops, jsonpatch.NewOperation("add", "/metadata/finalizers/-", samplecrd.Finalizer))
		}
	}
	return webhook.Patched(ops)
}

// defaultGateways are n's gateways with each missing one filled in (the
// first usable address of its cidr). A gateway that was defaulted stays in
// the spec; when its cidr moves and the gateway is still the old cidr's
// default, it moves too, or the user's `kubectl apply` of a new cidr alone
// would fail. An invalid cidr is left for validation to report.
func (a *Admission) defaultGateways(n, old *samplecrdv2.Network) []string {
	gateways := slices.Clone(n.Spec.Gateways)
	for i, cidr := range n.Spec.CIDRs {
		def, ok := a.defaultGateway(cidr)
		if !ok {
			continue
		}
		for len(gateways) <= i {
			gateways = append(gateways, "")
		}
		if gateways[i] == "" {
			gateways[i] = def
			continue
		}
		if old != nil && i < len(old.Spec.CIDRs) && old.Spec.CIDRs[i] != cidr {
			if was, ok := a.defaultGateway(old.Spec.CIDRs[i]); ok && was == gateways[i] {
				gateways[i] = def
			}
		}
	}
	return gateways
}

// defaultGateway is the gateway a cidr gets when none is given.
func (a *Admission) defaultGateway(cidr string) (string, bool) {
	families, errs := a.Resolver.Resolve(&samplecrd.NetworkSpec{CIDRs: []string{cidr}}, netspec.Fields{})
	if len(errs) > 0 {
		return "", false
	}
	return families[0].Gateway.String(), true
}

// gatewayPatch sets n's gateways to gateways in the version the client
// wrote: v2's spec.gateways; v1's spec.gateway and, for a second family,
// the annotation that keeps the families v1 lacks.
func (a *Admission) gatewayPatch(req *admissionv1.AdmissionRequest, n *samplecrdv2.Network, gateways []string) ([]jsonpatch.Operation, error) {
	if req.Kind.Version != samplecrdv1.SchemeGroupVersion.Version {
		return []jsonpatch.Operation{jsonpatch.NewOperation("add", "/spec/gateways", gateways)}, nil
	}
	defaulted := n.DeepCopy()
	defaulted.Spec.Gateways = gateways
	v1 := &samplecrdv1.Network{}
	if err := a.Decoder.Convert(defaulted, v1); err != nil {
		return nil, err
	}
	var ops []jsonpatch.Operation
	if v1.Spec.Gateway != first(n.Spec.Gateways) {
		ops = append(ops, jsonpatch.NewOperation("add", "/spec/gateway", v1.Spec.Gateway))
	}
	// The annotation's first items are v1's fields: it changes with the
	// second gateway only.
	if secondChanged := len(gateways) > 1 && (len(n.Spec.Gateways) < 2 || n.Spec.Gateways[1] != gateways[1]); secondChanged {
		families := v1.Annotations[samplecrdv1.SpecFamiliesAnnotation]
		key := strings.ReplaceAll(samplecrdv1.SpecFamiliesAnnotation, "/", "~1")
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations/"+key, families))
	}
	return ops, nil
}
