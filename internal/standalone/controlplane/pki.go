package controlplane

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/csv"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"

	pkiutil "github.com/netop-dev/netop/internal/pki"
)

// The files of the control plane's PKI under DIR/pki. They are made once and
// reused, so that kubeconfigs written earlier stay valid.
const (
	caCertFile      = "ca.crt"
	caKeyFile       = "ca.key"
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
	saKeyFile       = "sa.key"
	tokenFile       = "tokens.csv"

	// etcd has a CA of its own, so that no certificate the API server
	// trusts (--client-ca-file) opens etcd: only the API server's client
	// certificate does. One member certificate serves the client and the
	// peer listener.
	etcdCACertFile     = "etcd/ca.crt"
	etcdCAKeyFile      = "etcd/ca.key"
	etcdServerCertFile = "etcd/server.crt"
	etcdServerKeyFile  = "etcd/server.key"
	etcdClientCertFile = "apiserver-etcd-client.crt"
	etcdClientKeyFile  = "apiserver-etcd-client.key"

	// The API server's client certificate for kubelets (logs, exec,
	// port-forward), which trust the cluster CA.
	kubeletClientCertFile = "apiserver-kubelet-client.crt"
	kubeletClientKeyFile  = "apiserver-kubelet-client.key"
)

// Users of the control plane, each authenticated by a bearer token.
const (
	adminUser             = "netop-admin"
	controllerManagerUser = "system:kube-controller-manager"
	schedulerUser         = "system:kube-scheduler"
	// kube-proxy's user, bound to system:node-proxier by the API
	// server's bootstrap policy.
	kubeProxyUser = "system:kube-proxy"
)

// NodeUser is the user name of the kubelet of node.
func NodeUser(node string) string { return "system:node:" + node }

type pki struct {
	dir string
	// tokens by user name.
	tokens map[string]string
	caPEM  []byte
	// etcdCAPEM is the CA of etcd's serving and client certificates.
	etcdCAPEM []byte
}

// ensurePKI loads the PKI from dir, making whatever is missing, with a
// token for the kubelet of each node named.
func ensurePKI(dir string, nodes ...string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating PKI directory: %w", err)
	}
	p := &pki{dir: dir}

	if err := os.MkdirAll(p.path("etcd"), 0o700); err != nil {
		return nil, fmt.Errorf("creating PKI directory: %w", err)
	}
	var err error
	if p.caPEM, err = p.ensureCA(caCertFile, caKeyFile, "netop-controlplane-ca"); err != nil {
		return nil, err
	}
	if err := p.ensureCert(servingCert, p.caPEM, caKeyFile, servingCertFile, servingKeyFile); err != nil {
		return nil, fmt.Errorf("kube-apiserver serving certificate: %w", err)
	}
	if p.etcdCAPEM, err = p.ensureCA(etcdCACertFile, etcdCAKeyFile, "netop-etcd-ca"); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	if err := p.ensureCert(etcdServerCert, p.etcdCAPEM, etcdCAKeyFile, etcdServerCertFile, etcdServerKeyFile); err != nil {
		return nil, fmt.Errorf("etcd serving certificate: %w", err)
	}
	if err := p.ensureCert(etcdClientCert, p.etcdCAPEM, etcdCAKeyFile, etcdClientCertFile, etcdClientKeyFile); err != nil {
		return nil, fmt.Errorf("kube-apiserver's etcd client certificate: %w", err)
	}
	if err := p.ensureKey(saKeyFile); err != nil {
		return nil, fmt.Errorf("service account key: %w", err)
	}
	if err := p.ensureCert(kubeletClientCert, p.caPEM, caKeyFile, kubeletClientCertFile, kubeletClientKeyFile); err != nil {
		return nil, fmt.Errorf("kube-apiserver's kubelet client certificate: %w", err)
	}
	if err := p.ensureTokens(nodes); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (p *pki) ensureKey(name string) error {
	if exists(p.path(name)) {
		return nil
	}
	key, err := pkiutil.NewKeyPEM()
	if err != nil {
		return err
	}
	return keyutil.WriteKey(p.path(name), key)
}

// ensureCA makes a CA (key and self-signed certificate) unless it exists,
// and returns its certificate.
func (p *pki) ensureCA(certFile, keyFile, commonName string) ([]byte, error) {
	if err := p.ensureKey(keyFile); err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !exists(p.path(certFile)) {
		key, err := os.ReadFile(p.path(keyFile))
		if err != nil {
			return nil, err
		}
		cert, err := pkiutil.NewCAPEM(commonName, key)
		if err != nil {
			return nil, fmt.Errorf("CA certificate: %w", err)
		}
		if err := certutil.WriteCert(p.path(certFile), cert); err != nil {
			return nil, fmt.Errorf("CA certificate: %w", err)
		}
	}
	return os.ReadFile(p.path(certFile))
}

