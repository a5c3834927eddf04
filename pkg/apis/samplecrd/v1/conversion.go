package v1

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// v1 has one address family where the hub has one or two. A hub Network
// read as v1 shows its first cidr, gateway and subnet; the lists whole
// are kept in these annotations, as Kubernetes keeps the fields an old
// version lacks (autoscaling/v1's HorizontalPodAutoscaler), so that a v1
// client's update keeps the second family: converting back, the lists
// come from the annotation with their first entry from the v1 fields,
// which the client may have changed.
const (
	// SpecFamiliesAnnotation holds spec.cidrs and spec.gateways.
	SpecFamiliesAnnotation = GroupName + "/spec-families"
	// StatusFamiliesAnnotation holds status.cidrs, status.gateways and
	// status.backend.subnetIDs.
	StatusFamiliesAnnotation = GroupName + "/status-families"
	// NamespaceSelectorAnnotation holds spec.namespaceSelector, as JSON.
	NamespaceSelectorAnnotation = GroupName + "/namespace-selector"
	// SpecShapeAnnotation holds the fields of v2's spec that shape a
	// Network and that v1 has none of (spec.reserved, spec.routes,
	// spec.mtu, spec.egress's mode), as JSON.
	SpecShapeAnnotation = GroupName + "/spec-shape"
)

// shape is what SpecShapeAnnotation holds.
type shape struct {
	Reserved []string     `json:"reserved,omitempty"`
	Routes   []shapeRoute `json:"routes,omitempty"`
	MTU      int32        `json:"mtu,omitempty"`
	Egress   *shapeEgress `json:"egress,omitempty"`
}

type shapeEgress struct {
	Mode string `json:"mode"`
}

type shapeRoute struct {
	Destination string `json:"destination"`
	Via         string `json:"via,omitempty"`
}

func shapeOf(spec *samplecrd.NetworkSpec) shape {
	s := shape{Reserved: spec.Reserved, MTU: spec.MTU}
	if spec.Egress != nil {
		s.Egress = &shapeEgress{Mode: string(spec.Egress.Mode)}
	}
	for _, r := range spec.Routes {
		s.Routes = append(s.Routes, shapeRoute(r))
	}
	return s
}

func (s shape) empty() bool {
	return len(s.Reserved) == 0 && len(s.Routes) == 0 && s.MTU == 0 && s.Egress == nil
}

func (s shape) restore(spec *samplecrd.NetworkSpec) {
	spec.Reserved, spec.MTU = s.Reserved, s.MTU
	if s.Egress != nil {
		spec.Egress = &samplecrd.NetworkEgress{Mode: samplecrd.EgressMode(s.Egress.Mode)}
	}
	for _, r := range s.Routes {
		spec.Routes = append(spec.Routes, samplecrd.NetworkRoute(r))
	}
}

// families are the hub's per-family lists, as an annotation holds them.
type families struct {
	CIDRs     []string `json:"cidrs,omitempty"`
	Gateways  []string `json:"gateways,omitempty"`
	SubnetIDs []string `json:"subnetIDs,omitempty"`
}

// first is what a v1 field shows of a hub list.
func first(list []string) string {
	if len(list) == 0 {
		return ""
	}
	return list[0]
}

// fromField is the hub list of a v1 field alone.
func fromField(field string) []string {
	if field == "" {
		return nil
	}
	return []string{field}
}

// fits says whether a v1 field holds the list whole.
func fits(list []string) bool {
	return len(list) == 0 || len(list) == 1 && list[0] != ""
}

// restore is the hub list: the annotation's, its first entry the v1
// field's; the v1 field alone without one.
func restore(kept []string, field string) []string {
	if len(kept) == 0 {
		return fromField(field)
	}
	out := append([]string(nil), kept...)
	out[0] = field
	return out
}

// Convert_v1_NetworkSpec_To_samplecrd_NetworkSpec converts the primary
// family; Convert_v1_Network_To_samplecrd_Network adds the others.
func Convert_v1_NetworkSpec_To_samplecrd_NetworkSpec(in *NetworkSpec, out *samplecrd.NetworkSpec, _ conversion.Scope) error {
	out.CIDRs, out.Gateways = fromField(in.CIDR), fromField(in.Gateway)
	return nil
}

