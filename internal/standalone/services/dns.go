package services

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"k8s.io/klog/v2"

	// The plugins the Corefile uses, and only those: each registers
	// itself with CoreDNS's server when imported.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
)

// corefile is the DNS server's configuration, the one kubeadm deploys
// without the plugins a one-machine cluster has no use for (health and
// ready probes, metrics, reload, loop detection): cluster names from the
// API, SERVICE.NAMESPACE as well (namespaced.go), other names from the
// host's resolvers, answers cached 30 s.
const corefile = `.:53 {
    bind {{ADDR}}
    errors
    netop_namespaced
    kubernetes {{DOMAIN}} in-addr.arpa ip6.arpa {
        kubeconfig {{KUBECONFIG}}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . /etc/resolv.conf {
        max_concurrent 1000
    }
    cache 30
    loadbalance
}
`

// dnsServer is CoreDNS, in process.
type dnsServer struct {
	instance *caddy.Instance
	log      *os.File
}

// startDNS serves the cluster's DNS on addr, port 53, UDP and TCP, logging
// to logDir/coredns.log.
func startDNS(ctx context.Context, addr netip.Addr, kubeconfig, logDir string, namespaceExists func(string) bool) (*dnsServer, error) {
	namespaceMu.Lock()
	namespaceLookup = namespaceExists
	namespaceMu.Unlock()
	// CoreDNS prints its banner and zones to stdout, which is the
	// standalone's user's, and logs through the standard library's logger,
	// which nothing else of the standalone uses: both go to its own file.
	dnsserver.Quiet = true
	caddy.Quiet = true
	f, err := os.OpenFile(filepath.Join(logDir, "coredns.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("CoreDNS log: %w", err)
	}
	log.SetOutput(f)
	conf := strings.NewReplacer("{{ADDR}}", addr.String(), "{{DOMAIN}}", ClusterDomain, "{{KUBECONFIG}}", kubeconfig).Replace(corefile)
	instance, err := caddy.Start(caddy.CaddyfileInput{Contents: []byte(conf), Filepath: "Corefile", ServerTypeName: "dns"})
	// Its kubernetes plugin takes klog over, process-wide; the embedded
	// components' logs stay where the control plane sent them.
	klog.ClearLogger()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting CoreDNS on %s:53: %w", addr, err)
	}
	klog.FromContext(ctx).V(1).Info("CoreDNS serving", "address", addr, "domain", ClusterDomain)
	return &dnsServer{instance: instance, log: f}, nil
}

func (d *dnsServer) stop() {
	_ = d.instance.Stop()
	_ = d.log.Close()
}
