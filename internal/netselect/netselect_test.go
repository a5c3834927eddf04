package netselect

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		annotation string
		want       string // "namespace/name@interface ips mac" per selection, "; "-joined
		wantErr    string
	}{
		{"", "", ""},
		{"example-network", "pods/example-network@net1 [] ", ""},
		{"example-network, other-ns/net,net@eth5", "pods/example-network@net1 [] ; other-ns/net@net2 [] ; pods/net@eth5 [] ", ""},
		{`[{"name":"a"},{"name":"b","namespace":"x","interface":"data0","ips":["192.168.0.10/16","fd00::10"],"mac":"02:00:00:00:00:01","default-route":["192.168.0.1"]}]`,
			"pods/a@net1 [] ; x/b@data0 [192.168.0.10/16 fd00::10/128] 02:00:00:00:00:01", ""},
		{"a@net2,b", "", `[1].interface: "net2" is also the interface of [0]`},
		{"a,,b", "", "an empty network name"},
		{"a@", "", "an empty interface name"},
		{"Bad_Name", "", `[0].name: "Bad_Name"`},
		{"a@eth0", "", "the pod's own interface"},
		{"a@averyveryverylongname", "", "longer than 15"},
		{`[{"name":"a","ips":["nope"]}]`, "", `[0].ips[0]: "nope": not an IP address`},
		{`[{"name":"a","mac":"01:00:5e:00:00:01"}]`, "", "multicast"},
		{`[{"name":"a","mac":"00:00:00:00:00:00"}]`, "", "the zero address"},
		{`[{"name":"a","mac":"zz"}]`, "", "[0].mac"},
		{`[{"name":"a","mac":"02:00:00:00:00:05"},{"name":"a","mac":"02:00:00:00:00:05"}]`, "", "[1].mac: 02:00:00:00:00:05 is also the MAC of [0], on the same Network"},
		{`[{"name":"a","mac":"0A:58:0a:00:00:05"}]`, "", `[0].mac: "0A:58:0a:00:00:05": netop gives interfaces MACs 0a:58:… made from their addresses`},
		{`[{"name":"a","colour":"blue"}]`, "", `unknown field "colour"`},
		{`[{"name":"a"}`, "", "not a JSON list"},
	} {
		got, err := Parse(tc.annotation, "pods")
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want one saying %q", tc.annotation, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.annotation, err)
			continue
		}
		var parts []string
		for _, s := range got {
			parts = append(parts, fmt.Sprintf("%s/%s@%s %v %s", s.Namespace, s.Name, s.Interface, s.IPs, s.MAC))
		}
		if g := strings.Join(parts, "; "); g != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.annotation, g, tc.want)
		}
	}
}

// The status reads back as Multus writes it: name, interface, ips, mac,
// default, dns.
func TestStatusAnnotationValue(t *testing.T) {
	v, err := StatusAnnotationValue([]Status{{Name: "default/example-network", Interface: "net1", IPs: []string{"192.168.0.2"}, MAC: "02:00:00:00:00:01"}})
	if err != nil {
		t.Fatal(err)
	}
	var back []map[string]any
	if err := json.Unmarshal([]byte(v), &back); err != nil {
		t.Fatal(err)
	}
	if len(back) != 1 || back[0]["name"] != "default/example-network" || back[0]["interface"] != "net1" || back[0]["mac"] != "02:00:00:00:00:01" {
		t.Errorf("status %s", v)
	}
	if _, ok := back[0]["dns"]; !ok {
		t.Errorf("no dns in %s (Multus always writes it)", v)
	}
}

func TestWithNetwork(t *testing.T) {
	for _, tc := range []struct {
		have, want string
		added      bool
	}{
		{"", "web", true},
		{"web", "web", false},
		{"default/web@eth7", "default/web@eth7", false},
		{"other", "other,web", true},
		{"other, ns2/x", "other, ns2/x,web", true},
		{`[{"name":"other"}]`, `[{"name":"other"},{"name":"web","namespace":"default"}]`, true},
		{`[{"name":"web","interface":"eth3"}]`, `[{"name":"web","interface":"eth3"}]`, false},
	} {
		got, added, err := WithNetwork(tc.have, "default", "web")
		if err != nil || got != tc.want || added != tc.added {
			t.Errorf("WithNetwork(%q) = %q, %v, %v; want %q, %v", tc.have, got, added, err, tc.want, tc.added)
		}
		if _, err := Parse(got, "default"); err != nil {
			t.Errorf("WithNetwork(%q) = %q, which does not parse: %v", tc.have, got, err)
		}
	}
	if _, _, err := WithNetwork("bad name!", "default", "web"); err == nil {
		t.Error("WithNetwork accepted an annotation that does not parse")
	}
	if got, _, err := WithNetwork("other", "default", ""); err == nil {
		t.Errorf("WithNetwork added a Network without a name: %q", got)
	}
}

