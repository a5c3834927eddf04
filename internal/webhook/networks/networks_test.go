package networks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	"github.com/netop-dev/netop/pkg/apis/samplecrd/install"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// admissionWith has the given Networks in its index, as the informer's
// handlers would.
func admissionWith(tb testing.TB, nets ...*samplecrdv1.Network) *Admission {
	scheme := runtime.NewScheme()
	install.Install(scheme)
	a := &Admission{CIDRs: NewCIDRs(), Decoder: webhook.NewDecoder(scheme)}
	for i, n := range nets {
		if n.UID == "" {
			n = n.DeepCopy()
			n.UID = types.UID(fmt.Sprintf("uid-%d", i))
		}
		stored := &samplecrdv2.Network{}
		if err := a.Decoder.Convert(n, stored); err != nil {
			tb.Fatal(err)
		}
		a.CIDRs.Set(stored)
	}
	return a
}

// request is what the API server sends: the object with its apiVersion and
// kind.
func request(op admissionv1.Operation, n *samplecrdv1.Network) *admissionv1.AdmissionRequest {
	return review(op, n, samplecrdv1.SchemeGroupVersion.WithKind("Network"))
}

// requestV2 is what the API server sends for a v2 client's Network.
func requestV2(op admissionv1.Operation, n *samplecrdv2.Network) *admissionv1.AdmissionRequest {
	return review(op, n, samplecrdv2.SchemeGroupVersion.WithKind("Network"))
}

func review(op admissionv1.Operation, obj runtime.Object, gvk schema.GroupVersionKind) *admissionv1.AdmissionRequest {
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	raw, _ := json.Marshal(obj)
	return &admissionv1.AdmissionRequest{UID: "u", Operation: op, Object: runtime.RawExtension{Raw: raw}, Kind: metav1.GroupVersionKind(gvk)}
}

func FuzzValidateAndDefault(f *testing.F) {
	for _, s := range [][2]string{{"192.168.0.0/16", "192.168.0.1"}, {"10.1.0.0/16", ""}, {"fd00::/64", "fd00::1"}, {"x", "y"}} {
		f.Add(s[0], s[1])
	}
	existing := &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "existing"},
		Spec:       samplecrdv1.NetworkSpec{CIDR: "10.0.0.0/16"},
	}
	a := admissionWith(f, existing)
	f.Fuzz(func(t *testing.T, cidr, gateway string) {
		n := &samplecrdv1.Network{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"},
			Spec:       samplecrdv1.NetworkSpec{CIDR: cidr, Gateway: gateway},
		}
		resp := a.Validate(context.Background(), request(admissionv1.Create, n))
		resolved, errs := netspec.Resolver{}.Resolve(&samplecrd.NetworkSpec{CIDRs: []string{cidr}, Gateways: []string{gateway}}, netspec.Fields{V1: true})
		overlaps := len(errs) == 0 && resolved[0].Prefix.Overlaps(netipPrefix("10.0.0.0/16"))
		if resp.Allowed != (len(errs) == 0 && !overlaps) {
			t.Fatalf("Validate(%q, %q) allowed=%v, resolve errors %v, overlaps %v", cidr, gateway, resp.Allowed, errs, overlaps)
		}
		if def := a.Default(context.Background(), request(admissionv1.Create, n)); !def.Allowed {
			t.Fatalf("Default(%q, %q) refused: %v", cidr, gateway, def.Result)
		}
	})
}

