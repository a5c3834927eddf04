// Package version tells which netop this is.
package version

import "runtime/debug"

// Version is set at build time with
// -ldflags "-X github.com/netop-dev/netop/internal/version.Version=v1.2.3";
// otherwise it is the module version Go recorded, or "devel".
var Version = ""

// String returns the version of this build.
func String() string {
	if Version != "" {
		return Version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return "devel"
}
