package workload

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Config is the Envoy sidecar's part of netop's flags: the workload
// initializer, and the template policy it shares with the pod webhooks.
type Config struct {
	// Enabled runs the workload initializer: the Envoy template merged
	// into annotated Deployments.
	Enabled bool
	// AllowPrivilegedTemplates lets the envoy-initializer template of any
	// namespace make privileged containers, add capabilities, use host
	// ports and hostPath volumes (the template policy of envoy.Finder);
	// without it only the operator namespace's template may, and the
	// namespaces its annotation lists.
	AllowPrivilegedTemplates bool
}

// NewConfig returns the defaults: the initializer runs, templates of
// other namespaces may not be privileged.
func NewConfig() Config { return Config{Enabled: true} }

// AddFlags registers the flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.Enabled, "initialize-workloads", c.Enabled, "Merge the Envoy template into Deployments annotated initializer.kubernetes.io/envoy: \"true\".")
	fs.BoolVar(&c.AllowPrivilegedTemplates, "allow-privileged-templates", c.AllowPrivilegedTemplates, "Let the envoy-initializer template of every namespace make privileged containers, add capabilities, and use host ports, hostPath volumes and the other fields Pod Security's baseline refuses. Without it only the template in --operator-namespace may, and the templates of the namespaces its annotation initializer.kubernetes.io/envoy-privileged-namespaces lists (\"*\": all).")
}

// Validate checks that the initializer can serve a netop limited to
// namespace ("" for all).
func (c *Config) Validate(namespace string) error {
	if c.Enabled && namespace != "" {
		return fmt.Errorf("--namespace %q: the workload initializer serves all namespaces; use --initialize-workloads=false with --namespace", namespace)
	}
	return nil
}