// BenchmarkValidate is the cost of one create's validation beside n other
// Networks: the same at every n (the overlap check is a trie lookup), and
// beside admitted ones the informer has not delivered yet (a burst of
// creates), a scan of those, with no read from the API server unless one
// overlaps.
func BenchmarkValidate(b *testing.B) {
	for _, c := range []struct{ networks, admitted int }{{100, 0}, {10000, 0}, {10000, 100}} {
		b.Run(fmt.Sprintf("networks=%d/admitted=%d", c.networks, c.admitted), func(b *testing.B) {
			var nets []*samplecrdv1.Network
			for i := range c.networks {
				nets = append(nets, &samplecrdv1.Network{
					ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("n%d", i)},
					Spec:       samplecrdv1.NetworkSpec{CIDR: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)},
				})
			}
			a := admissionWith(b, nets...)
			a.CIDRs.Live = func(context.Context, string, string) (*samplecrdv2.Network, error) {
				b.Fatal("read from the API server")
				return nil, nil
			}
			for i := range c.admitted {
				a.CIDRs.Admitted(&samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("a%d", i), UID: types.UID(fmt.Sprintf("a%d", i))},
					Spec: samplecrdv2.NetworkSpec{CIDRs: []string{fmt.Sprintf("10.200.%d.0/24", i)}}})
			}
			req := request(admissionv1.Create, &samplecrdv1.Network{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "new"},
				Spec:       samplecrdv1.NetworkSpec{CIDR: "172.16.0.0/24", Gateway: "172.16.0.1"},
			})
			b.ReportAllocs()
			for b.Loop() {
				if resp := a.Validate(context.Background(), req); !resp.Allowed {
					b.Fatal(resp.Result)
				}
			}
		})
	}
}

func BenchmarkDefault(b *testing.B) {
	a := admissionWith(b)
	req := request(admissionv1.Create, &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "new"},
		Spec:       samplecrdv1.NetworkSpec{CIDR: "172.16.0.0/24"},
	})
	b.ReportAllocs()
	for b.Loop() {
		if resp := a.Default(context.Background(), req); !resp.Allowed {
			b.Fatal(resp.Result)
		}
	}
}

func netipPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// Objects are decoded by the apiVersion and kind they carry: one that is
// not a Network is refused, not misread.
func TestDecodeByKind(t *testing.T) {
	a := admissionWith(t)
	for name, raw := range map[string]string{
		"no kind":       `{"metadata":{"name":"n"},"spec":{"cidr":"10.0.0.0/16"}}`,
		"another kind":  `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"n"}}`,
		"unknown group": `{"apiVersion":"example.com/v1","kind":"Network","metadata":{"name":"n"},"spec":{"cidr":"10.0.0.0/16"}}`,
	} {
		req := &admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(raw)}}
		if resp := a.Validate(context.Background(), req); resp.Allowed || resp.Result.Code != 400 {
			t.Errorf("%s: allowed=%v result %+v, want a 400", name, resp.Allowed, resp.Result)
		}
	}
	n := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{CIDR: "10.0.0.0/16"}}
	if resp := a.Validate(context.Background(), request(admissionv1.Create, n)); !resp.Allowed {
		t.Errorf("a samplecrd.k8s.io/v1 Network: %+v", resp.Result)
	}
}

// A defaulted gateway follows a cidr change; a gateway the user chose does
// not.
func TestDefaultMovesADefaultedGatewayWithTheCIDR(t *testing.T) {
	a := admissionWith(t)
	update := func(oldCIDR, cidr, gateway string) string {
		old := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{CIDR: oldCIDR, Gateway: gateway}}
		cur := old.DeepCopy()
		cur.Spec.CIDR = cidr
		req := request(admissionv1.Update, cur)
		req.OldObject = request(admissionv1.Update, old).Object
		return string(a.Default(context.Background(), req).Patch)
	}
	if got, want := update("10.1.0.0/16", "10.2.0.0/16", "10.1.0.1"), `[{"op":"add","path":"/spec/gateway","value":"10.2.0.1"}]`; got != want {
		t.Errorf("defaulted gateway: patch %s, want %s", got, want)
	}
	if got := update("10.1.0.0/16", "10.2.0.0/16", "10.1.0.7"); got != "" {
		t.Errorf("chosen gateway: patch %s, want none", got)
	}

	// Each family's, in a v2 client's spec.gateways.
	updateV2 := func(oldCIDRs, cidrs, gateways []string) string {
		old := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv2.NetworkSpec{CIDRs: oldCIDRs, Gateways: gateways}}
		cur := old.DeepCopy()
		cur.Spec.CIDRs = cidrs
		req := requestV2(admissionv1.Update, cur)
		req.OldObject = requestV2(admissionv1.Update, old).Object
		return string(a.Default(context.Background(), req).Patch)
	}
	if got, want := updateV2([]string{"10.1.0.0/16", "fd01::/64"}, []string{"10.1.0.0/16", "fd02::/64"}, []string{"10.1.0.1", "fd01::1"}),
		`[{"op":"add","path":"/spec/gateways","value":["10.1.0.1","fd02::1"]}]`; got != want {
		t.Errorf("defaulted second gateway: patch %s, want %s", got, want)
	}
	if got := updateV2([]string{"10.1.0.0/16", "fd01::/64"}, []string{"10.1.0.0/16", "fd02::/64"}, []string{"10.1.0.1", "fd02::9"}); got != "" {
		t.Errorf("chosen second gateway: patch %s, want none", got)
	}
	if got := update("10.1.0.0/16", "10.1.0.0/16", "10.1.0.1"); got != "" {
		t.Errorf("unchanged cidr: patch %s, want none", got)
	}
}

