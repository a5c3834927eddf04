package node

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/registry"
)

// PauseImage is the sandbox image containerd runs for every pod, as the
// name kubelet and containerd expect.
const PauseImage = "registry.k8s.io/pause:3.10"

// BusyboxImage is the general-purpose image, under the name that
// "busybox" means.
const BusyboxImage = "docker.io/library/busybox:latest"

// imageRegistry is the in-process registry containerd pulls through.
type imageRegistry struct {
	addr   string
	server *http.Server
}

// startRegistry serves a registry on a free loopback port and pushes the
// local images into it.
func startRegistry(ctx context.Context) (*imageRegistry, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("image registry: %w", err)
	}
	r := &imageRegistry{addr: l.Addr().String(), server: &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}}
	go func() { _ = r.server.Serve(l) }()
	images, err := LocalImages()
	if err != nil {
		r.stop()
		return nil, err
	}
	for ref, img := range images {
		if err := r.push(ctx, ref, img); err != nil {
			r.stop()
			return nil, err
		}
	}
	return r, nil
}

// push stores img under ref's repository and tag in the registry, which
// containerd asks as the mirror of ref's registry.
func (r *imageRegistry) push(ctx context.Context, ref string, img v1.Image) error {
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	local, err := name.ParseReference(r.addr+"/"+parsed.Context().RepositoryStr()+":"+parsed.Identifier(), name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(local, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("storing image %s: %w", ref, err)
	}
	return nil
}

func (r *imageRegistry) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.server.Shutdown(ctx)
}

// LocalImages builds the images the node serves, by reference: pause and
// busybox, both from the host's static busybox.
func LocalImages() (map[string]v1.Image, error) {
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, fmt.Errorf("reading /bin/busybox (Debian package busybox-static): %w", err)
	}
	if isDynamic(busybox) {
		return nil, errors.New("/bin/busybox is not static (install Debian's busybox-static)")
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox's applets: %w", err)
	}
	applets := strings.Fields(string(out))
	layer, err := busyboxLayer(busybox, applets)
	if err != nil {
		return nil, err
	}
	// The pause container only holds the pod's namespaces; containerd
	// stops sandboxes with SIGKILL, and the shell exits on SIGTERM too.
	pause, err := imageOf(layer, []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"}, nil)
	if err != nil {
		return nil, err
	}
	shell, err := imageOf(layer, nil, []string{"sh"})
	if err != nil {
		return nil, err
	}
	return map[string]v1.Image{PauseImage: pause, BusyboxImage: shell}, nil
}

// busyboxLayer is a root file system of busybox and a link per applet,
// with the files a shell expects. Fixed times make the same layer, and so
// the same image digest, on every start: containerd keeps what it pulled.
func busyboxLayer(busybox []byte, applets []string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, dir := range []string{"bin", "dev", "etc", "proc", "root", "sys", "tmp", "var"} {
		mode := int64(0o755)
		if dir == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for _, f := range []string{"etc/group", "etc/passwd"} {
		if err := writeFile(tw, f, []byte(files[f]), 0o644, epoch); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, "bin/busybox", busybox, 0o755, epoch); err != nil {
		return nil, err
	}
	for _, applet := range applets {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

func writeFile(tw *tar.Writer, name string, data []byte, mode int64, modTime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: modTime}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// imageOf is an image of layer for this machine's architecture.
func imageOf(layer v1.Layer, entrypoint, cmd []string) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint, cf.Config.Cmd = entrypoint, cmd
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return mutate.ConfigFile(img, cf)
}
