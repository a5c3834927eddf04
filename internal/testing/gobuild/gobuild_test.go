package gobuild

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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

// netop, built with Tags, links neither golang.org/x/net/trace nor the
// html/template it brings, which would keep every exported method of every
// type in the binary.
func TestNetopLinksNoTrace(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", Tags, "-deps", "github.com/netop-dev/netop/cmd/netop").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, pkg := range []string{"golang.org/x/net/trace", "html/template"} {
		if slices.Contains(deps, pkg) {
			t.Errorf("cmd/netop, built with tags %q, imports %s", Tags, pkg)
		}
	}
}