// Reserved ranges are refused naming their purpose, unless the operator
// allows them; loopback and multicast stay refused even then.
func TestValidateReservedPrefixes(t *testing.T) {
	strict, allowing := admissionWith(t), admissionWith(t)
	allowing.Resolver = netspec.Resolver{AllowReserved: true}
	for _, tc := range []struct {
		cidr, gateway   string
		want            string
		allowedWithFlag bool
	}{
		{cidr: "169.254.0.0/16", want: `spec.cidr: Invalid value: "169.254.0.0/16": is in 169.254.0.0/16, reserved for link-local addresses`, allowedWithFlag: true},
		{cidr: "240.0.0.0/4", want: "reserved for future use", allowedWithFlag: true},
		{cidr: "127.0.0.0/8", want: `spec.cidr: Invalid value: "127.0.0.0/8": is in 127.0.0.0/8, reserved for loopback (RFC 1122)`},
		{cidr: "0.0.0.0/0", want: "contains 127.0.0.0/8, reserved for loopback"},
		{cidr: "::/0", want: "contains ::1/128, reserved for loopback"},
		{cidr: "ff00::/8", want: "reserved for multicast"},
		{cidr: "10.0.0.4/31", want: "use a prefix of /30 or shorter"},
	} {
		n := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{CIDR: tc.cidr, Gateway: tc.gateway}}
		if resp := strict.Validate(context.Background(), request(admissionv1.Create, n)); resp.Allowed || !strings.Contains(resp.Result.Message, tc.want) {
			t.Errorf("Validate(%s): allowed=%v %v, want refused with %q", tc.cidr, resp.Allowed, resp.Result, tc.want)
		}
		if resp := allowing.Validate(context.Background(), request(admissionv1.Create, n)); resp.Allowed != tc.allowedWithFlag {
			t.Errorf("AllowReserved: Validate(%s): allowed=%v %v, want %v", tc.cidr, resp.Allowed, resp.Result, tc.allowedWithFlag)
		}
		// Defaulting never fills in a gateway for a refused cidr: ::/0
		// once got ::1.
		if patch := string(strict.Default(context.Background(), request(admissionv1.Create, n)).Patch); strings.Contains(patch, "/spec/gateway") {
			t.Errorf("Default(%s) patch %s sets a gateway", tc.cidr, patch)
		}
	}
}

// A Network admitted before a range was reserved still counts for overlaps:
// its backend network may exist.
func TestOverlapWithANetworkTodaysRulesRefuse(t *testing.T) {
	old := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "old"}, Spec: samplecrdv1.NetworkSpec{CIDR: "169.254.0.0/16"}}
	a := admissionWith(t, old)
	a.Resolver = netspec.Resolver{AllowReserved: true}
	n := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{CIDR: "169.254.1.0/24"}}
	if resp := a.Validate(context.Background(), request(admissionv1.Create, n)); resp.Allowed || !strings.Contains(resp.Result.Message, "overlaps Network other/old (169.254.0.0/16)") {
		t.Errorf("allowed=%v %v, want refused as overlapping other/old", resp.Allowed, resp.Result)
	}
}

