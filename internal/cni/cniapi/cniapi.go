// Package cniapi is the contract between netop's CNI plugin, which the
// container runtime executes, and netop's node side, which serves its ADD:
// the network configuration both read, the pod's CNI_ARGS, and the request
// and answer they exchange over the node side's unix socket with the files
// passed along it. It imports no other netop package, so that both sides
// and the configurations' writers (the NetworkAttachmentDefinition
// controller, the standalone's node) agree on one definition.
package cniapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	cniversion "github.com/containernetworking/cni/pkg/version"
	"k8s.io/klog/v2"
)

// Type is the plugin's name: its binary's name in the CNI bin directory and
// the "type" of its configurations.
const Type = "netop-cni"

// DefaultSocket is where netop's node side serves the plugin unless told
// otherwise: an abstract socket, which belongs to a network namespace, so
// that each node's, the host's in a cluster and each of the standalone's
// nodes', has its own without a file to share or leave behind.
const DefaultSocket = "@netop-cni"

// defaultTimeout bounds how long ADD waits for the pod's addresses: the
// kubelet retries a failed sandbox, and each failure is an Event.
const defaultTimeout = 30 * time.Second

// Config is the plugin's network configuration. It spells out the fields
// of the spec it uses rather than embedding types.PluginConf, whose
// marshalling depends on addressability and writes empty ipam and dns.
type Config struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Name       string `json:"name,omitempty"`
	Type       string `json:"type,omitempty"`
	// RawPrevResult is the result of the plugins before netop's in a
	// chain.
	RawPrevResult map[string]any `json:"prevResult,omitempty"`
	PrevResult    types.Result   `json:"-"`
	// ValidAttachments: GC's list of the attachments to keep.
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`

	// Socket is the unix socket of netop's node side, which ADD asks to
	// attach the pod: a path, or "@name", an abstract socket of the
	// network namespace the plugin runs in (the runtime's, where the
	// node's bridges are); DefaultSocket if empty.
	Socket string `json:"socket,omitempty"`
	// NodeNetns is the path of the network namespace holding the
	// Networks' bridges; "" is the plugin's own (the host's).
	NodeNetns string `json:"nodeNetns,omitempty"`
	// DataDir holds the attachment records.
	DataDir string `json:"dataDir"`
	// Network, namespace/name, makes the configuration a delegate for
	// that one Network (a NetworkAttachmentDefinition's); without it the
	// plugin attaches every Network the pod declares.
	Network string `json:"network,omitempty"`
	// Timeout is how long ADD waits for the pod's addresses (a Go
	// duration); 30s if empty.
	Timeout string `json:"timeout,omitempty"`
	// LogFile is the file the plugin appends its log to (created 0600,
	// its directory 0700); "" logs to no file. Multus's key.
	LogFile string `json:"logFile,omitempty"`
	// LogLevel is what the file gets: "error", "info" (each command, its
	// outcome and what it attached or detached; the default) or "debug"
	// (the steps too). Multus's key.
	LogLevel string `json:"logLevel,omitempty"`

	// verbosity is LogLevel's.
	verbosity int
}

// PodArgs are the CNI_ARGS the kubelet's runtime passes.
type PodArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // the runtime's name
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive
	K8S_POD_UID       types.UnmarshallableString //nolint:revive
}

// LoadPodArgs reads the pod's identity from CNI_ARGS. The runtime passes
// more than that; netop reads only the pod's.
func LoadPodArgs(cniArgs string) (PodArgs, error) {
	pa := PodArgs{CommonArgs: types.CommonArgs{IgnoreUnknown: true}}
	err := types.LoadArgs(cniArgs, &pa)
	return pa, err
}

// LoadConfig reads a network configuration as the runtime passes it on
// stdin, and checks it.
func LoadConfig(stdin []byte) (*Config, error) {
	conf := &Config{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("network configuration: %w", err)
	}
	if conf.DataDir == "" {
		return nil, errors.New("network configuration: dataDir: required (where attachments are recorded)")
	}
	if conf.Socket == "" {
		conf.Socket = DefaultSocket
	}
	if err := conf.parseLogging(); err != nil {
		return nil, err
	}
	if conf.RawPrevResult != nil {
		parsed := types.PluginConf{CNIVersion: conf.CNIVersion, RawPrevResult: conf.RawPrevResult}
		if err := cniversion.ParsePrevResult(&parsed); err != nil {
			return nil, fmt.Errorf("network configuration: prevResult: %w", err)
		}
		conf.PrevResult = parsed.PrevResult
	}
	return conf, nil
}

// AddTimeout is how long ADD may take: the wait for the pod's addresses.
// Only ADD reads it: a DEL must not fail over what it does not use.
func (c *Config) AddTimeout() (time.Duration, error) {
	if c.Timeout == "" {
		return defaultTimeout, nil
	}
	d, err := time.ParseDuration(c.Timeout)
	if err == nil && d <= 0 {
		err = errors.New("must be positive")
	}
	if err != nil {
		return 0, fmt.Errorf("network configuration: timeout: %q: %w", c.Timeout, err)
	}
	return d, nil
}

// The file's verbosities. A logr logger always writes errors and V(0), so
// the levels start at 1 to let logLevel "error" leave out the rest.
const (
	// LogInfo: each command, its outcome, what it attached or detached.
	LogInfo = 1
	// LogDebug: the steps on the way.
	LogDebug = 2
)

// logLevels are logLevel's values (Multus's names where they mean the
// same) and the verbosity each writes.
var logLevels = map[string]int{"error": 0, "info": LogInfo, "debug": LogDebug}

// defaultLogLevel: a log file someone configured should say what each
// command did, without the steps.
const defaultLogLevel = "info"

// parseLogging checks logFile and logLevel and sets the verbosity.
func (c *Config) parseLogging() error {
	if c.LogFile != "" && !filepath.IsAbs(c.LogFile) {
		// Relative to the runtime's working directory is nowhere anyone
		// would look.
		return fmt.Errorf("network configuration: logFile: %q: must be an absolute path", c.LogFile)
	}
	level := strings.ToLower(c.LogLevel)
	if level == "" {
		level = defaultLogLevel
	}
	v, ok := logLevels[level]
	if !ok {
		return fmt.Errorf("network configuration: logLevel: %q: must be error, info or debug", c.LogLevel)
	}
	c.verbosity = v
	return nil
}

// Verbosity is the log file's verbosity: LogLevel's, LogInfo by default.
func (c *Config) Verbosity() int { return c.verbosity }

// Invocation is what every line of a command says about it, here and on
// the node side: the command, and the container and pod it is for (GC and
// STATUS have neither).
func Invocation(command string, args *skel.CmdArgs) []any {
	kv := []any{"command", command}
	for _, f := range []struct{ key, value string }{
		{"containerID", args.ContainerID}, {"netns", args.Netns}, {"ifname", args.IfName},
	} {
		if f.value != "" {
			kv = append(kv, f.key, f.value)
		}
	}
	if pa, err := LoadPodArgs(args.Args); err == nil && pa.K8S_POD_NAME != "" {
		// A malformed CNI_ARGS is ADD's error to report, not the log's.
		kv = append(kv, "pod", klog.KRef(string(pa.K8S_POD_NAMESPACE), string(pa.K8S_POD_NAME)))
	}
	return kv
}
