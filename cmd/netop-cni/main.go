// Command netop-cni is netop's CNI plugin, run by the container runtime
// from its CNI bin directory: it attaches pods to the Networks they declare
// with the addresses netop allocated them.
package main

import "github.com/netop-dev/netop/internal/cni/plugin"

func main() { plugin.Main() }
