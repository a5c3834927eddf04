// Package whereabouts brings the peer the benches measure netop against:
// whereabouts, Multus's IPAM, built from its Go module at bench time (not
// vendored, not copied) with its CRDs installed from the same module.
package whereabouts

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/install"
)

// Module is the peer, as the Go module proxy serves it.
const Module = "github.com/k8snetworkplumbingwg/whereabouts"

// DefaultVersion is the version the benches build unless told otherwise.
const DefaultVersion = "v0.9.2"

// Build builds whereabouts' CNI plugin at version into binary, and returns
// where its module is.
func Build(binary, version string) (moduleDir string, err error) {
	out, err := exec.Command("go", "mod", "download", "-json", Module+"@"+version).Output()
	if err != nil {
		return "", fmt.Errorf("downloading %s@%s: %w", Module, version, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("downloading %s@%s: %v %s", Module, version, err, mod.Error)
	}
	// Its own module, with its own requirements and replacements; static,
	// as its hack/build-go.sh builds its releases.
	cmd := exec.Command("go", "build", "-o", binary, "./cmd/")
	cmd.Dir = mod.Dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building whereabouts: %w\n%s", err, out)
	}
	return mod.Dir, nil
}

// InstallCRDs installs the CRDs whereabouts' module ships.
func InstallCRDs(ctx context.Context, cfg *rest.Config, moduleDir string) error {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, name := range []string{"whereabouts.cni.cncf.io_ippools.yaml", "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml"} {
		data, err := os.ReadFile(filepath.Join(moduleDir, "doc", "crds", name))
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		crds = append(crds, crd)
	}
	return install.ApplyCRDs(ctx, cfg, crds...)
}

// FlatFile writes the file whereabouts' DaemonSet installs on every node,
// naming the kubeconfig it uses: its DEL refuses to work without one.
func FlatFile(path, kubeconfig string) error {
	flat, err := json.Marshal(map[string]any{"datastore": "kubernetes", "kubernetes": map[string]any{"kubeconfig": kubeconfig}})
	if err != nil {
		return err
	}
	return os.WriteFile(path, flat, 0o600)
}
