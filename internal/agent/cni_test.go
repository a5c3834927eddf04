package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

// The install itself runs against a real node in test/standalone; this
// covers what that cannot see: the thin plugin chosen where the image has
// it, and an installed binary replaced only when it differs.
func TestCNIInstall(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "netop")
	if err := os.WriteFile(exe, []byte("plugin v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := PluginExecutable(exe); got != exe {
		t.Errorf("without a netop-cni beside it, the plugin is %s, want the agent's own binary", got)
	}
	thin := filepath.Join(dir, "netop-cni")
	if err := os.WriteFile(thin, []byte("thin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := PluginExecutable(exe); got != thin {
		t.Errorf("with a netop-cni beside it, the plugin is %s, want that", got)
	}
	c := &CNIInstall{Executable: exe, BinDir: filepath.Join(dir, "bin")}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	if c.Installed() {
		t.Fatal("installed before Run")
	}
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !c.Installed() {
		if time.Now().After(deadline) {
			t.Fatal("not installed within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
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
