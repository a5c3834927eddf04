// Package pki makes the small certificate authorities netop needs: one for
// the embedded API server and one for the admission webhooks. Keys are ECDSA
// P-256; everything is PEM.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"

	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// NewKeyPEM makes a private key.
func NewKeyPEM() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: keyutil.ECPrivateKeyBlockType, Bytes: der}), nil
}

// ParseKey parses a PEM private key that can sign.
func ParseKey(keyPEM []byte) (crypto.Signer, error) {
	key, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key of type %T cannot sign", key)
	}
	return signer, nil
}

// NewCAPEM makes a self-signed CA certificate for keyPEM (valid ten years).
func NewCAPEM(commonName string, keyPEM []byte) ([]byte, error) {
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	cert, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: commonName}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: certutil.CertificateBlockType, Bytes: cert.Raw}), nil
}

// ServingCert describes a TLS server certificate, or with Usages a client
// certificate, or one that is both (an etcd member's).
type ServingCert struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	Validity   time.Duration
	// Usages are the extended key usages; empty means server
	// authentication only.
	Usages []x509.ExtKeyUsage
	// Organizations are the subject's organizations: a client
	// certificate's groups, to Kubernetes.
	Organizations []string
}

func (s ServingCert) usages() []x509.ExtKeyUsage {
	if len(s.Usages) == 0 {
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	return s.Usages
}

// Sign issues the serving certificate for the public half of keyPEM, signed
// by the CA.
func (s ServingCert) Sign(caCertPEM, caKeyPEM, keyPEM []byte) ([]byte, error) {
	ca, err := parseCert(caCertPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	caKey, err := ParseKey(caKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: s.CommonName, Organization: s.Organizations},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(s.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  s.usages(),
		IPAddresses:  s.IPs,
		DNSNames:     s.DNSNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("signing serving certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: certutil.CertificateBlockType, Bytes: der}), nil
}

// Current reports whether certPEM is a certificate that covers the serving
// certificate's names, addresses and usages and has more than a third of
// its validity left, so that renewal happens well before expiry.
func (s ServingCert) Current(certPEM []byte, now time.Time) bool {
	cert, err := parseCert(certPEM)
	if err != nil {
		return false
	}
	lifetime := cert.NotAfter.Sub(cert.NotBefore)
	if cert.NotAfter.Sub(now) < lifetime/3 {
		return false
	}
	for _, name := range s.DNSNames {
		if !slices.Contains(cert.DNSNames, name) {
			return false
		}
	}
	for _, ip := range s.IPs {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	for _, u := range s.usages() {
		if !slices.Contains(cert.ExtKeyUsage, u) {
			return false
		}
	}
	return true
}

func parseCert(certPEM []byte) (*x509.Certificate, error) {
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}