// Convert_samplecrd_NetworkSpec_To_v1_NetworkSpec converts the primary
// family; Convert_samplecrd_Network_To_v1_Network keeps the others.
func Convert_samplecrd_NetworkSpec_To_v1_NetworkSpec(in *samplecrd.NetworkSpec, out *NetworkSpec, _ conversion.Scope) error {
	out.CIDR, out.Gateway = first(in.CIDRs), first(in.Gateways)
	return nil
}

// Convert_v1_NetworkStatus_To_samplecrd_NetworkStatus converts the
// primary family.
func Convert_v1_NetworkStatus_To_samplecrd_NetworkStatus(in *NetworkStatus, out *samplecrd.NetworkStatus, s conversion.Scope) error {
	if err := autoConvert_v1_NetworkStatus_To_samplecrd_NetworkStatus(in, out, s); err != nil {
		return err
	}
	out.CIDRs, out.Gateways = fromField(in.CIDR), fromField(in.Gateway)
	return nil
}

// Convert_samplecrd_NetworkStatus_To_v1_NetworkStatus converts the
// primary family.
func Convert_samplecrd_NetworkStatus_To_v1_NetworkStatus(in *samplecrd.NetworkStatus, out *NetworkStatus, s conversion.Scope) error {
	if err := autoConvert_samplecrd_NetworkStatus_To_v1_NetworkStatus(in, out, s); err != nil {
		return err
	}
	out.CIDR, out.Gateway = first(in.CIDRs), first(in.Gateways)
	return nil
}

// Convert_v1_NetworkBackendStatus_To_samplecrd_NetworkBackendStatus
// converts the primary family's subnet.
func Convert_v1_NetworkBackendStatus_To_samplecrd_NetworkBackendStatus(in *NetworkBackendStatus, out *samplecrd.NetworkBackendStatus, s conversion.Scope) error {
	if err := autoConvert_v1_NetworkBackendStatus_To_samplecrd_NetworkBackendStatus(in, out, s); err != nil {
		return err
	}
	out.SubnetIDs = fromField(in.SubnetID)
	return nil
}

// Convert_samplecrd_NetworkBackendStatus_To_v1_NetworkBackendStatus
// converts the primary family's subnet.
func Convert_samplecrd_NetworkBackendStatus_To_v1_NetworkBackendStatus(in *samplecrd.NetworkBackendStatus, out *NetworkBackendStatus, s conversion.Scope) error {
	if err := autoConvert_samplecrd_NetworkBackendStatus_To_v1_NetworkBackendStatus(in, out, s); err != nil {
		return err
	}
	out.SubnetID = first(in.SubnetIDs)
	return nil
}

// Convert_v1_Network_To_samplecrd_Network converts a v1 Network, with the
// families its annotations keep.
func Convert_v1_Network_To_samplecrd_Network(in *Network, out *samplecrd.Network, s conversion.Scope) error {
	if err := autoConvert_v1_Network_To_samplecrd_Network(in, out, s); err != nil {
		return err
	}
	out.Spec.NamespaceSelector = takeSelector(&out.ObjectMeta)
	takeShape(&out.ObjectMeta).restore(&out.Spec)
	spec, hasSpec := takeAnnotation(&out.ObjectMeta, SpecFamiliesAnnotation)
	status, hasStatus := takeAnnotation(&out.ObjectMeta, StatusFamiliesAnnotation)
	if hasSpec {
		out.Spec.CIDRs = restore(spec.CIDRs, in.Spec.CIDR)
		out.Spec.Gateways = restore(spec.Gateways, in.Spec.Gateway)
	}
	if hasStatus {
		out.Status.CIDRs = restore(status.CIDRs, in.Status.CIDR)
		out.Status.Gateways = restore(status.Gateways, in.Status.Gateway)
		if in.Status.Backend != nil {
			out.Status.Backend.SubnetIDs = restore(status.SubnetIDs, in.Status.Backend.SubnetID)
		}
	}
	return nil
}

