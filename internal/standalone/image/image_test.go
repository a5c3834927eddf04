package image

import (
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The same files make the same image; a tarball gives back each image
// under each of its references.
func TestWriteReadRoundTrip(t *testing.T) {
	build := func() v1.Image {
		layer, err := Layer([]File{{Name: "bin", Dir: true, Mode: 0o755}, {Name: "bin/hello", Mode: 0o755, Data: []byte("#!/bin/sh\necho hello\n")},
			{Name: "bin/hi", Mode: 0o777, Link: "hello"}})
		if err != nil {
			t.Fatal(err)
		}
		img, err := Of(layer, Config{Entrypoint: []string{"/bin/hello"}, User: "65532"})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	first, second := build(), build()
	d1, _ := first.Digest()
	d2, _ := second.Digest()
	if d1 != d2 {
		t.Fatalf("the same files made %s and %s", d1, d2)
	}
	path := filepath.Join(t.TempDir(), "images.tar")
	if err := Write(path, map[string]v1.Image{"example.local/hello:1": first, "example.local/hello:latest": first}); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("read %d images, want 2: %v", len(got), got)
	}
	for ref, img := range got {
		d, err := img.Digest()
		if err != nil || d != d1 {
			t.Errorf("%s: digest %s (%v), want %s", ref, d, err, d1)
		}
		cf, err := img.ConfigFile()
		if err != nil || cf.Config.User != "65532" || cf.Config.Entrypoint[0] != "/bin/hello" {
			t.Errorf("%s: config %+v (%v)", ref, cf, err)
		}
	}
}
