package neutron

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"sigs.k8s.io/yaml"
)

// cloud is the part of an OpenStack client configuration that netop uses,
// in the shape of a clouds.yaml entry; the OS_* environment variables are
// read into the same shape. gophercloud's own clouds.yaml reader is not
// used because it needs a YAML module this repository does not carry.
type cloud struct {
	Auth struct {
		AuthURL                     string `json:"auth_url"`
		Username                    string `json:"username"`
		UserID                      string `json:"user_id"`
		Password                    string `json:"password"`
		ProjectID                   string `json:"project_id"`
		ProjectName                 string `json:"project_name"`
		UserDomainID                string `json:"user_domain_id"`
		UserDomainName              string `json:"user_domain_name"`
		ProjectDomainID             string `json:"project_domain_id"`
		ProjectDomainName           string `json:"project_domain_name"`
		DomainID                    string `json:"domain_id"`
		DomainName                  string `json:"domain_name"`
		ApplicationCredentialID     string `json:"application_credential_id"`
		ApplicationCredentialName   string `json:"application_credential_name"`
		ApplicationCredentialSecret string `json:"application_credential_secret"`
		Token                       string `json:"token"`
	} `json:"auth"`
	RegionName string `json:"region_name"`
	Interface  string `json:"interface"`
	CACert     string `json:"cacert"`
	Verify     *bool  `json:"verify"`
}

// errNoCredentials names every way to configure the backend, since the
// person who sees it has configured none of them.
var errNoCredentials = errors.New("no OpenStack credentials: set --neutron-endpoint for a Neutron without Keystone, " +
	"or OS_CLOUD and a clouds.yaml, or OS_AUTH_URL and the other OS_* variables of an openrc file")