// servingCert is the API server's certificate: 127.0.0.1, localhost and the
// names and address in-cluster clients use.
var servingCert = pkiutil.ServingCert{
	CommonName: "kube-apiserver",
	DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	IPs:      []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(KubernetesServiceIP)},
	Validity: 365 * 24 * time.Hour,
}

// etcdServerCert is etcd's member certificate, for its client and peer
// listeners on 127.0.0.1. It is a client certificate too: etcd's gRPC
// gateway and peers connect with it.
var etcdServerCert = pkiutil.ServingCert{
	CommonName: "netop-etcd",
	DNSNames:   []string{"localhost"},
	IPs:        []net.IP{net.ParseIP("127.0.0.1")},
	Validity:   365 * 24 * time.Hour,
	Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
}

// etcdClientCert is the API server's client certificate for etcd.
var etcdClientCert = pkiutil.ServingCert{
	CommonName: "kube-apiserver-etcd-client",
	Validity:   365 * 24 * time.Hour,
	Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
}

// kubeletClientCert is the API server's client certificate for kubelets:
// a kubelet authorizes it by a SubjectAccessReview, which system:masters
// passes.
var kubeletClientCert = pkiutil.ServingCert{
	CommonName:    "kube-apiserver-kubelet-client",
	Organizations: []string{"system:masters"},
	Validity:      365 * 24 * time.Hour,
	Usages:        []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
}

// ensureCert makes the certificate spec describes, signed by the CA, unless
// one that is current and signed by that CA exists: certificates are
// renewed well before they expire, and re-issued when the CA was made anew.
func (p *pki) ensureCert(spec pkiutil.ServingCert, caPEM []byte, caKeyFile, certFile, keyFile string) error {
	if cert, err := os.ReadFile(p.path(certFile)); err == nil && exists(p.path(keyFile)) &&
		spec.Current(cert, time.Now()) && signedBy(cert, caPEM) {
		return nil
	}
	key, err := pkiutil.NewKeyPEM()
	if err != nil {
		return err
	}
	caKey, err := os.ReadFile(p.path(caKeyFile))
	if err != nil {
		return err
	}
	cert, err := spec.Sign(caPEM, caKey, key)
	if err != nil {
		return err
	}
	if err := keyutil.WriteKey(p.path(keyFile), key); err != nil {
		return err
	}
	return certutil.WriteCert(p.path(certFile), cert)
}

// signedBy reports whether certPEM's first certificate is signed by caPEM's.
func signedBy(certPEM, caPEM []byte) bool {
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		return false
	}
	cas, err := certutil.ParseCertsPEM(caPEM)
	if err != nil {
		return false
	}
	return certs[0].CheckSignatureFrom(cas[0]) == nil
}

// ensureTokens writes the API server's static token file: one token for the
// administrator (group system:masters) and one for kube-controller-manager.
func (p *pki) ensureTokens(nodes []string) error {
	users := []struct{ name, groups string }{
		{adminUser, "system:masters"},
		{controllerManagerUser, ""},
		{schedulerUser, ""},
		{kubeProxyUser, ""},
	}
	for _, node := range nodes {
		// The Node authorizer and NodeRestriction know a kubelet by this
		// name and group.
		users = append(users, struct{ name, groups string }{NodeUser(node), "system:nodes"})
	}
	p.tokens = map[string]string{}
	if data, err := os.ReadFile(p.path(tokenFile)); err == nil {
		if err := parseTokens(data, p.tokens); err != nil {
			return err
		}
	}
	missing := false
	for _, u := range users {
		if p.tokens[u.name] == "" {
			missing = true
		}
	}
	if !missing {
		return nil
	}
	var out []byte
	for _, u := range users {
		if p.tokens[u.name] == "" {
			b := make([]byte, 24)
			if _, err := rand.Read(b); err != nil {
				return err
			}
			p.tokens[u.name] = hex.EncodeToString(b)
		}
		out = fmt.Appendf(out, "%s,%s,%s,%q\n", p.tokens[u.name], u.name, u.name, u.groups)
	}
	return os.WriteFile(p.path(tokenFile), out, 0o600)
}

func parseTokens(data []byte, into map[string]string) error {
	records, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		return fmt.Errorf("reading %s: %w", tokenFile, err)
	}
	for _, r := range records {
		if len(r) >= 2 {
			into[r[1]] = r[0]
		}
	}
	return nil
}
