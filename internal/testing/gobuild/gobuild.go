// Package gobuild builds netop's commands for tests and benches the way
// its Makefile does, so that what they execute is what users run.
package gobuild

import (
	"fmt"
	"os"
	"os/exec"
)

// Plugin is the package of the thin CNI plugin the runtime executes.
const Plugin = "github.com/netop-dev/netop/cmd/netop-cni"

// Tags are the build tags of every netop binary, the Makefile's GOTAGS.
// grpcnotrace keeps gRPC (hot-plug's CRI client) from linking
// golang.org/x/net/trace, whose html/template turns the linker's dead code
// elimination of methods off: bin/netop is 42 MB with the tag and 71 MB
// without, and its process 14 MiB larger (BENCHMARKS.md).
// netop never turns gRPC's tracing on.
const Tags = "grpcnotrace"

// Command builds the Go package pkg into out, with env added to the
// environment; the error carries the compiler's output.
func Command(out, pkg string, env ...string) error {
	build := exec.Command("go", "build", "-tags", Tags, "-o", out, pkg)
	build.Env = append(os.Environ(), env...)
	if output, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, output)
	}
	return nil
}

// Static builds pkg into out without cgo: a statically linked binary, as
// the Makefile builds the CNI plugin and the image's binaries. The
// runtime executes the plugin for every ADD and DEL, and a dynamically
// linked Go binary (cgo comes with the net package) costs the dynamic
// loader and cgo's start on each: 3.4 ms of CPU per exec against 2.0
// (BENCHMARKS.md).
func Static(out, pkg string) error {
	return Command(out, pkg, "CGO_ENABLED=0")
}
