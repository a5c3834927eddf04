package services

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// namespacedPlugin answers SERVICE.NAMESPACE as
// SERVICE.NAMESPACE.svc.DOMAIN when NAMESPACE is one of the cluster's.
// The resolvers of glibc and musl reach that name through the pods'
// search domains, but busybox's nslookup searches only names without a
// dot, so the name every Kubernetes guide tries first,
// `nslookup kubernetes.default`, fails with it on a plain CoreDNS. A name
// whose second label is not a namespace (example.com) is left alone.
const namespacedPlugin = "netop_namespaced"

// namespaceLookup says whether a namespace exists; startDNS sets it before
// CoreDNS reads its configuration.
var (
	namespaceMu     sync.Mutex
	namespaceLookup func(string) bool
)

func init() {
	plugin.Register(namespacedPlugin, func(c *caddy.Controller) error {
		c.Next() // the directive's name
		if c.NextArg() {
			return plugin.Error(namespacedPlugin, c.ArgErr())
		}
		namespaceMu.Lock()
		exists := namespaceLookup
		namespaceMu.Unlock()
		dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
			return namespaced{next: next, exists: exists, suffix: "svc." + ClusterDomain + "."}
		})
		return nil
	})
	// Before the kubernetes plugin, which then answers the full name.
	at := slices.Index(dnsserver.Directives, "kubernetes")
	dnsserver.Directives = slices.Insert(dnsserver.Directives, at, namespacedPlugin)
}

type namespaced struct {
	next   plugin.Handler
	exists func(string) bool
	suffix string
}

func (namespaced) Name() string { return namespacedPlugin }

func (n namespaced) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if len(r.Question) != 1 || n.exists == nil {
		return plugin.NextOrFailure(n.Name(), n.next, ctx, w, r)
	}
	name := r.Question[0].Name
	labels := dns.SplitDomainName(name)
	if len(labels) != 2 || !n.exists(strings.ToLower(labels[1])) {
		return plugin.NextOrFailure(n.Name(), n.next, ctx, w, r)
	}
	full := r.Copy()
	full.Question[0].Name = dns.Fqdn(name) + n.suffix
	return plugin.NextOrFailure(n.Name(), n.next, ctx, &renamer{ResponseWriter: w, from: full.Question[0].Name, to: name}, full)
}

// renamer gives the answer the name that was asked.
type renamer struct {
	dns.ResponseWriter
	from, to string
}

func (r *renamer) WriteMsg(m *dns.Msg) error {
	for i := range m.Question {
		if strings.EqualFold(m.Question[i].Name, r.from) {
			m.Question[i].Name = r.to
		}
	}
	for _, rr := range m.Answer {
		if strings.EqualFold(rr.Header().Name, r.from) {
			rr.Header().Name = r.to
		}
	}
	return r.ResponseWriter.WriteMsg(m)
}