func TestDiff(t *testing.T) {
	have := []Allocation{
		{Network: "ns/a", NetworkUID: "ua", Interface: "net1"},
		{Network: "ns/b", NetworkUID: "ub", Interface: "net2"},
		{Network: "ns/old", NetworkUID: "uo", Interface: "net3", Detaching: true},
	}
	names := func(as []Allocation) (out []string) {
		for _, a := range as {
			out = append(out, a.Interface+"@"+a.Network)
		}
		return out
	}
	added := func(ss []Selection) (out []string) {
		for _, s := range ss {
			out = append(out, s.Interface+"@"+s.Namespace+"/"+s.Name)
		}
		return out
	}
	for _, tc := range []struct {
		annotation           string
		kept, added, removed []string
		err                  string
	}{
		{annotation: "a,b", kept: []string{"net1@ns/a", "net2@ns/b"}},
		// Removing the first keeps the second's name, not its place's.
		{annotation: "b", kept: []string{"net2@ns/b"}, removed: []string{"net1@ns/a"}},
		// An added Network takes its place's name when free, else the
		// lowest free one (net3 is still detaching).
		{annotation: "a,b,c", kept: []string{"net1@ns/a", "net2@ns/b"}, added: []string{"net4@ns/c"}},
		{annotation: "b,c", kept: []string{"net2@ns/b"}, added: []string{"net4@ns/c"}, removed: []string{"net1@ns/a"}},
		{annotation: "c,b", kept: []string{"net2@ns/b"}, added: []string{"net4@ns/c"}, removed: []string{"net1@ns/a"}},
		{annotation: "a,b,c@data", kept: []string{"net1@ns/a", "net2@ns/b"}, added: []string{"data@ns/c"}},
		{annotation: "a@net1,b", kept: []string{"net1@ns/a", "net2@ns/b"}},
		// A second interface on a kept Network.
		{annotation: "a,b,a", kept: []string{"net1@ns/a", "net2@ns/b"}, added: []string{"net4@ns/a"}},
		// Replacing net2's Network under the same name.
		{annotation: "a,c@net2", kept: []string{"net1@ns/a"}, added: []string{"net2@ns/c"}, removed: []string{"net2@ns/b"}},
		{annotation: "", removed: []string{"net1@ns/a", "net2@ns/b"}},
		{annotation: "a@eth1,b", err: `interface: "eth1": the pod's interface on Network ns/a is net1`},
		{annotation: "c@net1,a", err: `"net1": the pod's interface on Network ns/a has that name`},
	} {
		t.Run(tc.annotation, func(t *testing.T) {
			selections, err := Parse(tc.annotation, "ns")
			if err != nil {
				t.Fatal(err)
			}
			c, err := Diff(have, selections)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(names(c.Kept), tc.kept) || !slices.Equal(added(c.Added), tc.added) || !slices.Equal(names(c.Removed), tc.removed) {
				t.Errorf("kept %v added %v removed %v; want %v %v %v", names(c.Kept), added(c.Added), names(c.Removed), tc.kept, tc.added, tc.removed)
			}
		})
	}
}

// A patch of netop's annotations names the pod's UID, removes what is
// empty, and holds at the version read only when asked.
func TestAnnotationsPatch(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", ResourceVersion: "42"}}
	for _, tc := range []struct {
		atVersion bool
		want      string
	}{
		{false, `{"metadata":{"annotations":{"a":"x","b":null},"uid":"u1"}}`},
		{true, `{"metadata":{"annotations":{"a":"x","b":null},"resourceVersion":"42","uid":"u1"}}`},
	} {
		got, err := AnnotationsPatch(pod, map[string]string{"a": "x", "b": ""}, tc.atVersion)
		if err != nil || string(got) != tc.want {
			t.Errorf("at version %v: %s (%v), want %s", tc.atVersion, got, err, tc.want)
		}
	}
}
