package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/netop-dev/netop/internal/cni/cniapi"
)

func requireBusybox(t *testing.T) {
	t.Helper()
	if b, err := os.ReadFile("/bin/busybox"); err != nil || isDynamic(b) {
		t.Fatalf("this test needs Debian's busybox-static (%s): %v", InstallCommand, err)
	}
}

// The images are the same, digest for digest, on every start: containerd
// keeps what it pulled before.
func TestLocalImagesAreReproducible(t *testing.T) {
	requireBusybox(t)
	first, err := LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	second, err := LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	for ref, img := range first {
		d1, _ := img.Digest()
		d2, _ := second[ref].Digest()
		if d1 != d2 {
			t.Errorf("%s: digest %s, then %s", ref, d1, d2)
		}
		cf, err := img.ConfigFile()
		if err != nil || cf.OS != "linux" || cf.Architecture == "" {
			t.Errorf("%s: config %+v (%v)", ref, cf, err)
		}
	}
	if cf, _ := first[BusyboxImage].ConfigFile(); !slices.Equal(cf.Config.Cmd, []string{"sh"}) {
		t.Errorf("busybox runs %v, want sh", cf.Config.Cmd)
	}
}

// The registry answers as the mirror of docker.io and registry.k8s.io:
// busybox under library/busybox, pause under pause.
func TestRegistryServesTheImagesAsTheirMirror(t *testing.T) {
	requireBusybox(t)
	r, err := StartRegistry(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	images, err := LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	for ref, path := range map[string]string{BusyboxImage: "library/busybox:latest", PauseImage: "pause:3.10"} {
		want, _ := images[ref].Digest()
		ref, err := name.ParseReference(r.addr+"/"+path, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Get(ref)
		if err != nil {
			t.Fatalf("%s from the registry: %v", path, err)
		}
		if got.Digest != want {
			t.Errorf("%s: digest %s, want %s", path, got.Digest, want)
		}
	}
	if ref, err := name.ParseReference(r.addr+"/library/nginx:latest", name.Insecure); err != nil {
		t.Fatal(err)
	} else if _, err := remote.Get(ref); err == nil {
		t.Error("the registry serves an image it was never given")
	}
}

// With a network namespace, the bridge plugin runs inside it; the pod
// network's configuration names the bridge and keeps its addresses under
// the node's directory.
func TestWriteCNI(t *testing.T) {
	dataDir := t.TempDir()
	dir := filepath.Join(dataDir, "node")
	for _, sub := range []string{"cni/net.d", "cni/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{DataDir: dataDir, Netns: "netop-x", PodCIDR: "10.88.3.0/24", Kubeconfig: "/k/node.kubeconfig", Executable: "/bin/netop-standalone"}
	if err := writeCNI(dir, cfg); err != nil {
		t.Fatal(err)
	}
	// containerd runs in the node's namespace: the plugins run as they are.
	for _, name := range []string{"bridge", "host-local"} {
		if target, err := os.Readlink(filepath.Join(dir, "cni/bin", name)); err != nil || target != "/usr/lib/cni/"+name {
			t.Errorf("%s -> %q (%v)", name, target, err)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "cni/net.d/10-netop-pods.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			Type, Bridge string
			IPAM         struct {
				Type    string
				DataDir string
				Ranges  [][]struct{ Subnet string }
			}
			Socket, NodeNetns, DataDir string
		}
	}
	if err := json.Unmarshal(data, &conf); err != nil || len(conf.Plugins) != 2 {
		t.Fatalf("conflist %s: %v", data, err)
	}
	if p := conf.Plugins[0]; p.Type != "bridge" || p.Bridge != PodBridge || p.IPAM.Type != "host-local" || p.IPAM.DataDir != filepath.Join(dir, "cni/ipam") ||
		len(p.IPAM.Ranges) != 1 || p.IPAM.Ranges[0][0].Subnet != cfg.PodCIDR {
		t.Errorf("plugin %+v", p)
	}
	// netop's plugin chained after it, asking netop on the node's socket.
	if p := conf.Plugins[1]; p.Type != cniapi.Type || p.Socket != cniapi.DefaultSocket || p.NodeNetns != "" || p.DataDir != filepath.Join(dir, "cni/netop") {
		t.Errorf("netop plugin %+v", p)
	}
	if target, err := os.Readlink(filepath.Join(dir, "cni/bin", cniapi.Type)); err != nil || target != cfg.Executable {
		t.Errorf("%s -> %q (%v)", cniapi.Type, target, err)
	}

	// The thin plugin beside the standalone's binary is the one the
	// runtime executes; a file of its name that cannot be executed is not.
	bin := t.TempDir()
	cfg.Executable = filepath.Join(bin, "netop-standalone")
	thin := filepath.Join(bin, cniapi.Type)
	for _, tc := range []struct {
		mode os.FileMode
		want string
	}{{0o644, cfg.Executable}, {0o755, thin}} {
		if err := os.WriteFile(thin, nil, tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(thin, tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := writeCNI(dir, cfg); err != nil {
			t.Fatal(err)
		}
		if target, err := os.Readlink(filepath.Join(dir, "cni/bin", cniapi.Type)); err != nil || target != tc.want {
			t.Errorf("%s beside it, mode %v: %s -> %q (%v), want %q", cniapi.Type, tc.mode, cniapi.Type, target, err, tc.want)
		}
	}
}

// The image's busybox takes wget's -T (as scripts and probes write it)
// where Debian's dies with SIGSEGV, and its other options still work.
func TestBusyboxWgetTakesTimeout(t *testing.T) {
	host, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no /bin/busybox: %v", err)
	}
	fixed := fixWgetTimeout(host)
	if len(fixed) != len(host) {
		t.Fatalf("the fixed busybox is %d bytes, not %d", len(fixed), len(host))
	}
	path := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(path, fixed, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "%s %s", r.Method, r.Header.Get("X-Probe"))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-q", "-T", "5", "-O-", srv.URL}, "GET "},
		{[]string{"-q", "-T5", "-U", "probe", "--header", "X-Probe: yes", "-O-", srv.URL}, "GET yes"},
		{[]string{"-q", "-t", "2", "-nv", "--post-data", "a=b", "-O-", srv.URL}, "POST "},
	} {
		out, err := exec.Command(path, append([]string{"wget"}, tc.args...)...).CombinedOutput()
		if err != nil || string(out) != tc.want {
			t.Errorf("wget %v: %q (%v), want %q", tc.args, out, err, tc.want)
		}
	}
	if out, err := exec.Command(path, "wget", "-q", "-T", "5", "--spider", srv.URL).CombinedOutput(); err != nil {
		t.Errorf("wget --spider: %q (%v)", out, err)
	}
}

func TestParseCgroupMounts(t *testing.T) {
	mountinfo := `25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/cpuset rw,nosuid shared:9 - cgroup cgroup rw,cpuset
28 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
29 25 0:27 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
`
	ms, err := parseMountinfo(strings.NewReader(mountinfo))
	if err != nil {
		t.Fatal(err)
	}
	got := cgroupMountsOf(ms)
	want := []cgroupMount{
		{path: "/sys/fs/cgroup/unified", v2: true},
		{path: "/sys/fs/cgroup/cpuset", controllers: []string{"cpuset"}},
		{path: "/sys/fs/cgroup/cpu,cpuacct", controllers: []string{"cpu", "cpuacct"}},
		{path: "/sys/fs/cgroup/systemd"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i].path != want[i].path || got[i].v2 != want[i].v2 || !slices.Equal(got[i].controllers, want[i].controllers) {
			t.Errorf("mount %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// Without the programs, Check names each with its package and the line
// that installs them.
func TestCheckSaysWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := Check()
	if err == nil {
		t.Fatal("no error with an empty PATH")
	}
	for _, want := range []string{"containerd (Debian package containerd)", "runc (Debian package runc)", "apt-get install -y containerd runc"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

// A kubelet binding its device plugin socket replaces the file, which may
// get the inode number of the one it replaced: fileID still tells them
// apart, and says there is none when there is none.
func TestFileIDTellsAReplacedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubelet.sock")
	if fileID(path) != (fileKey{}) {
		t.Fatal("a missing file has an identity")
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	first := fileID(path)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if second := fileID(path); second == first || second == (fileKey{}) {
		t.Errorf("a file made anew: %+v, the one it replaced: %+v", second, first)
	}
}
