package controlplane

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/csv"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
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

	caCert, caKey, err := p.ensureCA()
	if err != nil {
		return nil, err
	}
	if err := p.ensureServingCert(caCert, caKey); err != nil {
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return keyutil.WriteKey(p.path(name), pemBlock(keyutil.ECPrivateKeyBlockType, der))
}

func (p *pki) loadKey(name string) (crypto.Signer, error) {
	key, err := keyutil.PrivateKeyFromFile(p.path(name))
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s is not a signing key", name)
	}
	return signer, nil
}

func (p *pki) ensureCA() (*x509.Certificate, crypto.Signer, error) {
	if err := p.ensureKey(caKeyFile); err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	key, err := p.loadKey(caKeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	if !exists(p.path(caCertFile)) {
		cert, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "netop-controlplane-ca"}, key)
		if err != nil {
			return nil, nil, fmt.Errorf("CA certificate: %w", err)
		}
		if err := certutil.WriteCert(p.path(caCertFile), pemBlock(certutil.CertificateBlockType, cert.Raw)); err != nil {
			return nil, nil, fmt.Errorf("CA certificate: %w", err)
		}
	}
	certs, err := certutil.CertsFromFile(p.path(caCertFile))
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	p.caPEM, err = os.ReadFile(p.path(caCertFile))
	if err != nil {
		return nil, nil, err
	}
	return certs[0], key, nil
}

// ensureServingCert makes the API server's certificate for 127.0.0.1 and
// localhost, signed by the CA, and renews it when it is within a month of
// expiry.
func (p *pki) ensureServingCert(ca *x509.Certificate, caKey crypto.Signer) error {
	if certs, err := certutil.CertsFromFile(p.path(servingCertFile)); err == nil &&
		time.Until(certs[0].NotAfter) > 30*24*time.Hour && exists(p.path(servingKeyFile)) {
		return nil
	}
	if err := os.Remove(p.path(servingKeyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := p.ensureKey(servingKeyFile); err != nil {
		return fmt.Errorf("serving key: %w", err)
	}
	key, err := p.loadKey(servingKeyFile)
	if err != nil {
		return fmt.Errorf("serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("signing serving certificate: %w", err)
	}
	return certutil.WriteCert(p.path(servingCertFile), pemBlock(certutil.CertificateBlockType, der))
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

func pemBlock(blockType string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
}
