package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/pki"
)

// Bundle is the webhook's PKI: its own CA and the serving certificate the
// CA signed, all PEM.
type Bundle struct {
	CACert, CAKey, Cert, Key []byte
	// version is the stored bundle's version (a Secret's
	// resourceVersion), "" for a bundle not stored yet: a store refuses
	// to save over a bundle someone else stored since.
	version string
}

// errStoredMeanwhile is a store's refusal to save over a bundle another
// replica stored after this one loaded.
var errStoredMeanwhile = errors.New("the webhook certificates were stored by another replica meanwhile")

// CertStore persists the Bundle, so that a restart keeps the CA that the
// webhook configurations trust.
type CertStore interface {
	// Load returns nil and no error when nothing is stored yet.
	Load(ctx context.Context) (*Bundle, error)
	// Save stores b, or returns errStoredMeanwhile when what is stored is
	// no longer what b was loaded from.
	Save(ctx context.Context, b *Bundle) error
}

// CertManager keeps a current serving certificate and hands it to the TLS
// server; a renewed certificate is used for the next handshake without a
// restart.
type CertManager struct {
	store   CertStore
	serving pki.ServingCert

	mu     sync.RWMutex
	bundle *Bundle
	cert   *tls.Certificate
}

// NewCertManager manages a certificate for serving.
func NewCertManager(store CertStore, serving pki.ServingCert) *CertManager {
	if serving.Validity == 0 {
		serving.Validity = 365 * 24 * time.Hour
	}
	return &CertManager{store: store, serving: serving}
}

// Ensure loads the stored bundle and makes or renews what is missing or
// within a third of its lifetime of expiry. Replicas starting together
// each find nothing stored and make a CA: the first to store it wins and
// the others take its bundle, so that every replica serves a certificate
// of the CA the webhook configurations trust.
func (m *CertManager) Ensure(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		b, err := m.ensureStored(ctx)
		if errors.Is(err, errStoredMeanwhile) && attempt < 5 {
			continue
		}
		if err != nil {
			return err
		}
		cert, err := tls.X509KeyPair(b.Cert, b.Key)
		if err != nil {
			return fmt.Errorf("webhook serving certificate: %w", err)
		}
		m.mu.Lock()
		m.bundle, m.cert = b, &cert
		m.mu.Unlock()
		return nil
	}
}

// ensureStored loads the bundle, makes or renews what it lacks, and
// stores what changed.
func (m *CertManager) ensureStored(ctx context.Context) (*Bundle, error) {
	b, err := m.store.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading webhook certificates: %w", err)
	}
	if b == nil {
		b = &Bundle{}
	}
	changed := false
	if len(b.CACert) == 0 || len(b.CAKey) == 0 {
		if b.CAKey, err = pki.NewKeyPEM(); err != nil {
			return nil, err
		}
		if b.CACert, err = pki.NewCAPEM("netop-webhook-ca", b.CAKey); err != nil {
			return nil, err
		}
		b.Cert, changed = nil, true
	}
	if len(b.Cert) == 0 || len(b.Key) == 0 || !m.serving.Current(b.Cert, time.Now()) {
		if b.Key, err = pki.NewKeyPEM(); err != nil {
			return nil, err
		}
		if b.Cert, err = m.serving.Sign(b.CACert, b.CAKey, b.Key); err != nil {
			return nil, err
		}
		changed = true
		klog.FromContext(ctx).Info("Issued webhook serving certificate", "dnsNames", m.serving.DNSNames, "ips", m.serving.IPs)
	}
	if changed {
		if err := m.store.Save(ctx, b); err != nil {
			return nil, fmt.Errorf("saving webhook certificates: %w", err)
		}
	}
	return b, nil
}

// RenewLoop checks the certificate every interval until ctx is done. When
// the CA itself had to be made anew (its Secret deleted, say), onCAChange
// gets the new bundle: the webhook configurations must trust it, or the
// API server can no longer call the webhooks.
func (m *CertManager) RenewLoop(ctx context.Context, interval time.Duration, onCAChange func(ctx context.Context, caBundle []byte) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	registered := m.CABundle()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.Ensure(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Renewing the webhook certificate failed; retrying later")
			continue
		}
		if current := m.CABundle(); !bytes.Equal(registered, current) {
			if err := onCAChange(ctx, current); err != nil {
				klog.FromContext(ctx).Error(err, "Registering the new webhook CA failed; retrying later")
				continue
			}
			registered = current
		}
	}
}

// CABundle is the CA certificate that the webhook configurations trust.
func (m *CertManager) CABundle() []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.bundle == nil {
		return nil
	}
	return m.bundle.CACert
}

// GetCertificate is for tls.Config.
func (m *CertManager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.cert == nil {
		return nil, errors.New("no webhook certificate yet")
	}
	return m.cert, nil
}

// FileStore keeps the bundle in a directory (standalone: DIR/webhook).
type FileStore struct{ Dir string }

var bundleFiles = []string{"ca.crt", "ca.key", "tls.crt", "tls.key"}

func (b *Bundle) fields() []*[]byte { return []*[]byte{&b.CACert, &b.CAKey, &b.Cert, &b.Key} }

// Load reads the bundle.
func (s FileStore) Load(context.Context) (*Bundle, error) {
	b := &Bundle{}
	for i, f := range b.fields() {
		data, err := os.ReadFile(filepath.Join(s.Dir, bundleFiles[i]))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		*f = data
	}
	return b, nil
}

// Save writes the bundle, keys readable by the owner only.
func (s FileStore) Save(_ context.Context, b *Bundle) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	for i, f := range b.fields() {
		if err := os.WriteFile(filepath.Join(s.Dir, bundleFiles[i]), *f, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// SecretStore keeps the bundle in a Secret (in a cluster).
type SecretStore struct {
	Client          kubernetes.Interface
	Namespace, Name string
}

// Load reads the Secret.
func (s SecretStore) Load(ctx context.Context) (*Bundle, error) {
	secret, err := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	b := &Bundle{version: secret.ResourceVersion}
	for i, f := range b.fields() {
		*f = secret.Data[bundleFiles[i]]
	}
	return b, nil
}

// Save creates the Secret, or updates the one b was loaded from (its
// resourceVersion: another replica's save in between is a conflict).
func (s SecretStore) Save(ctx context.Context, b *Bundle) error {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: b.version},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{},
	}
	for i, f := range b.fields() {
		secret.Data[bundleFiles[i]] = *f
	}
	var err error
	if b.version == "" {
		_, err = s.Client.CoreV1().Secrets(s.Namespace).Create(ctx, secret, metav1.CreateOptions{})
	} else {
		_, err = s.Client.CoreV1().Secrets(s.Namespace).Update(ctx, secret, metav1.UpdateOptions{})
	}
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %v", errStoredMeanwhile, err)
	}
	return err
}
