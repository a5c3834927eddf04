package admission

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/netop-dev/netop/internal/webhook"
)

// Options are the webhook server's flags.
type Options struct {
	// Addr is where the server listens; "0" turns the webhooks off.
	Addr string
	// Local registers the webhooks by the listener's 127.0.0.1 URL
	// (standalone) instead of by Service.
	Local bool
	// Service is the Service in the operator's namespace in front of the
	// server (in a cluster).
	Service string
	// ConversionService is the Service in front of the conversion
	// webhook: the same server, reachable before the replica is ready
	// (publishNotReadyAddresses), which admission must not be.
	ConversionService string
	// CertDir keeps the webhook CA and certificate in files; empty keeps
	// them in a Secret in the operator's namespace.
	CertDir string
	// MaxInflight caps the admission reviews served at once; beyond it
	// the server answers 429 with Retry-After. 0: no limit.
	MaxInflight int
	// MaxInflightBytes caps the bytes of review bodies being read and
	// decoded at once (429 beyond it). 0: no limit.
	MaxInflightBytes resource.QuantityValue
}

// NewOptions returns the defaults for a server in a cluster.
func NewOptions() Options {
	return Options{
		Addr:              ":9443",
		Service:           "netop-webhook",
		ConversionService: "netop-conversion",
		MaxInflight:       webhook.DefaultMaxInFlight,
		MaxInflightBytes:  resource.QuantityValue{Quantity: *resource.NewQuantity(webhook.DefaultMaxBodyBytesInFlight, resource.BinarySI)},
	}
}

// AddFlags registers the flags of the webhook server: admission and
// conversion.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Addr, "webhook-addr", o.Addr, "Address the admission webhooks (HTTPS) listen on; \"0\" turns them off.")
	fs.StringVar(&o.Service, "webhook-service", o.Service, "Service in --operator-namespace that routes to the webhook server.")
	fs.StringVar(&o.ConversionService, "conversion-service", o.ConversionService, "Service in --operator-namespace that routes to the webhook server's conversion webhook, not-ready replicas included.")
	fs.BoolVar(&o.Local, "webhook-local", o.Local, "Register the webhooks by the listener's https://127.0.0.1 URL instead of --webhook-service, for a netop running beside its API server.")
	fs.StringVar(&o.CertDir, "webhook-cert-dir", o.CertDir, "Keep the webhook CA and certificate in this directory instead of a Secret.")
	fs.IntVar(&o.MaxInflight, "webhook-max-inflight", o.MaxInflight, "Admission reviews the webhook server serves at once, and conversion reviews apart from them; more are answered 429 Too Many Requests with Retry-After (the API server retries within the webhook's timeout, then applies its failurePolicy). 0: no limit.")
	fs.Var(&o.MaxInflightBytes, "webhook-max-inflight-bytes", "Bytes of review bodies (admission and conversion together) the webhook server reads and decodes at once (each review counts its Content-Length, at most 4Mi); more are answered 429 Too Many Requests with Retry-After. A quantity such as 64Mi; 0: no limit.")
}

// Validate checks the options, and that the webhooks can serve a netop
// limited to namespace ("" for all).
func (o *Options) Validate(namespace string) error {
	switch {
	case o.MaxInflight < 0:
		return fmt.Errorf("--webhook-max-inflight must be 0 (no limit) or positive, got %d", o.MaxInflight)
	case o.MaxInflightBytes.Sign() < 0:
		return fmt.Errorf("--webhook-max-inflight-bytes must be 0 (no limit) or positive, got %s", o.MaxInflightBytes.String())
	case o.Enabled() && namespace != "":
		return fmt.Errorf("--namespace %q: the admission webhooks check Networks of all namespaces; use --webhook-addr=0 with --namespace", namespace)
	}
	return nil
}

// Enabled reports whether the webhooks are on.
func (o *Options) Enabled() bool { return o.Addr != "" && o.Addr != "0" }
