package config

import (
	"strings"
	"testing"
)

func TestAllOptions(t *testing.T) {
	defaults := string(All(Options{}))
	for _, want := range []string{"image: " + DefaultImage, "--cni-bin-dir=" + DefaultCNIBinDir, "path: " + DefaultCNIBinDir + "\n"} {
		if !strings.Contains(defaults, want) {
			t.Errorf("default manifests lack %q", want)
		}
	}
	got := string(All(Options{Image: "example.org/netop:v1", CNIBinDir: "/x/bin"}))
	for _, want := range []string{
		"image: example.org/netop:v1", "--cni-bin-dir=/x/bin", "path: /x/bin\n", "mountPath: /x/bin\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("manifests lack %q", want)
		}
	}
	for _, stale := range []string{DefaultImage, DefaultCNIBinDir} {
		if strings.Contains(got, stale) {
			t.Errorf("manifests still name %q", stale)
		}
	}
}

// The embedded policies decode strictly, each bound, and ship in the
// manifests.
func TestPolicies(t *testing.T) {
	policies, bindings, err := Policies()
	if err != nil {
		t.Fatal(err)
	}
	if len(policies) == 0 || len(policies) != len(bindings) {
		t.Fatalf("%d policies, %d bindings", len(policies), len(bindings))
	}
	for i, p := range policies {
		if bindings[i].Spec.PolicyName != p.Name {
			t.Errorf("binding %s binds %q, want %q", bindings[i].Name, bindings[i].Spec.PolicyName, p.Name)
		}
		if !strings.Contains(string(All(Options{})), "name: "+p.Name) {
			t.Errorf("manifests lack policy %s", p.Name)
		}
	}
}

// The MultiNetworkPolicy CRD ships unless a cluster has another project's.
func TestWithoutSharedCRDs(t *testing.T) {
	const crd = "name: multi-networkpolicies." + SharedGroup
	if !strings.Contains(string(All(Options{})), crd) {
		t.Errorf("manifests lack %s", crd)
	}
	without := string(All(Options{WithoutSharedCRDs: true}))
	if strings.Contains(without, crd) {
		t.Errorf("manifests without shared CRDs have %s", crd)
	}
	if !strings.Contains(without, "name: networks.samplecrd.k8s.io") {
		t.Error("manifests without shared CRDs lack netop's own")
	}
}
