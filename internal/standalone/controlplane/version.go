package controlplane

import (
	"runtime/debug"
	"strings"
	_ "unsafe" // for go:linkname

	"k8s.io/component-base/version"
)

// Kubernetes stamps its version into component-base with -ldflags -X at
// release build time. A plain `go build` or `go run` of netop-standalone
// leaves "v0.0.0-master+$Format:%H$", which kubectl cannot parse, so the
// version of the k8s.io/kubernetes module that is actually linked is written
// there instead, unless the build already stamped one.

//go:linkname gitVersion k8s.io/component-base/version.gitVersion
var gitVersion string

//go:linkname gitMajor k8s.io/component-base/version.gitMajor
var gitMajor string

//go:linkname gitMinor k8s.io/component-base/version.gitMinor
var gitMinor string

func init() {
	if !strings.HasPrefix(gitVersion, "v0.0.0") {
		return
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	for _, dep := range info.Deps {
		if dep.Path != "k8s.io/kubernetes" {
			continue
		}
		parts := strings.SplitN(strings.TrimPrefix(dep.Version, "v"), ".", 3)
		if len(parts) == 3 {
			gitVersion, gitMajor, gitMinor = dep.Version, parts[0], parts[1]
			// Get() reports the dynamic version, which component-base
			// copied from gitVersion when it was initialised.
			_ = version.SetDynamicVersion(dep.Version)
		}
	}
}
