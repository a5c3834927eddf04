package at

import (
	"errors"

	"github.com/spf13/pflag"
)

// Config is the At controller's part of netop's flags.
type Config struct {
	// Enabled runs the controller: Ats' commands in pods at their
	// scheduled time, with the image Image.
	Enabled bool
	Image   string
}

// NewConfig returns the defaults: Ats run, in busybox.
func NewConfig() Config { return Config{Enabled: true, Image: DefaultImage} }

// AddFlags registers the At controller's flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.Enabled, "ats", c.Enabled, "Run the At controller: each At (cnat.programming-kubernetes.info/v1alpha1) runs its command in a pod at its scheduled time.")
	fs.StringVar(&c.Image, "at-image", c.Image, "Image of the pods that run Ats' commands; it must have sh.")
}

// Validate checks the flags.
func (c *Config) Validate() error {
	if c.Enabled && c.Image == "" {
		return errors.New("--at-image must name an image with sh, or turn Ats off with --ats=false")
	}
	return nil
}
