// Package neutron provides Networks as OpenStack Neutron networks, so that
// netop can give workloads in an OpenStack cloud real tenant networks: a
// Network becomes one Neutron network with a subnet per address family of
// the Network: its CIDR and gateway.
//
// The backend keeps no state of its own. What it needs to find its networks
// again after a crash is on the networks themselves:
//
//   - the description, "netop:<namespace>/<name>/<uid>", set in the create
//     request itself, so that no network ever exists without a record of
//     its owner (this Neutron, like most, does not accept tags on create);
//   - the tags "netop" and "netop-uid=<uid>", added right after, which
//     Neutron can filter on server-side, so that finding one Network's
//     network, or all of netop's, costs one request however many there are.
//
// The network's name, "netop-<namespace>-<name>", is only for people.
//
// It talks to Neutron either without authentication (a Neutron with
// auth_strategy = noauth, such as the one hack/neutron.sh runs for tests) or
// through Keystone, configured as the OpenStack command line client is, by
// OS_CLOUD and clouds.yaml or by the OS_* variables of an openrc file.
//
// There is no drift watch: Neutron offers no cheap event stream without a
// message queue, so changes made by hand are repaired at the controller's
// next resync, which diffs ListOwned against the Networks.
package neutron

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/common/extensions"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
)

var _ backend.Backend = (*Backend)(nil)

// DefaultRequestTimeout bounds each request to Neutron when
// Config.RequestTimeout is zero, so that a hung Neutron makes an operation
// fail, and be retried, instead of blocking a worker forever.
const DefaultRequestTimeout = 10 * time.Second

const (
	userAgent = "netop"
	// tagExtension is the Neutron API extension that provides tags and
	// filtering by them.
	tagExtension = "standard-attr-tag"
)

// Config configures the Neutron backend.
type Config struct {
	// Endpoint is the URL of a Neutron API that needs no authentication
	// (auth_strategy = noauth), e.g. http://127.0.0.1:9696/. Empty means
	// authenticating with Keystone and taking Neutron's URL from its
	// catalog.
	Endpoint string
	// ProjectID is the project that owns the networks netop makes. netop
	// only sees and touches networks of this project. Required with
	// Endpoint, since without Keystone every request is an admin's and
	// Neutron refuses to create a network for no project; with Keystone it
	// defaults to the project the credentials are scoped to.
	ProjectID string
	// Cloud names the clouds.yaml entry to use with Keystone. Empty means
	// OS_CLOUD, or the OS_* variables if that is unset too.
	Cloud string
	// RequestTimeout bounds each HTTP request; zero means
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Transport carries the HTTP requests; nil means
	// http.DefaultTransport. Tests use it to count requests.
	Transport http.RoundTripper
}

// Backend provides Networks as Neutron networks. Its methods are safe for
// concurrent use.
type Backend struct {
	client *gophercloud.ServiceClient
	// project is Config.ProjectID or the token's project; empty only with
	// Keystone credentials not scoped to a project.
	project string
}

// New returns a backend for the Neutron that cfg describes. It makes one
// request to Neutron, so that a wrong endpoint or credentials, or a Neutron
// without tags, fail at start-up with a clear message rather than on the
// first Network.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	logger := klog.FromContext(ctx)
	timeout := cfg.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	httpClient := http.Client{Timeout: timeout, Transport: cfg.Transport}

	b := &Backend{project: cfg.ProjectID}
	if cfg.Endpoint != "" {
		if cfg.ProjectID == "" {
			return nil, fmt.Errorf("neutron endpoint %s is used without Keystone, so netop must be told which project owns its networks: set --neutron-project", cfg.Endpoint)
		}
		sc, err := noauthClient(cfg.Endpoint, httpClient)
		if err != nil {
			return nil, err
		}
		b.client = sc
	} else {
		sc, project, err := keystoneClient(ctx, cfg, httpClient)
		if err != nil {
			return nil, err
		}
		b.client = sc
		if b.project == "" {
			b.project = project
		}
	}

	if err := extensions.Get(ctx, b.client, tagExtension).Err; err != nil {
		var code gophercloud.ErrUnexpectedResponseCode
		switch {
		case isNotFound(err):
			return nil, fmt.Errorf("neutron at %s lacks the %s API extension, which netop needs to mark the networks it makes", b.client.Endpoint, tagExtension)
		case errors.As(err, &code) && code.Actual < 500:
			// Neutron answered, and refused: wrong endpoint or credentials.
			return nil, wrap(err, "reach neutron at %s", b.client.Endpoint)
		default:
			// Down or failing: not a reason to keep netop down too. Every
			// Network will say BackendError until Neutron is back.
			logger.Error(err, "Neutron is not answering at start; netop retries", "endpoint", b.client.Endpoint)
		}
	}
	logger.V(2).Info("Neutron backend ready", "endpoint", b.client.Endpoint, "project", b.project)
	return b, nil
}

// noauthClient returns a client of a Neutron that trusts every request:
// gophercloud has no helper for that, but a service client with no token
// is all it takes.
func noauthClient(endpoint string, httpClient http.Client) (*gophercloud.ServiceClient, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("invalid neutron endpoint %q: want the API's root URL, such as http://127.0.0.1:9696/", endpoint)
	}
	// The root, not the versioned URL, is what clients are given, but
	// people also copy the latter.
	base := strings.TrimSuffix(strings.TrimSuffix(u.String(), "/"), "/v2.0") + "/"
	provider := &gophercloud.ProviderClient{HTTPClient: httpClient}
	provider.UserAgent.Prepend(userAgent)
	return &gophercloud.ServiceClient{
		ProviderClient: provider,
		Endpoint:       base,
		ResourceBase:   base + "v2.0/",
		Type:           "network",
	}, nil
}

// Type is backend.TypeNeutron.
func (b *Backend) Type() backend.Type { return backend.TypeNeutron }

// Endpoint is the URL of the Neutron API in use.
func (b *Backend) Endpoint() string { return b.client.Endpoint }

// ProjectID is the project whose networks the backend makes and sees.
func (b *Backend) ProjectID() string { return b.project }
