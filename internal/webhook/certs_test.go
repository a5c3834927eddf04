package webhook

import (
	"bytes"
	"context"
	"encoding/pem"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/netop-dev/netop/internal/pki"
)

// loadedNothing is a store whose first Load finds nothing: the replica
// that loaded just before another one stored.
type loadedNothing struct {
	SecretStore
	loads int
}

func (s *loadedNothing) Load(ctx context.Context) (*Bundle, error) {
	s.loads++
	if s.loads == 1 {
		return nil, nil
	}
	return s.SecretStore.Load(ctx)
}

// Two replicas start together: the second made its own CA before it could
// see the first's, and takes the stored one instead of writing over it, so
// both serve certificates of the CA in the Secret.
func TestReplicasShareOneCA(t *testing.T) {
	client := fake.NewClientset()
	store := SecretStore{Client: client, Namespace: "netop-system", Name: "netop-webhook-certs"}
	serving := pki.ServingCert{DNSNames: []string{"netop-webhook.netop-system.svc"}}
	first := NewCertManager(store, serving)
	if err := first.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	late := &loadedNothing{SecretStore: store}
	second := NewCertManager(late, serving)
	if err := second.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	stored, err := store.Load(t.Context())
	if err != nil || stored == nil {
		t.Fatalf("stored bundle: %v, %v", stored, err)
	}
	for name, m := range map[string]*CertManager{"first": first, "second": second} {
		if !bytes.Equal(m.CABundle(), stored.CACert) {
			t.Errorf("the %s replica trusts a CA other than the stored one", name)
		}
		cert, err := m.GetCertificate(nil)
		block, _ := pem.Decode(stored.Cert)
		if err != nil || block == nil || !bytes.Equal(block.Bytes, cert.Certificate[0]) {
			t.Errorf("the %s replica serves a certificate other than the stored one (%v)", name, err)
		}
	}
	if late.loads != 2 {
		t.Errorf("the second replica loaded %d times, want 2 (nothing, then the first's bundle)", late.loads)
	}
}
