package config

import (
	"strings"
	"testing"
)

func TestAllOptions(t *testing.T) {
	defaults := string(All(Options{}))
	for _, want := range []string{"image: " + DefaultImage, "--cni-bin-dir=" + DefaultCNIBinDir, "path: " + DefaultCNIConfigDir + "\n"} {
		if !strings.Contains(defaults, want) {
			t.Errorf("default manifests lack %q", want)
		}
	}
	got := string(All(Options{Image: "example.org/netop:v1", CNIBinDir: "/x/bin", CNIConfigDir: "/x/conf"}))
	for _, want := range []string{
		"image: example.org/netop:v1", "--cni-bin-dir=/x/bin", "--cni-kubeconfig=/x/conf/netop.kubeconfig",
		"path: /x/bin\n", "mountPath: /x/conf\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("manifests lack %q", want)
		}
	}
	for _, stale := range []string{DefaultImage, DefaultCNIBinDir, DefaultCNIConfigDir} {
		if strings.Contains(got, stale) {
			t.Errorf("manifests still name %q", stale)
		}
	}
}
