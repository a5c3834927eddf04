package services

import (
	"context"
	"net"
	"testing"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// SERVICE.NAMESPACE is asked of the next plugin (the kubernetes plugin) as
// SERVICE.NAMESPACE.svc.cluster.local, and answered under the name asked;
// a name whose second label is not a namespace, or with more labels, goes
// on as it is.
func TestNamespacedNames(t *testing.T) {
	var asked string
	next := plugin.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		asked = r.Question[0].Name
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: asked, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP("10.0.0.1")}}
		return dns.RcodeSuccess, w.WriteMsg(m)
	})
	h := namespaced{next: next, exists: func(ns string) bool { return ns == "default" }, suffix: "svc.cluster.local."}
	for _, tc := range []struct{ name, asked string }{
		{"kubernetes.default.", "kubernetes.default.svc.cluster.local."},
		{"Kubernetes.DEFAULT.", "Kubernetes.DEFAULT.svc.cluster.local."},
		{"example.com.", "example.com."},
		{"kubernetes.default.svc.cluster.local.", "kubernetes.default.svc.cluster.local."},
		{"default.", "default."},
	} {
		q := new(dns.Msg)
		q.SetQuestion(tc.name, dns.TypeA)
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		if _, err := h.ServeDNS(context.Background(), rec, q); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if asked != tc.asked {
			t.Errorf("%s: the next plugin was asked %s, want %s", tc.name, asked, tc.asked)
		}
		if got := rec.Msg; got.Question[0].Name != tc.name || len(got.Answer) != 1 || got.Answer[0].Header().Name != tc.name {
			t.Errorf("%s: answered %v", tc.name, got)
		}
	}
}
