// Package nettest helps tests that make real kernel network objects
// (bridges, network namespaces). It has no Kubernetes dependencies, so that
// the backend's own tests stay small.
package nettest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

// RequireRoot skips a test that makes real kernel network objects when not
// root, except in CI (CI=true), where skipping would hide the feature.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI must run this test as root: it makes real Linux bridges in throwaway network namespaces")
	}
	t.Skip("not root: this test makes real Linux bridges in throwaway network namespaces; run it as root (sudo -E go test ...)")
}

// NetnsName returns a network namespace name unique to this run, for a
// test's throwaway namespace.
func NetnsName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
