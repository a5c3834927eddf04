package controlplane

import (
	"bytes"
	"crypto/rand"
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
)

// Users of the control plane, each authenticated by a bearer token.
const (
	adminUser             = "netop-admin"
	controllerManagerUser = "system:kube-controller-manager"
)

type pki struct {
	dir string
	// tokens by user name.
	tokens map[string]string
	caPEM  []byte
}

// ensurePKI loads the PKI from dir, making whatever is missing.
func ensurePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating PKI directory: %w", err)
	}
	p := &pki{dir: dir}

	if err := p.ensureCA(); err != nil {
		return nil, err
	}
	if err := p.ensureServingCert(); err != nil {
		return nil, err
	}
	if err := p.ensureKey(saKeyFile); err != nil {
		return nil, fmt.Errorf("service account key: %w", err)
	}
	if err := p.ensureTokens(); err != nil {
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

func (p *pki) ensureCA() error {
	if err := p.ensureKey(caKeyFile); err != nil {
		return fmt.Errorf("CA key: %w", err)
	}
	if !exists(p.path(caCertFile)) {
		key, err := os.ReadFile(p.path(caKeyFile))
		if err != nil {
			return err
		}
		cert, err := pkiutil.NewCAPEM("netop-controlplane-ca", key)
		if err != nil {
			return fmt.Errorf("CA certificate: %w", err)
		}
		if err := certutil.WriteCert(p.path(caCertFile), cert); err != nil {
			return fmt.Errorf("CA certificate: %w", err)
		}
	}
	var err error
	p.caPEM, err = os.ReadFile(p.path(caCertFile))
	return err
}

// servingCert is the API server's certificate: 127.0.0.1, localhost and the
// names in-cluster clients use.
var servingCert = pkiutil.ServingCert{
	CommonName: "kube-apiserver",
	DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	IPs:      []net.IP{net.ParseIP("127.0.0.1")},
	Validity: 365 * 24 * time.Hour,
}

// ensureServingCert makes the API server's certificate, signed by the CA,
// and renews it well before it expires.
func (p *pki) ensureServingCert() error {
	if cert, err := os.ReadFile(p.path(servingCertFile)); err == nil && exists(p.path(servingKeyFile)) && servingCert.Current(cert, time.Now()) {
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
	cert, err := servingCert.Sign(p.caPEM, caKey, key)
	if err != nil {
		return err
	}
	if err := keyutil.WriteKey(p.path(servingKeyFile), key); err != nil {
		return err
	}
	return certutil.WriteCert(p.path(servingCertFile), cert)
}

// ensureTokens writes the API server's static token file: one token for the
// administrator (group system:masters) and one for kube-controller-manager.
func (p *pki) ensureTokens() error {
	users := []struct{ name, groups string }{
		{adminUser, "system:masters"},
		{controllerManagerUser, ""},
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