// Non-canonical IPv6 gets the warning Kubernetes gives for its own fields;
// host bits set get theirs, in either family.
func TestWarnings(t *testing.T) {
	a := admissionWith(t)
	for _, tc := range []struct {
		cidr, gateway string
		want          []string
	}{
		{cidr: "192.168.0.0/16", gateway: "192.168.0.1"},
		{cidr: "2001:db8::/64", gateway: "2001:db8::1"},
		{cidr: "192.168.1.0/16", want: []string{`spec.cidr "192.168.1.0/16" has host bits set: it means the network 192.168.0.0/16`}},
		{cidr: "2001:db8::1/64", want: []string{`spec.cidr "2001:db8::1/64" has host bits set: it means the network 2001:db8::/64`}},
		{cidr: "2001:DB8::/64", want: []string{`spec.cidr: IPv6 CIDR value "2001:DB8::/64" should be in RFC 5952 canonical format ("2001:db8::/64")`}},
		{cidr: "2001:db8:0:0::/64", want: []string{`spec.cidr: IPv6 CIDR value "2001:db8:0:0::/64" should be in RFC 5952 canonical format ("2001:db8::/64")`}},
		{cidr: "fd00::/64", gateway: "FD00::1", want: []string{`spec.gateway: IPv6 address "FD00::1" should be in RFC 5952 canonical format ("fd00::1")`}},
		{cidr: "FD00::/64", gateway: "fd00:0::1", want: []string{
			`spec.cidr: IPv6 CIDR value "FD00::/64" should be in RFC 5952 canonical format ("fd00::/64")`,
			`spec.gateway: IPv6 address "fd00:0::1" should be in RFC 5952 canonical format ("fd00::1")`,
		}},
	} {
		n := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{CIDR: tc.cidr, Gateway: tc.gateway}}
		resp := a.Validate(context.Background(), request(admissionv1.Create, n))
		if !resp.Allowed || !slices.Equal(resp.Warnings, tc.want) {
			t.Errorf("Validate(%q, %q): allowed=%v warnings %q, want %q", tc.cidr, tc.gateway, resp.Allowed, resp.Warnings, tc.want)
		}
	}
}

