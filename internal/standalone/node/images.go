package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/netop-dev/netop/internal/standalone/image"
)

// PauseImage is the sandbox image containerd runs for every pod, as the
// name kubelet and containerd expect.
const PauseImage = "registry.k8s.io/pause:3.10"

// BusyboxImage is the general-purpose image, under the name that
// "busybox" means.
const BusyboxImage = "docker.io/library/busybox:latest"

// Registry is the in-process registry the nodes' containerds pull
// through: one for all the standalone's nodes, each reaching it on its own
// loopback (hostns.go).
type Registry struct {
	addr   string
	server *http.Server
	// mirrors are the registries containerd asks this one for.
	mirrors []string
}

// StartRegistry serves a registry on a free loopback port and pushes the
// local images into it, with those of the image tarballs in imagesDir and
// of archives. Stop stops it.
func StartRegistry(ctx context.Context, imagesDir string, archives []string) (*Registry, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("image registry: %w", err)
	}
	r := &Registry{addr: l.Addr().String(), server: &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}}
	go func() { _ = r.server.Serve(l) }()
	images, err := LocalImages()
	if err != nil {
		r.Stop()
		return nil, err
	}
	tarballs, _ := filepath.Glob(filepath.Join(imagesDir, "*.tar"))
	for _, path := range append(tarballs, archives...) {
		more, err := image.Read(path)
		if err != nil {
			r.Stop()
			return nil, fmt.Errorf("image archive %s: %w", path, err)
		}
		maps.Copy(images, more)
	}
	r.mirrors = []string{"docker.io", "registry.k8s.io"}
	for ref, img := range images {
		parsed, err := name.ParseReference(ref)
		if err != nil {
			r.Stop()
			return nil, err
		}
		host := parsed.Context().RegistryStr()
		if host == name.DefaultRegistry {
			host = "docker.io"
		}
		if !slices.Contains(r.mirrors, host) {
			r.mirrors = append(r.mirrors, host)
		}
		if err := r.push(ctx, ref, img); err != nil {
			r.Stop()
			return nil, err
		}
	}
	return r, nil
}

// push stores img under ref's repository and tag in the registry, which
// containerd asks as the mirror of ref's registry.
func (r *Registry) push(ctx context.Context, ref string, img v1.Image) error {
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

// Stop stops serving.
func (r *Registry) Stop() {
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
	layer, err := image.Layer(busyboxFiles(fixWgetTimeout(busybox), strings.Fields(string(out))))
	if err != nil {
		return nil, err
	}
	// The pause container only holds the pod's namespaces; containerd
	// stops sandboxes with SIGKILL, and the shell exits on SIGTERM too.
	pause, err := image.Of(layer, image.Config{Entrypoint: []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"}})
	if err != nil {
		return nil, err
	}
	shell, err := image.Of(layer, image.Config{Cmd: []string{"sh"}})
	if err != nil {
		return nil, err
	}
	return map[string]v1.Image{PauseImage: pause, BusyboxImage: shell}, nil
}

// wgetOptions is the option string of busybox 1.35's wget, as Debian
// builds it (without FEATURE_WGET_TIMEOUT). Its "T:+" makes getopt32
// store -T's number through the NULL pointer wget passes when the timeout
// is compiled out (getopt32 checks the pointer for strings, not numbers),
// so `wget -T 5 URL`, as scripts and probes write it, dies with SIGSEGV
// (exit 139), on the host too.
const wgetOptions = "^cqSO:o:P:Y:U:T:+t:n::\x00-1:\xfe--\xfb:\xfe--\xfe:\xfb--\xfb:\xff::\x00"

// fixWgetTimeout returns busybox with -T declared as a string, which
// getopt32 drops like the ignored -t: the same options, bits and
// complementary rules, one byte shorter, padded with a NUL. A busybox
// without that string (another version or build) is returned unchanged.
func fixWgetTimeout(busybox []byte) []byte {
	old := []byte(wgetOptions)
	i := bytes.Index(busybox, old)
	if i < 0 || bytes.Count(busybox, old) != 1 {
		return busybox
	}
	fixed := append(bytes.Replace(old, []byte("T:+"), []byte("T:"), 1), 0)
	out := bytes.Clone(busybox)
	copy(out[i:], fixed)
	return out
}

// busyboxFiles are a root file system of busybox and a link per applet,
// with the files a shell expects.
func busyboxFiles(busybox []byte, applets []string) []image.File {
	var files []image.File
	for _, dir := range []string{"bin", "dev", "etc", "proc", "root", "sys", "tmp", "var"} {
		mode := int64(0o755)
		if dir == "tmp" {
			mode = 0o1777
		}
		files = append(files, image.File{Name: dir, Dir: true, Mode: mode})
	}
	files = append(files,
		image.File{Name: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		image.File{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		image.File{Name: "bin/busybox", Mode: 0o755, Data: busybox})
	for _, applet := range applets {
		if applet != "busybox" && !strings.Contains(applet, "/") {
			files = append(files, image.File{Name: "bin/" + applet, Mode: 0o777, Link: "busybox"})
		}
	}
	return files
}
