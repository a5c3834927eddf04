// Command image builds netop's container image without a registry or a
// container engine (`make image`): the static netop binary and its thin
// CNI plugin (which the agents install on their hosts), CA
// certificates for Neutron over HTTPS, and a passwd naming the nonroot
// user it runs as, in one layer, written as an image tarball that `docker
// load`, `ctr images import` and netop-standalone (--image-archive, or
// from DATA_DIR/images/) read.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/netop-dev/netop/internal/standalone/image"
)

func main() {
	binary := flag.String("binary", "bin/netop-static", "the static netop binary (CGO_ENABLED=0)")
	plugin := flag.String("plugin", "bin/netop-cni-static", "the static netop-cni binary (CGO_ENABLED=0)")
	tag := flag.String("tag", "netop.local/netop:dev", "the image's reference")
	out := flag.String("out", "bin/netop-image.tar", "the image tarball to write")
	flag.Parse()
	if err := build(*binary, *plugin, *tag, *out); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func build(binary, plugin, tag, out string) error {
	netop, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	cni, err := os.ReadFile(plugin)
	if err != nil {
		return err
	}
	certs, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		return fmt.Errorf("CA certificates (Debian package ca-certificates): %w", err)
	}
	layer, err := image.Layer([]image.File{
		{Name: "etc", Dir: true, Mode: 0o755},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/:/netop\nnonroot:x:65532:65532:nonroot:/:/netop\n")},
		{Name: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Name: "etc/ssl", Dir: true, Mode: 0o755},
		{Name: "etc/ssl/certs", Dir: true, Mode: 0o755},
		{Name: "etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Data: certs},
		{Name: "tmp", Dir: true, Mode: 0o1777},
		{Name: "netop", Mode: 0o755, Data: netop},
		// Beside netop: the agents install it (agent.PluginExecutable).
		{Name: "netop-cni", Mode: 0o755, Data: cni},
	})
	if err != nil {
		return err
	}
	// Nonroot by default; the node agent, which needs NET_ADMIN, says
	// so in its pod's securityContext.
	img, err := image.Of(layer, image.Config{Entrypoint: []string{"/netop"}, Cmd: []string{"run"}, User: "65532:65532"})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := image.Write(out, map[string]v1.Image{tag: img}); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%s) to %s\n", tag, digest, out)
	// The last line is the reference alone, for netop manifests --image.
	fmt.Println(tag)
	return nil
}
