package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2/ktesting"
)

// The install itself runs against a real API server in test/install; this
// covers what that cannot wait for: tokens renewed before they expire,
// and an installed binary replaced only when it differs.
func TestCNIInstallRenewsTokens(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "netop")
	if err := os.WriteFile(exe, []byte("plugin v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset()
	var issued atomic.Int32
	kube.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		n := issued.Add(1)
		return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{
			Token: fmt.Sprintf("token-%d", n), ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Second)),
		}}, nil
	})
	c := &CNIInstall{Executable: exe, BinDir: filepath.Join(dir, "bin"), Kubeconfig: filepath.Join(dir, "conf", "netop.kubeconfig"),
		Server: "https://10.0.0.1:443", CAData: []byte("ca"), Namespace: "netop-system", ServiceAccount: "netop-cni",
		TokenLifetime: time.Hour, Kube: kube}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	if c.Installed() {
		t.Fatal("installed before Run")
	}
	go func() { done <- c.Run(ctx) }()

	deadline := time.Now().Add(10 * time.Second)
	for issued.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d tokens issued in 10 s of 1 s tokens, want at least 3", issued.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !c.Installed() {
		t.Error("not installed after three tokens")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	token, err := os.ReadFile(c.TokenPath())
	if err != nil || string(token) != fmt.Sprintf("token-%d", issued.Load()) {
		t.Errorf("token file %q (%v), want the last issued, token-%d", token, err, issued.Load())
	}
	if info, err := os.Stat(c.TokenPath()); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("token file mode: %v %v", info, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != c.Server || cfg.BearerTokenFile != c.TokenPath() || !bytes.Equal(cfg.CAData, c.CAData) {
		t.Errorf("kubeconfig: host %s, token file %s, CA %q", cfg.Host, cfg.BearerTokenFile, cfg.CAData)
	}
	if got, err := os.ReadFile(filepath.Join(c.BinDir, "netop-cni")); err != nil || string(got) != "plugin v1" {
		t.Errorf("installed plugin: %q %v", got, err)
	}

	// The same binary is left alone; another replaces it.
	installed := filepath.Join(c.BinDir, "netop-cni")
	before, _ := os.Stat(installed)
	if err := c.installBinary(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(installed); !os.SameFile(before, after) {
		t.Errorf("the same binary was written again")
	}
	if err := os.WriteFile(exe, []byte("plugin v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.installBinary(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(installed); string(got) != "plugin v2" {
		t.Errorf("installed plugin after an upgrade: %q", got)
	}
	// Another size, and more than one comparison chunk.
	big := bytes.Repeat([]byte("plugin v3 "), 20000)
	for _, content := range [][]byte{[]byte("plugin v10"), big, append(bytes.Clone(big[:len(big)-1]), '!'), big} {
		if err := os.WriteFile(exe, content, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := c.installBinary(); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(installed); !bytes.Equal(got, content) {
			t.Errorf("installed plugin after an upgrade to %d bytes: %d bytes", len(content), len(got))
		}
	}
	before, _ = os.Stat(installed)
	if err := c.installBinary(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(installed); !os.SameFile(before, after) {
		t.Errorf("the same %d-byte binary was written again", len(big))
	}
}