// A second family, from a v2 client (the API server sends v1 with the
// families in the annotation) or a v1 client that wrote the annotation, is
// validated as v2: each family resolved and checked for overlaps, the
// errors naming the item; defaulting fills in its gateway.
func TestValidateDualStack(t *testing.T) {
	existing := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "v6"}, Spec: samplecrdv1.NetworkSpec{CIDR: "fd09::/48"}}
	a := admissionWith(t, existing)
	withFamilies := func(cidr, value string) *samplecrdv1.Network {
		return &samplecrdv1.Network{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", Annotations: map[string]string{samplecrdv1.SpecFamiliesAnnotation: value}},
			Spec:       samplecrdv1.NetworkSpec{CIDR: cidr},
		}
	}
	for _, tc := range []struct {
		name string
		n    *samplecrdv1.Network
		want string // empty: allowed
	}{
		{"dual-stack", withFamilies("10.7.0.0/24", `{"cidrs":["10.7.0.0/24","fd07::/64"]}`), ""},
		{"IPv6 first", withFamilies("fd07::/64", `{"cidrs":["fd07::/64","10.7.0.0/24"],"gateways":["fd07::9",""]}`), ""},
		{"second too long", withFamilies("10.7.0.0/24", `{"cidrs":["10.7.0.0/24","fd07::1/128"]}`), "spec.cidrs[1]: Invalid value: \"fd07::1/128\": must leave room"},
		{"one family twice", withFamilies("10.7.0.0/24", `{"cidrs":["10.7.0.0/24","10.8.0.0/24"]}`), "spec.cidrs: Invalid value"},
		{"second gateway outside", withFamilies("10.7.0.0/24", `{"cidrs":["10.7.0.0/24","fd07::/64"],"gateways":["","fd08::1"]}`), "spec.gateways[1]: Invalid value: \"fd08::1\": must be an address inside spec.cidrs[1]"},
		{"two gateways, one cidr", withFamilies("10.7.0.0/24", `{"gateways":["10.7.0.1","fd07::1"]}`), "spec.gateways: Too many"},
		{"second overlaps", withFamilies("10.7.0.0/24", `{"cidrs":["10.7.0.0/24","fd09:0:0:1::/64"]}`), "spec.cidrs[1]: Invalid value: \"fd09:0:0:1::/64\": overlaps Network other/v6 (fd09::/48)"},
	} {
		resp := a.Validate(context.Background(), request(admissionv1.Create, tc.n))
		switch {
		case tc.want == "" && !resp.Allowed:
			t.Errorf("%s: refused: %v", tc.name, resp.Result)
		case tc.want != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.want)):
			t.Errorf("%s: allowed=%v %v, want refused with %q", tc.name, resp.Allowed, resp.Result, tc.want)
		}
	}

	patch := string(a.Default(context.Background(), request(admissionv1.Create, withFamilies("10.7.0.0/24", `{"cidrs":["10.7.0.0/24","fd07::/64"]}`))).Patch)
	if !strings.Contains(patch, `"path":"/metadata/annotations/samplecrd.k8s.io~1spec-families"`) || !strings.Contains(patch, `fd07::1`) || !strings.Contains(patch, `"path":"/spec/gateway","value":"10.7.0.1"`) {
		t.Errorf("Default of a dual-stack Network without gateways: %s, want both gateways filled in", patch)
	}
	if patch := string(a.Default(context.Background(), request(admissionv1.Create, withFamilies("10.7.0.0/24", `{"cidrs":["10.7.0.0/24","fd07::/64"],"gateways":["10.7.0.1","fd07::5"]}`))).Patch); strings.Contains(patch, "spec-families") {
		t.Errorf("Default changed given gateways: %s", patch)
	}
}

// holding says pods hold addresses of the families listed.
type holding []string

func (h holding) Held(_ *samplecrdv2.Network, family netip.Prefix, _ int) (netselect.Holders, error) {
	if slices.Contains(h, family.String()) {
		return netselect.Holders{Count: 1, Pods: []string{"ns/p"}}, nil
	}
	return netselect.Holders{}, nil
}

func (h holding) HeldIn(_ *samplecrdv2.Network, r ipam.Range, _ int) (netselect.Holders, error) {
	for _, held := range h {
		if a, err := netip.ParseAddr(held); err == nil && r.Contains(a) {
			return netselect.Holders{Count: 1, Pods: []string{"ns/p"}}, nil
		}
	}
	return netselect.Holders{}, nil
}

