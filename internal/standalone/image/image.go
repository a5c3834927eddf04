// Package image builds OCI images without a registry or a container
// engine: a layer of files in a fixed order with fixed times (so the same
// files make the same digest), an image of it for this machine, and image
// tarballs that `docker load`, `ctr images import` and the standalone's
// registry read. The standalone's node builds pause and busybox with it;
// `make image` builds netop's own.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one entry of a layer: a directory (Dir), a symbolic link (Link)
// or a regular file (Data).
type File struct {
	Name string
	Mode int64
	Dir  bool
	Link string
	Data []byte
}

// epoch is every file's time: layers do not change with the day they are
// built.
var epoch = time.Unix(0, 0)

// Layer is a layer of files, in the order given.
func Layer(files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: epoch}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, f.Name+"/"
		case f.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer file %s: %w", f.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("layer file %s: %w", f.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// Config is what an image runs.
type Config struct {
	Entrypoint, Cmd []string
	// User runs the image's processes; "" is root.
	User string
}

// Of is an image of layer for this machine's architecture.
func Of(layer v1.Layer, c Config) (v1.Image, error) {
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
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User = c.Entrypoint, c.Cmd, c.User
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return mutate.ConfigFile(img, cf)
}

// Write writes images, by reference, into one tarball at path.
func Write(path string, images map[string]v1.Image) error {
	refs := map[name.Reference]v1.Image{}
	for ref, img := range images {
		tag, err := name.NewTag(ref)
		if err != nil {
			return fmt.Errorf("image reference %q: %w", ref, err)
		}
		refs[tag] = img
	}
	if err := tarball.MultiRefWriteToFile(path, refs); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// Read reads the tagged images of a tarball, by reference.
func Read(path string) (map[string]v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	out := map[string]v1.Image{}
	for _, m := range manifest {
		for _, ref := range m.RepoTags {
			tag, err := name.NewTag(ref)
			if err != nil {
				return nil, fmt.Errorf("%s: image reference %q: %w", path, ref, err)
			}
			img, err := tarball.Image(opener, &tag)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, ref, err)
			}
			out[tag.Name()] = img
		}
	}
	return out, nil
}
