package deploynet

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Config is the Deployment network controller's part of netop's flags.
type Config struct {
	// Enabled gives annotated Deployments a Network of their own, with
	// cidrs of PrefixLength from Pool unless they name one.
	Enabled      bool
	Pool         string
	PrefixLength int
}

// NewConfig returns the defaults: on, /24s of 172.30.0.0/16.
func NewConfig() Config { return Config{Enabled: true, Pool: "172.30.0.0/16", PrefixLength: 24} }

// AddFlags registers the controller's flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.Enabled, "deployment-networks", c.Enabled, "Give each Deployment annotated samplecrd.k8s.io/network: auto (or samplecrd.k8s.io/network-cidr: CIDR) a Network of its name, owned by it, that its pods join.")
	fs.StringVar(&c.Pool, "deployment-network-pool", c.Pool, "The range the cidrs of Deployments' Networks (samplecrd.k8s.io/network: auto) are taken from, skipping every cidr another Network has.")
	fs.IntVar(&c.PrefixLength, "deployment-network-prefix-length", c.PrefixLength, "The prefix length of the cidrs taken from --deployment-network-pool.")
}

// Validate checks the flags.
func (c *Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if _, err := NewPool(c.Pool, c.PrefixLength); err != nil {
		return fmt.Errorf("--deployment-network-pool, --deployment-network-prefix-length: %w", err)
	}
	return nil
}
