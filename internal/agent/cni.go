package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/atomicfile"
	"github.com/netop-dev/netop/internal/cni/cniapi"
)

// CNIInstall puts netop's CNI plugin on the agent's host, as Multus,
// Calico and Cilium agents do for theirs: the plugin binary in the
// runtime's CNI bin directory. The plugin holds no credentials: it asks
// the agent, over the node's CNI socket, to attach each pod, and the agent
// answers from what it already watches.
type CNIInstall struct {
	// Executable is the plugin binary to install: the thin netop-cni the
	// image carries beside the agent, or else the agent's own binary,
	// which runs as the plugin when called netop-cni.
	Executable string
	// BinDir is the host's CNI plugin directory (/opt/cni/bin).
	BinDir string

	// installed is set once the plugin is in place.
	installed atomic.Bool
}

// Installed reports whether the plugin is in place: before that, pods on
// the node cannot be attached, and the agent is not ready.
func (c *CNIInstall) Installed() bool { return c.installed.Load() }

// Run installs the plugin and stays until ctx is done. A failure to
// install is returned at once: the agent is then of no use to pods on its
// node.
func (c *CNIInstall) Run(ctx context.Context) error {
	if err := c.installBinary(); err != nil {
		return err
	}
	c.installed.Store(true)
	klog.FromContext(ctx).Info("Installed the CNI plugin", "binDir", c.BinDir, "from", c.Executable)
	<-ctx.Done()
	return nil
}

// PluginExecutable is the binary the agent whose own is self installs as
// the plugin: netop-cni beside it, which starts in a few milliseconds,
// or itself (every package of the operator initialised at each call).
func PluginExecutable(self string) string {
	thin := filepath.Join(filepath.Dir(self), cniapi.Type)
	if info, err := os.Stat(thin); err == nil && info.Mode().IsRegular() {
		return thin
	}
	return self
}

// installBinary copies Executable to BinDir/netop-cni unless it is there
// already, through a rename so that the runtime never runs half a file.
// The comparison streams both files: an agent's start should not hold two
// copies of its own binary in memory to find that nothing changed.
func (c *CNIInstall) installBinary() error {
	dst := filepath.Join(c.BinDir, cniapi.Type)
	if same, err := sameContent(c.Executable, dst); err == nil && same {
		return nil
	}
	src, err := os.ReadFile(c.Executable)
	if err != nil {
		return fmt.Errorf("read the CNI plugin %s: %w", c.Executable, err)
	}
	if err := writeFile(dst, src, 0o755); err != nil {
		return fmt.Errorf("install the CNI plugin: %w", err)
	}
	return nil
}

// sameContent reports whether the files a and b hold the same bytes,
// comparing sizes first, then 64 KiB at a time.
func sameContent(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer func() { _ = fa.Close() }()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer func() { _ = fb.Close() }()
	sa, err := fa.Stat()
	if err != nil {
		return false, err
	}
	sb, err := fb.Stat()
	if err != nil {
		return false, err
	}
	if sa.Size() != sb.Size() {
		return false, nil
	}
	bufA, bufB := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, errA := io.ReadFull(fa, bufA)
		nb, errB := io.ReadFull(fb, bufB)
		if na != nb || !bytes.Equal(bufA[:na], bufB[:nb]) {
			return false, nil
		}
		if errA == io.EOF || errA == io.ErrUnexpectedEOF {
			return errB == errA, nil
		}
		if errA != nil {
			return false, errA
		}
		if errB != nil {
			return false, errB
		}
	}
}

// writeFile writes path whole, making its directory if need be.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, data, mode)
}
