package gobuild

import (
	"debug/elf"
	"path/filepath"
	"testing"
)

// Static builds the plugin as the Makefile does: statically linked, with
// no dynamic loader to run on each exec.
func TestStaticPluginHasNoInterpreter(t *testing.T) {
	out := filepath.Join(t.TempDir(), "netop-cni")
	if err := Static(out, Plugin); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked (it has an interpreter)", out)
		}
	}
}
