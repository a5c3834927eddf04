// Package netselect reads the Networks a pod asks for, in the annotation
// Multus users already write (the Network Plumbing Working Group's
// k8s.v1.cni.cncf.io/networks), and writes what the pod got in Multus's
// k8s.v1.cni.cncf.io/network-status, so that tools reading either work
// unchanged with netop.
package netselect

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The annotations, as Multus names them.
const (
	NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"
	StatusAnnotation   = "k8s.v1.cni.cncf.io/network-status"
)

// DerivedMACPrefix begins the MACs netop makes for interfaces from their
// addresses (its two bytes, then the address's last four, as
// OVN-Kubernetes does); a pinned MAC may not begin so.
var DerivedMACPrefix = net.HardwareAddr{0x0a, 0x58}

// IsDerivedMAC says whether mac is of those netop makes from addresses.
func IsDerivedMAC(mac net.HardwareAddr) bool { return bytes.HasPrefix(mac, DerivedMACPrefix) }

// Selection is one Network a pod asks for.
type Selection struct {
	Namespace string
	Name      string
	// Interface is the pod's interface for it: as asked, else net1, net2,
	// … in list order.
	Interface string
	// Named: the interface was asked for by name; else Interface is the
	// default of the selection's place in the list, which a running pod's
	// edit may not keep (Diff).
	Named bool
	// IPs are static addresses asked for; a prefix length, if given, must
	// be the Network's.
	IPs []netip.Prefix
	MAC net.HardwareAddr
}

// element is the JSON form of a selection. The fields of the spec netop
// does not act on are accepted and ignored, as Multus ignores what its
// delegates do not use; anything else is an error.
type element struct {
	Name           string          `json:"name"`
	Namespace      string          `json:"namespace,omitempty"`
	Interface      string          `json:"interface,omitempty"`
	IPs            []string        `json:"ips,omitempty"`
	MAC            string          `json:"mac,omitempty"`
	DefaultRoute   json.RawMessage `json:"default-route,omitempty"`
	PortMappings   json.RawMessage `json:"portMappings,omitempty"`
	Bandwidth      json.RawMessage `json:"bandwidth,omitempty"`
	CNIArgs        json.RawMessage `json:"cni-args,omitempty"`
	InfinibandGUI  json.RawMessage `json:"infiniband-guid,omitempty"`
	GatewayRequest json.RawMessage `json:"gateway-request,omitempty"`
}