// Convert_samplecrd_Network_To_v1_Network converts to a v1 Network,
// keeping in annotations the families v1 cannot show.
func Convert_samplecrd_Network_To_v1_Network(in *samplecrd.Network, out *Network, s conversion.Scope) error {
	if err := autoConvert_samplecrd_Network_To_v1_Network(in, out, s); err != nil {
		return err
	}
	// The hub's own map stays as it is.
	out.Annotations = maps.Clone(in.Annotations)
	delete(out.Annotations, SpecFamiliesAnnotation)
	delete(out.Annotations, StatusFamiliesAnnotation)
	delete(out.Annotations, NamespaceSelectorAnnotation)
	delete(out.Annotations, SpecShapeAnnotation)
	if s := shapeOf(&in.Spec); !s.empty() {
		value, _ := json.Marshal(s) // strings only: cannot fail
		setValue(&out.ObjectMeta, SpecShapeAnnotation, string(value))
	}
	if in.Spec.NamespaceSelector != nil {
		value, _ := json.Marshal(in.Spec.NamespaceSelector) // strings only: cannot fail
		setValue(&out.ObjectMeta, NamespaceSelectorAnnotation, string(value))
	}
	if !fits(in.Spec.CIDRs) || !fits(in.Spec.Gateways) {
		setAnnotation(&out.ObjectMeta, SpecFamiliesAnnotation, families{CIDRs: in.Spec.CIDRs, Gateways: in.Spec.Gateways})
	}
	var subnets []string
	if in.Status.Backend != nil {
		subnets = in.Status.Backend.SubnetIDs
	}
	if !fits(in.Status.CIDRs) || !fits(in.Status.Gateways) || !fits(subnets) {
		setAnnotation(&out.ObjectMeta, StatusFamiliesAnnotation, families{CIDRs: in.Status.CIDRs, Gateways: in.Status.Gateways, SubnetIDs: subnets})
	}
	if len(out.Annotations) == 0 {
		out.Annotations = nil
	}
	return nil
}

// takeAnnotation removes the annotation key from m and returns the
// families it held. One that does not parse is dropped as if absent: a
// conversion error would make the Network unreadable in every version.
func takeAnnotation(m *metav1.ObjectMeta, key string) (families, bool) {
	value, ok := takeValue(m, key)
	if !ok {
		return families{}, false
	}
	var f families
	if err := json.Unmarshal([]byte(value), &f); err != nil {
		return families{}, false
	}
	return f, true
}

// takeShape removes the shape's annotation from m and returns the shape
// it held. One that does not parse is dropped, as the families' are.
func takeShape(m *metav1.ObjectMeta) shape {
	value, ok := takeValue(m, SpecShapeAnnotation)
	if !ok {
		return shape{}
	}
	var s shape
	if err := json.Unmarshal([]byte(value), &s); err != nil {
		return shape{}
	}
	return s
}

// takeSelector removes the namespace selector's annotation from m and
// returns the selector it held. One that does not parse strictly (null,
// an unknown field such as a misspelt matchLabels) is dropped: the Network
// then admits its own namespace only, the narrowest reading, rather than
// every namespace as an empty selector would; admission refuses such an
// annotation from a v1 client.
func takeSelector(m *metav1.ObjectMeta) *metav1.LabelSelector {
	value, ok := takeValue(m, NamespaceSelectorAnnotation)
	if !ok {
		return nil
	}
	selector, err := ParseNamespaceSelector(value)
	if err != nil {
		return nil
	}
	return selector
}

// ParseNamespaceSelector reads the annotation NamespaceSelectorAnnotation:
// a label selector in JSON, every field known, not null.
func ParseNamespaceSelector(value string) (*metav1.LabelSelector, error) {
	if strings.TrimSpace(value) == "null" {
		return nil, errors.New("null is no selector: remove the annotation to admit the Network's own namespace only, or write {} to admit every namespace")
	}
	dec := json.NewDecoder(strings.NewReader(value))
	dec.DisallowUnknownFields()
	selector := &metav1.LabelSelector{}
	if err := dec.Decode(selector); err != nil {
		return nil, fmt.Errorf("not a label selector in JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a label selector in JSON: more than one value")
	}
	return selector, nil
}

// takeValue removes the annotation key from m (from a copy of its map) and
// returns its value.
func takeValue(m *metav1.ObjectMeta, key string) (string, bool) {
	value, ok := m.Annotations[key]
	if !ok {
		return "", false
	}
	m.Annotations = maps.Clone(m.Annotations)
	delete(m.Annotations, key)
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
	return value, true
}

func setAnnotation(m *metav1.ObjectMeta, key string, f families) {
	value, _ := json.Marshal(f) // strings only: cannot fail
	setValue(m, key, string(value))
}

func setValue(m *metav1.ObjectMeta, key, value string) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[key] = value
}
