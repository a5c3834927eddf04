package nad

import "github.com/spf13/pflag"

// Config is the NetworkAttachmentDefinition controller's part of netop's
// flags.
type Config struct {
	// DataDir is the path, on the nodes, of the CNI plugin's records, as
	// written into the NetworkAttachmentDefinitions.
	DataDir string
}

// NewConfig returns the default: where the manifests mount it.
func NewConfig() Config { return Config{DataDir: "/var/lib/cni/netop"} }

// AddFlags registers the controller's flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.DataDir, "cni-data-dir", c.DataDir, "Path, on the nodes, where netop's CNI plugin records attachments, written into the NetworkAttachmentDefinitions.")
}