// Parse reads the annotation of a pod in podNamespace. An empty annotation
// asks for nothing.
func Parse(annotation, podNamespace string) ([]Selection, error) {
	annotation = strings.TrimSpace(annotation)
	if annotation == "" {
		return nil, nil
	}
	var elements []element
	if strings.HasPrefix(annotation, "[") {
		dec := json.NewDecoder(bytes.NewReader([]byte(annotation)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&elements); err != nil {
			return nil, fmt.Errorf("%s: not a JSON list of networks: %w", NetworksAnnotation, err)
		}
	} else {
		for _, item := range strings.Split(annotation, ",") {
			e, err := parseShort(strings.TrimSpace(item))
			if err != nil {
				return nil, err
			}
			elements = append(elements, e)
		}
	}
	out := make([]Selection, 0, len(elements))
	names := map[string]int{}
	macs := map[string]int{} // by Network and MAC
	for i, e := range elements {
		s, err := e.selection(i, podNamespace)
		if err != nil {
			return nil, err
		}
		if s.MAC != nil {
			key := s.Namespace + "/" + s.Name + " " + s.MAC.String()
			if j, dup := macs[key]; dup {
				return nil, fmt.Errorf("%s[%d].mac: %s is also the MAC of [%d], on the same Network", NetworksAnnotation, i, s.MAC, j)
			}
			macs[key] = i
		}
		out = append(out, s)
	}
	for i := range out {
		if out[i].Interface == "" {
			out[i].Interface = fmt.Sprintf("net%d", i+1)
		}
		if j, dup := names[out[i].Interface]; dup {
			return nil, fmt.Errorf("%s[%d].interface: %q is also the interface of [%d]", NetworksAnnotation, i, out[i].Interface, j)
		}
		names[out[i].Interface] = i
	}
	return out, nil
}

// parseShort reads [namespace/]name[@interface].
func parseShort(item string) (element, error) {
	var e element
	if item == "" {
		return e, fmt.Errorf("%s: an empty network name in the list", NetworksAnnotation)
	}
	rest := item
	if ns, name, ok := strings.Cut(rest, "/"); ok {
		e.Namespace, rest = ns, name
	}
	if name, iface, ok := strings.Cut(rest, "@"); ok {
		e.Interface, rest = iface, name
		if iface == "" {
			return e, fmt.Errorf("%s: %q: an empty interface name after @", NetworksAnnotation, item)
		}
	}
	e.Name = rest
	return e, nil
}

func (e element) selection(i int, podNamespace string) (Selection, error) {
	field := func(f string) string { return fmt.Sprintf("%s[%d].%s", NetworksAnnotation, i, f) }
	s := Selection{Namespace: e.Namespace, Name: e.Name, Interface: e.Interface, Named: e.Interface != ""}
	if s.Namespace == "" {
		s.Namespace = podNamespace
	}
	if msgs := validation.IsDNS1123Subdomain(s.Name); len(msgs) > 0 {
		return s, fmt.Errorf("%s: %q: %s", field("name"), s.Name, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Label(s.Namespace); len(msgs) > 0 {
		return s, fmt.Errorf("%s: %q: %s", field("namespace"), s.Namespace, strings.Join(msgs, "; "))
	}
	if s.Interface != "" {
		if err := validInterface(s.Interface); err != nil {
			return s, fmt.Errorf("%s: %q: %w", field("interface"), s.Interface, err)
		}
	}
	for j, ip := range e.IPs {
		p, err := parseIP(ip)
		if err != nil {
			return s, fmt.Errorf("%s[%d]: %q: %w", field("ips"), j, ip, err)
		}
		s.IPs = append(s.IPs, p)
	}
	if e.MAC != "" {
		mac, err := net.ParseMAC(e.MAC)
		if err != nil || len(mac) != 6 {
			return s, fmt.Errorf("%s: %q: not a 48-bit MAC address", field("mac"), e.MAC)
		}
		if mac[0]&1 == 1 {
			return s, fmt.Errorf("%s: %q: a multicast address cannot be an interface's", field("mac"), e.MAC)
		}
		if bytes.Equal(mac, make(net.HardwareAddr, 6)) {
			return s, fmt.Errorf("%s: %q: the zero address cannot be an interface's", field("mac"), e.MAC)
		}
		if IsDerivedMAC(mac) {
			return s, fmt.Errorf("%s: %q: netop gives interfaces MACs %s:… made from their addresses, so a pinned one could be another pod's: pin one outside it", field("mac"), e.MAC, DerivedMACPrefix)
		}
		s.MAC = mac
	}
	return s, nil
}

// parseIP reads an address, with or without its prefix length.
func parseIP(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not an IP address")
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// validInterface: what Linux takes as an interface name, and not the
// pod's own eth0 or lo, which netop never touches.
func validInterface(name string) error {
	switch {
	case len(name) > 15:
		return fmt.Errorf("longer than 15 characters")
	case name == "." || name == "..":
		return fmt.Errorf("not a name")
	case strings.ContainsAny(name, "/: \t\n"):
		return fmt.Errorf("has '/', ':' or white space")
	case name == "eth0" || name == "lo":
		return fmt.Errorf("the pod's own interface, which netop leaves alone")
	}
	return nil
}

// Status is one entry of k8s.v1.cni.cncf.io/network-status.
type Status struct {
	// Name is namespace/name of the Network.
	Name      string   `json:"name"`
	Interface string   `json:"interface,omitempty"`
	IPs       []string `json:"ips,omitempty"`
	MAC       string   `json:"mac,omitempty"`
	// Default marks the pod's primary network.
	Default bool `json:"default,omitempty"`
	DNS     struct {
		Nameservers []string `json:"nameservers,omitempty"`
	} `json:"dns"`
}

// StatusesOf are the network-status entries of allocations: each
// interface's addresses without their prefix length, as Multus writes
// them.
func StatusesOf(allocations []Allocation) []Status {
	statuses := make([]Status, 0, len(allocations))
	for _, a := range allocations {
		s := Status{Name: a.Network, Interface: a.Interface, MAC: a.MAC}
		for _, ip := range a.IPs {
			s.IPs = append(s.IPs, strings.SplitN(ip, "/", 2)[0])
		}
		statuses = append(statuses, s)
	}
	return statuses
}

// StatusAnnotationValue is the annotation's value for statuses.
func StatusAnnotationValue(statuses []Status) (string, error) {
	data, err := json.MarshalIndent(statuses, "", "    ")
	if err != nil {
		return "", err
	}
	return string(data), nil
}

// WithNetwork returns the annotation of a pod in namespace with that
// namespace's Network name added, in the annotation's own form (the short
// list or the JSON list), and whether it had to be added.
func WithNetwork(annotation, namespace, name string) (string, bool, error) {
	selections, err := Parse(annotation, namespace)
	if err != nil {
		return "", false, err
	}
	added := element{Name: name, Namespace: namespace}
	if _, err := added.selection(len(selections), namespace); err != nil {
		return "", false, err
	}
	if slices.ContainsFunc(selections, func(s Selection) bool { return s.Namespace == namespace && s.Name == name }) {
		return annotation, false, nil
	}
	annotation = strings.TrimSpace(annotation)
	switch {
	case annotation == "":
		return name, true, nil
	case strings.HasPrefix(annotation, "["):
		var elements []json.RawMessage
		if err := json.Unmarshal([]byte(annotation), &elements); err != nil {
			return "", false, fmt.Errorf("%s: not a JSON list of networks: %w", NetworksAnnotation, err)
		}
		element, err := json.Marshal(added)
		if err != nil {
			return "", false, err
		}
		out, err := json.Marshal(append(elements, element))
		return string(out), true, err
	default:
		return annotation + "," + name, true, nil
	}
}