// loadCloud reads the named clouds.yaml entry, or the OS_* environment if
// name is empty, as the OpenStack command line client does.
func loadCloud(name string, getenv func(string) string) (*cloud, error) {
	if name == "" {
		return cloudFromEnv(getenv)
	}
	path, err := cloudsFile(getenv)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read clouds.yaml for cloud %q: %w", name, err)
	}
	var file struct {
		Clouds map[string]*cloud `json:"clouds"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	c := file.Clouds[name]
	if c == nil {
		return nil, fmt.Errorf("cloud %q is not in %s", name, path)
	}
	// As in the OpenStack client, the environment fills in what the file
	// leaves out; passwords are often kept out of clouds.yaml.
	if c.Auth.Password == "" {
		c.Auth.Password = getenv("OS_PASSWORD")
	}
	if c.RegionName == "" {
		c.RegionName = getenv("OS_REGION_NAME")
	}
	return c, nil
}

// cloudsFile finds clouds.yaml where the OpenStack client looks for it.
func cloudsFile(getenv func(string) string) (string, error) {
	if p := getenv("OS_CLIENT_CONFIG_FILE"); p != "" {
		return p, nil
	}
	candidates := []string{"clouds.yaml"}
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, filepath.Join(home, ".config", "openstack", "clouds.yaml"))
	}
	candidates = append(candidates, "/etc/openstack/clouds.yaml")
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no clouds.yaml found (looked at %s; OS_CLIENT_CONFIG_FILE names another)", strings.Join(candidates, ", "))
}

func cloudFromEnv(getenv func(string) string) (*cloud, error) {
	first := func(keys ...string) string {
		for _, k := range keys {
			if v := getenv(k); v != "" {
				return v
			}
		}
		return ""
	}
	c := &cloud{}
	a := &c.Auth
	a.AuthURL = getenv("OS_AUTH_URL")
	if a.AuthURL == "" {
		return nil, errNoCredentials
	}
	a.Username = getenv("OS_USERNAME")
	a.UserID = first("OS_USER_ID", "OS_USERID")
	a.Password = getenv("OS_PASSWORD")
	a.ProjectID = first("OS_PROJECT_ID", "OS_TENANT_ID")
	a.ProjectName = first("OS_PROJECT_NAME", "OS_TENANT_NAME")
	a.UserDomainID = getenv("OS_USER_DOMAIN_ID")
	a.UserDomainName = getenv("OS_USER_DOMAIN_NAME")
	a.ProjectDomainID = getenv("OS_PROJECT_DOMAIN_ID")
	a.ProjectDomainName = getenv("OS_PROJECT_DOMAIN_NAME")
	a.DomainID = getenv("OS_DOMAIN_ID")
	a.DomainName = getenv("OS_DOMAIN_NAME")
	a.ApplicationCredentialID = getenv("OS_APPLICATION_CREDENTIAL_ID")
	a.ApplicationCredentialName = getenv("OS_APPLICATION_CREDENTIAL_NAME")
	a.ApplicationCredentialSecret = getenv("OS_APPLICATION_CREDENTIAL_SECRET")
	a.Token = getenv("OS_TOKEN")
	c.RegionName = getenv("OS_REGION_NAME")
	c.Interface = getenv("OS_INTERFACE")
	c.CACert = getenv("OS_CACERT")
	if getenv("OS_INSECURE") == "true" {
		f := false
		c.Verify = &f
	}
	return c, nil
}

// authOptions turns c into Keystone v3 authentication options.
func (c *cloud) authOptions() (gophercloud.AuthOptions, error) {
	a := c.Auth
	if a.AuthURL == "" {
		return gophercloud.AuthOptions{}, errNoCredentials
	}
	opts := gophercloud.AuthOptions{IdentityEndpoint: a.AuthURL}
	switch {
	case a.ApplicationCredentialID != "" || a.ApplicationCredentialName != "":
		if a.ApplicationCredentialSecret == "" {
			return opts, errors.New("an application credential needs its secret (OS_APPLICATION_CREDENTIAL_SECRET or application_credential_secret)")
		}
		opts.ApplicationCredentialID = a.ApplicationCredentialID
		opts.ApplicationCredentialName = a.ApplicationCredentialName
		opts.ApplicationCredentialSecret = a.ApplicationCredentialSecret
		// A credential given by name is looked up among the user's.
		if a.ApplicationCredentialID == "" {
			opts.Username, opts.UserID = a.Username, a.UserID
			opts.DomainID, opts.DomainName = orElse(a.UserDomainID, a.DomainID), orElse(a.UserDomainName, a.DomainName)
		}
		// The credential carries its project: no scope may be given.
		opts.AllowReauth = true
		return opts, nil
	case a.Token != "":
		opts.TokenID = a.Token
	default:
		if a.Username == "" && a.UserID == "" {
			return opts, errors.New("OpenStack credentials name no user (OS_USERNAME or OS_USER_ID, or an application credential)")
		}
		if a.Password == "" {
			return opts, errors.New("OpenStack credentials have no password (OS_PASSWORD)")
		}
		opts.Username, opts.UserID, opts.Password = a.Username, a.UserID, a.Password
		opts.DomainID, opts.DomainName = orElse(a.UserDomainID, a.DomainID), orElse(a.UserDomainName, a.DomainName)
		// Tokens expire; a long-running operator must get new ones.
		opts.AllowReauth = true
	}
	switch {
	case a.ProjectID != "":
		opts.Scope = &gophercloud.AuthScope{ProjectID: a.ProjectID}
	case a.ProjectName != "":
		opts.Scope = &gophercloud.AuthScope{
			ProjectName: a.ProjectName,
			DomainID:    orElse(a.ProjectDomainID, a.DomainID),
			DomainName:  orElse(a.ProjectDomainName, a.DomainName),
		}
		if opts.Scope.DomainID == "" && opts.Scope.DomainName == "" {
			return opts, errors.New("a project given by name needs its domain (OS_PROJECT_DOMAIN_NAME or OS_PROJECT_DOMAIN_ID)")
		}
	}
	return opts, nil
}

// tlsConfig returns the TLS settings c asks for, or nil for the defaults.
func (c *cloud) tlsConfig() (*tls.Config, error) {
	if c.CACert == "" && (c.Verify == nil || *c.Verify) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.Verify != nil && !*c.Verify {
		cfg.InsecureSkipVerify = true //nolint:gosec // asked for explicitly, as with the OpenStack client
	}
	if c.CACert != "" {
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("read CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", c.CACert)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// keystoneClient authenticates with Keystone and returns a client of the
// catalog's network endpoint, and the project the token is scoped to.
func keystoneClient(ctx context.Context, cfg Config, httpClient http.Client) (*gophercloud.ServiceClient, string, error) {
	getenv := os.Getenv
	name := cfg.Cloud
	if name == "" {
		name = getenv("OS_CLOUD")
	}
	c, err := loadCloud(name, getenv)
	if err != nil {
		return nil, "", err
	}
	opts, err := c.authOptions()
	if err != nil {
		return nil, "", err
	}
	if cfg.Transport == nil {
		tlsCfg, err := c.tlsConfig()
		if err != nil {
			return nil, "", err
		}
		if tlsCfg != nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.TLSClientConfig = tlsCfg
			httpClient.Transport = t
		}
	}
	provider, err := openstack.NewClient(opts.IdentityEndpoint)
	if err != nil {
		return nil, "", fmt.Errorf("keystone at %s: %w", opts.IdentityEndpoint, err)
	}
	provider.HTTPClient = httpClient
	provider.UserAgent.Prepend(userAgent)
	if err := openstack.Authenticate(ctx, provider, opts); err != nil {
		return nil, "", wrap(err, "authenticate with keystone at %s", opts.IdentityEndpoint)
	}
	availability := gophercloud.Availability(strings.TrimSuffix(orElse(c.Interface, "public"), "URL"))
	sc, err := openstack.NewNetworkV2(provider, gophercloud.EndpointOpts{Region: c.RegionName, Availability: availability})
	if err != nil {
		return nil, "", fmt.Errorf("find the network endpoint in the keystone catalog (region %q, interface %q): %w", c.RegionName, availability, err)
	}
	project := ""
	if r, ok := provider.GetAuthResult().(interface {
		ExtractProject() (*tokens.Project, error)
	}); ok {
		if p, err := r.ExtractProject(); err == nil && p != nil {
			project = p.ID
		}
	}
	return sc, project, nil
}

func orElse(s, def string) string {
	if s != "" {
		return s
	}
	return def
}