// While pods hold addresses of a family, it cannot move or go; a family
// they hold none of may come, change or go.
func TestAddressesHeldPerFamily(t *testing.T) {
	a := admissionWith(t)
	single := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{CIDR: "10.7.0.0/24", Gateway: "10.7.0.1"}}
	dual := single.DeepCopy()
	dual.Annotations = map[string]string{samplecrdv1.SpecFamiliesAnnotation: `{"cidrs":["10.7.0.0/24","fd07::/64"],"gateways":["10.7.0.1","fd07::1"]}`}
	dualMoved := single.DeepCopy()
	dualMoved.Annotations = map[string]string{samplecrdv1.SpecFamiliesAnnotation: `{"cidrs":["10.7.0.0/24","fd08::/64"],"gateways":["10.7.0.1","fd08::1"]}`}
	dualGateway := single.DeepCopy()
	dualGateway.Annotations = map[string]string{samplecrdv1.SpecFamiliesAnnotation: `{"cidrs":["10.7.0.0/24","fd07::/64"],"gateways":["10.7.0.1","fd07::9"]}`}
	moved := single.DeepCopy()
	moved.Spec.Gateway = "10.7.0.9"
	both := holding{"10.7.0.0/24", "fd07::/64"}
	for _, tc := range []struct {
		name     string
		held     holding
		old, new *samplecrdv1.Network
		want     string // empty: allowed
	}{
		{"IPv6 added", holding{"10.7.0.0/24"}, single, dual, ""},
		{"IPv6 removed, none held", holding{"10.7.0.0/24"}, dual, single, ""},
		{"IPv6 moved, none held", holding{"10.7.0.0/24"}, dual, dualMoved, ""},
		{"IPv6 removed", both, dual, single, `spec.cidrs[1]: Forbidden: 1 pods hold addresses of the Network (ns/p): it can change once they are gone (was "fd07::/64")`},
		{"IPv6 moved", both, dual, dualMoved, "spec.cidrs[1]: Forbidden"},
		{"IPv6 gateway moved", both, dual, dualGateway, `spec.gateways[1]: Forbidden: 1 pods hold addresses of the Network (ns/p): it can change once they are gone (was "fd07::1")`},
		{"first gateway moved", both, single, moved, "spec.gateway: Forbidden"},
		{"first gateway moved, only IPv6 held", holding{"fd07::/64"}, single, moved, ""},
	} {
		a.Addresses = tc.held
		req := request(admissionv1.Update, tc.new)
		req.OldObject = request(admissionv1.Update, tc.old).Object
		resp := a.Validate(context.Background(), req)
		switch {
		case tc.want == "" && !resp.Allowed:
			t.Errorf("%s: refused: %v", tc.name, resp.Result)
		case tc.want != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.want)):
			t.Errorf("%s: allowed=%v %v, want refused with %q", tc.name, resp.Allowed, resp.Result, tc.want)
		}
	}
}

// A v2 client's Network is admitted as v2: errors and warnings name
// spec.cidrs[i] and spec.gateways[i], even for one family, and defaulting
// patches spec.gateways.
func TestValidateV2NamesItsFields(t *testing.T) {
	existing := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "existing"}, Spec: samplecrdv1.NetworkSpec{CIDR: "10.0.0.0/16"}}
	a := admissionWith(t, existing)
	v2 := func(cidrs, gateways []string) *samplecrdv2.Network {
		return &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv2.NetworkSpec{CIDRs: cidrs, Gateways: gateways}}
	}
	for _, tc := range []struct {
		name string
		n    *samplecrdv2.Network
		want string
	}{
		{"overlap", v2([]string{"10.0.1.0/24"}, nil), `spec.cidrs[0]: Invalid value: "10.0.1.0/24": overlaps Network other/existing (10.0.0.0/16)`},
		{"gateway outside", v2([]string{"10.9.0.0/24"}, []string{"10.8.0.1"}), "spec.gateways[0]"},
		{"second overlaps", v2([]string{"fd09::/64", "10.0.2.0/24"}, nil), "spec.cidrs[1]"},
	} {
		resp := a.Validate(context.Background(), requestV2(admissionv1.Create, tc.n))
		if resp.Allowed || !strings.Contains(resp.Result.Message, tc.want) {
			t.Errorf("%s: allowed=%v %v, want refused with %q", tc.name, resp.Allowed, resp.Result, tc.want)
		}
	}
	resp := a.Validate(context.Background(), requestV2(admissionv1.Create, v2([]string{"10.9.0.5/24", "FD09::/64"}, nil)))
	if want := []string{`spec.cidrs[0] "10.9.0.5/24" has host bits set: it means the network 10.9.0.0/24`,
		`spec.cidrs[1]: IPv6 CIDR value "FD09::/64" should be in RFC 5952 canonical format ("fd09::/64")`}; !resp.Allowed || !slices.Equal(resp.Warnings, want) {
		t.Errorf("warnings %q (allowed %v), want %q", resp.Warnings, resp.Allowed, want)
	}
	if got, want := string(a.Default(context.Background(), requestV2(admissionv1.Create, v2([]string{"10.9.0.0/24", "fd09::/64"}, nil))).Patch),
		`[{"op":"add","path":"/spec/gateways","value":["10.9.0.1","fd09::1"]},{"op":"add","path":"/metadata/finalizers","value":["samplecrd.k8s.io/network-cleanup"]}]`; got != want {
		t.Errorf("Default: patch %s, want %s", got, want)
	}
}

// spec.reserved: an entry outside every cidr is refused naming it; a new
// entry covering an address a pod holds is refused naming the pod, until
// it is gone; an entry reserved already is not asked about again, and
// one nobody holds is taken. A v1 client's entries (in the annotation)
// are checked alike.
func TestValidateReserved(t *testing.T) {
	a := admissionWith(t)
	v2 := func(reserved ...string) *samplecrdv2.Network {
		return &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "u"},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.7.0.0/24"}, Gateways: []string{"10.7.0.1"}, Reserved: reserved}}
	}
	if resp := a.Validate(context.Background(), requestV2(admissionv1.Create, v2("10.7.0.2-10.7.0.20", "10.9.0.5"))); resp.Allowed ||
		!strings.Contains(resp.Result.Message, `spec.reserved[1]: Invalid value: "10.9.0.5": is outside every cidr (10.7.0.0/24)`) {
		t.Errorf("an entry outside the cidr: %v", resp.Result)
	}
	a.Addresses = holding{"10.7.0.5"}
	for _, tc := range []struct {
		name     string
		old, new *samplecrdv2.Network
		want     string
	}{
		{"a held address reserved", v2(), v2("10.7.0.100", "10.7.0.2-10.7.0.20"), `spec.reserved[1]: Forbidden: 1 pods hold addresses of the Network (ns/p) in 10.7.0.2-10.7.0.20: it can be reserved once they are gone`},
		{"a free range reserved", v2(), v2("10.7.0.6-10.7.0.20"), ""},
		{"an entry reserved already", v2("10.7.0.0/28"), v2("10.7.0.0/28", "10.7.0.100"), ""},
	} {
		req := requestV2(admissionv1.Update, tc.new)
		req.OldObject = requestV2(admissionv1.Update, tc.old).Object
		resp := a.Validate(context.Background(), req)
		switch {
		case tc.want == "" && !resp.Allowed:
			t.Errorf("%s: refused: %v", tc.name, resp.Result)
		case tc.want != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.want)):
			t.Errorf("%s: allowed=%v %v, want refused with %q", tc.name, resp.Allowed, resp.Result, tc.want)
		}
	}
	old := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{CIDR: "10.7.0.0/24", Gateway: "10.7.0.1"}}
	withShape := old.DeepCopy()
	withShape.Annotations = map[string]string{samplecrdv1.SpecShapeAnnotation: `{"reserved":["10.7.0.5"]}`}
	req := request(admissionv1.Update, withShape)
	req.OldObject = request(admissionv1.Update, old).Object
	if resp := a.Validate(context.Background(), req); resp.Allowed || !strings.Contains(resp.Result.Message, "spec.reserved[0]: Forbidden") {
		t.Errorf("a v1 client reserving a held address: %v", resp.Result)
	}
}

// A v1 client's Network without spec.cidr is refused naming the field as
// v1 does.
func TestValidateV1NamesAMissingCIDR(t *testing.T) {
	a := admissionWith(t)
	n := &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"}, Spec: samplecrdv1.NetworkSpec{Gateway: "10.0.0.1"}}
	want := "spec.cidr: Required value: an IP prefix such as 192.168.0.0/16"
	if resp := a.Validate(context.Background(), request(admissionv1.Create, n)); resp.Allowed || !strings.Contains(resp.Result.Message, want) {
		t.Errorf("a v1 Network without a cidr: %+v, want refused with %q", resp.Result, want)
	}
}
