// Package plugin is netop's CNI plugin: the CNI protocol (ADD, CHECK, DEL,
// GC, STATUS, VERSION; spec 1.0.0 and 1.1.0) on top of package cni's
// attacher and records. The allocation controller decides each pod's
// addresses and writes them on the pod; ADD reads them from the API server
// and attaches the pod; DEL, CHECK and GC need only what ADD recorded on the
// node, so they work with the API server down.
//
// It runs in two modes. Chained, after the plugin that makes eth0 (the
// standalone's node), it attaches every Network the pod declares and adds
// them to the previous result. Delegated, one configuration per Network as
// Multus calls it (the NetworkAttachmentDefinition's config names the
// Network), it attaches the one interface it is called for.
//
// It logs to the file its configuration names (logFile, logLevel, as
// Multus does), since stdout is the result's and libcni reads a plugin's
// stderr only when it printed nothing: a node's log file is where one
// learns why a pod's sandbox keeps failing, or what a DEL removed. A
// failure also goes to stderr, one line, for whoever runs the plugin by
// hand.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	cniversion "github.com/containernetworking/cni/pkg/version"
	"github.com/go-logr/logr"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/version"
)

// Type is the plugin's name: its binary's name in the CNI bin directory and
// the "type" of its configurations.
const Type = "netop-cni"

// Versions are the CNI spec versions the plugin speaks.
var Versions = cniversion.PluginSupports("1.0.0", "1.1.0")

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

	// Kubeconfig is the file ADD reads pods with (the node's credentials).
	Kubeconfig string `json:"kubeconfig"`
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

// podArgs are the CNI_ARGS the kubelet's runtime passes.
type podArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // the runtime's name
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive
	K8S_POD_UID       types.UnmarshallableString //nolint:revive
}

// loadPodArgs reads the pod's identity from CNI_ARGS. The runtime passes
// more than that; netop reads only the pod's.
func loadPodArgs(cniArgs string) (podArgs, error) {
	pa := podArgs{CommonArgs: types.CommonArgs{IgnoreUnknown: true}}
	err := types.LoadArgs(cniArgs, &pa)
	return pa, err
}

// Main runs the plugin as the runtime calls it (environment and stdin) and
// exits.
func Main() {
	r := runner{stderr: os.Stderr}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add: r.cmd("ADD", cmdAdd), Del: r.cmd("DEL", cmdDel), Check: r.cmd("CHECK", cmdCheck),
		GC: r.cmd("GC", cmdGC), Status: r.cmd("STATUS", cmdStatus),
	}, Versions, "netop CNI plugin "+version.String())
}

func loadConfig(stdin []byte) (*Config, error) {
	conf := &Config{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("network configuration: %w", err)
	}
	if conf.DataDir == "" {
		return nil, errors.New("network configuration: dataDir: required (where attachments are recorded)")
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

func (c *Config) store() cni.Store { return cni.Store{Dir: c.DataDir} }

func (c *Config) attacher() (*cni.Attacher, error) {
	var ns netns.NsHandle
	var err error
	if c.NodeNetns == "" {
		ns, err = netns.Get()
	} else {
		ns, err = netns.GetFromPath(c.NodeNetns)
	}
	if err != nil {
		return nil, fmt.Errorf("node network namespace %q: %w", c.NodeNetns, err)
	}
	defer func() { _ = ns.Close() }()
	return cni.NewAttacher(ns)
}

func cmdAdd(ctx context.Context, conf *Config, args *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if conf.PrevResult != nil {
		var err error
		if result, err = current.NewResultFromResult(conf.PrevResult); err != nil {
			return fmt.Errorf("prevResult: %w", err)
		}
	}
	pa, err := loadPodArgs(args.Args)
	if err != nil {
		return fmt.Errorf("CNI_ARGS: %w", err)
	}
	if pa.K8S_POD_NAME == "" {
		if conf.Network != "" {
			return errors.New("CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME: required to attach a pod to a Network")
		}
		log.V(vInfo).Info("Not a pod: nothing to attach")
		return types.PrintResult(result, conf.CNIVersion)
	}
	timeout := defaultTimeout
	if conf.Timeout != "" {
		if timeout, err = time.ParseDuration(conf.Timeout); err != nil {
			return fmt.Errorf("network configuration: timeout: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	kube, err := podClient(conf.Kubeconfig)
	if err != nil {
		return err
	}
	pod, allocations, err := podAllocations(ctx, kube, string(pa.K8S_POD_NAMESPACE), string(pa.K8S_POD_NAME), string(pa.K8S_POD_UID))
	if err != nil {
		return err
	}
	// An interface being detached (hot-plug) is not made again: its
	// addresses are about to be freed.
	allocations = netselect.Active(allocations)
	if conf.Network != "" {
		i := slices.IndexFunc(allocations, func(a netselect.Allocation) bool { return a.Network == conf.Network && a.Interface == args.IfName })
		if i < 0 {
			return fmt.Errorf("pod %s/%s: no allocation on Network %s for interface %s", pa.K8S_POD_NAMESPACE, pa.K8S_POD_NAME, conf.Network, args.IfName)
		}
		allocations = allocations[i : i+1]
	}
	if len(allocations) == 0 {
		log.V(vInfo).Info("The pod joins no Network: nothing to attach")
		return types.PrintResult(result, conf.CNIVersion)
	}

	attacher, err := conf.attacher()
	if err != nil {
		return err
	}
	defer attacher.Close()
	record, _, err := conf.store().Load(args.ContainerID)
	if err != nil {
		return err
	}
	record.ContainerID, record.Netns, record.Pod = args.ContainerID, args.Netns, string(pa.K8S_POD_NAMESPACE)+"/"+string(pa.K8S_POD_NAME)
	// A delegate adds one interface per call.
	record = record.With(conf.Name, allocations)
	// Recorded before anything is made, so that a DEL or GC after a crash
	// here knows what to undo.
	if err := conf.store().Save(record); err != nil {
		return err
	}
	log.V(vDebug).Info("Recorded the attachments", "dataDir", conf.DataDir, "interfaces", len(allocations))
	var made []string
	// undo takes back what this ADD made and recorded, and returns cause
	// with whatever it could not undo: that stays in the record, for the
	// DEL the runtime sends after a failed ADD, or GC, to finish.
	undo := func(cause error) error {
		log.V(vDebug).Info("Undoing the attachments", "interfaces", made)
		errs := []error{cause}
		var left []string
		for _, iface := range made {
			if err := attacher.Del(args.ContainerID, iface); err != nil {
				errs = append(errs, fmt.Errorf("undoing %s: %w", iface, err))
				left = append(left, iface)
			}
		}
		var undone []string
		for _, a := range allocations {
			if !slices.Contains(left, a.Interface) {
				undone = append(undone, a.Interface)
			}
		}
		if err := conf.store().Forget(record, undone); err != nil {
			errs = append(errs, fmt.Errorf("undoing: %w", err))
		}
		return errors.Join(errs...)
	}
	for _, a := range allocations {
		at, err := cni.AttachmentOf(args.ContainerID, args.Netns, a)
		if err != nil {
			return undo(err)
		}
		made = append(made, a.Interface)
		if err := attacher.WaitBridge(ctx, at.Bridge); err != nil {
			return undo(fmt.Errorf("attaching %s to Network %s: %w", a.Interface, a.Network, err))
		}
		log.V(vDebug).Info("Attaching", "interface", a.Interface, "network", a.Network, "bridge", at.Bridge)
		attached, err := attacher.Add(at)
		if err != nil {
			return undo(fmt.Errorf("attaching %s to Network %s: %w", a.Interface, a.Network, err))
		}
		log.V(vInfo).Info("Attached", "interface", a.Interface, "network", a.Network, "ips", a.IPs,
			"mac", attached.MAC.String(), "hostVeth", attached.HostVeth)
		result.Interfaces = append(result.Interfaces,
			&current.Interface{Name: attached.HostVeth},
			&current.Interface{Name: a.Interface, Mac: attached.MAC.String(), Sandbox: args.Netns})
		podIface := len(result.Interfaces) - 1
		for _, p := range at.Addresses {
			result.IPs = append(result.IPs, &current.IPConfig{Interface: current.Int(podIface), Address: *cni.IPNet(p)})
		}
		for _, r := range at.Routes {
			result.Routes = append(result.Routes, &types.Route{Dst: *cni.IPNet(r.Dst), GW: r.GW.AsSlice()})
		}
	}
	if conf.Network == "" && conf.PrevResult != nil {
		// Chained after the pod network's plugin, netop knows the default
		// interface too; as Multus's delegate, Multus writes the status.
		if err := writeNetworkStatus(ctx, kube, pod, conf.Name, args, result, allocations); err != nil {
			// The pod works; the status the allocator wrote stands.
			log.Error(err, "Writing the pod's network-status")
		}
	}
	return types.PrintResult(result, conf.CNIVersion)
}

// podClient is the plugin's API client, for one pod.
func podClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("network configuration: kubeconfig %q: %w", kubeconfig, err)
	}
	cfg.UserAgent = Type + "/" + version.String()
	cfg.QPS, cfg.Burst = 10, 20 // one pod
	return kubeclient.New(cfg, kubeclient.Protobuf)
}

// writeNetworkStatus writes the pod's network-status as Multus does: the
// default interface first (the runtime's interface in prevResult, named
// after the pod network's configuration, "default": true), then netop's
// interfaces as attached. One patch of pods/status, which the node's own
// credentials may make on its pods (the kubelet's NodeRestriction), and
// which holds only if the pod is still the one read.
func writeNetworkStatus(ctx context.Context, kube kubernetes.Interface, pod *corev1.Pod, network string, args *skel.CmdArgs, result *current.Result, allocations []netselect.Allocation) error {
	def := netselect.Status{Name: network, Interface: args.IfName, Default: true}
	def.DNS.Nameservers = result.DNS.Nameservers
	for i, iface := range result.Interfaces {
		if iface.Name != args.IfName || iface.Sandbox == "" {
			continue
		}
		def.MAC = iface.Mac
		for _, ip := range result.IPs {
			if ip.Interface != nil && *ip.Interface == i {
				def.IPs = append(def.IPs, ip.Address.IP.String())
			}
		}
	}
	status, err := netselect.StatusAnnotationValue(append([]netselect.Status{def}, netselect.StatusesOf(allocations)...))
	if err != nil {
		return err
	}
	patch, err := netselect.AnnotationsPatch(pod, map[string]string{netselect.StatusAnnotation: status}, false)
	if err != nil {
		return err
	}
	if _, err := kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, apitypes.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// podAllocations waits until the pod's allocations are written, and returns
// them (none if it declares no Networks).
func podAllocations(ctx context.Context, kube kubernetes.Interface, namespace, name, uid string) (*corev1.Pod, []netselect.Allocation, error) {
	// Usually the allocation is there before the sandbox is made; when it
	// is not, one watch of the pod waits for it rather than polling, which
	// would put a GET per pod every few hundred milliseconds on the API
	// server exactly when a node starts many pods at once.
	log := logr.FromContextOrDiscard(ctx)
	var lastErr error
	for {
		pod, err := kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		case err != nil:
			lastErr = fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
			log.V(vDebug).Info("Reading the pod failed; trying again", "err", lastErr)
		case uid != "" && string(pod.UID) != uid:
			return nil, nil, fmt.Errorf("pod %s/%s: UID %s, the runtime's is %s (the pod was replaced)", namespace, name, pod.UID, uid)
		default:
			allocations, done, why := allocated(pod)
			if done {
				log.V(vDebug).Info("Read the pod's allocations", "allocations", len(allocations))
				return pod, allocations, nil
			}
			if refused, ok := pod.Annotations[netselect.RefusedAnnotation]; ok {
				// Waiting would only delay the same answer.
				return nil, nil, fmt.Errorf("pod %s/%s: netop refuses its Networks: %s", namespace, name, refused)
			}
			lastErr = why
			log.V(vDebug).Info("Waiting for the pod's allocations", "reason", why.Error())
			if err := waitForChange(ctx, kube, pod); err != nil && ctx.Err() == nil {
				lastErr = errors.Join(why, err)
			}
		}
		if ctx.Err() != nil {
			return nil, nil, lastErr
		}
		if err != nil {
			// A failed read: try again shortly.
			select {
			case <-ctx.Done():
				return nil, nil, lastErr
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// waitForChange returns once the pod changed after the version given, or
// the watch ended.
func waitForChange(ctx context.Context, kube kubernetes.Interface, pod *corev1.Pod) error {
	w, err := kube.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String(), ResourceVersion: pod.ResourceVersion})
	if err != nil {
		// Read again after a pause rather than not at all.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		return fmt.Errorf("watching pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	defer w.Stop()
	select {
	case <-ctx.Done():
	case <-w.ResultChan():
	}
	return nil
}

// allocated: the pod's allocations, once written (they are the pod's for
// its life, even if its networks annotation changed since); none if it
// declares no Networks; else why not yet.
func allocated(pod *corev1.Pod) ([]netselect.Allocation, bool, error) {
	allocations, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
	if err != nil {
		return nil, false, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if allocations != nil {
		return allocations, true, nil
	}
	selections, err := netselect.Parse(pod.Annotations[netselect.NetworksAnnotation], pod.Namespace)
	if err != nil {
		return nil, false, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if len(selections) == 0 {
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("pod %s/%s: netop has not allocated its addresses yet (the pod's Events say why)", pod.Namespace, pod.Name)
}

// recorded loads what ADD recorded for the container, and an attacher for
// the node; ok is false when nothing was recorded, so nothing attached.
func recorded(conf *Config, args *skel.CmdArgs) (record cni.Record, attacher *cni.Attacher, ok bool, err error) {
	if record, ok, err = conf.store().Load(args.ContainerID); err != nil || !ok {
		return record, nil, false, err
	}
	if attacher, err = conf.attacher(); err != nil {
		return record, nil, false, err
	}
	return record, attacher, true, nil
}

// covers: the configuration is about the recorded interface (a delegate
// is about its Network's interface it was called for, a chained
// configuration about all).
func (c *Config) covers(r cni.RecordedInterface, ifname string) bool {
	return c.Network == "" || r.Network == c.Network && r.Interface == ifname
}

func cmdDel(ctx context.Context, conf *Config, args *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	record, attacher, ok, err := recorded(conf, args)
	if err != nil {
		return err
	}
	if !ok {
		log.V(vInfo).Info("Nothing recorded for the container: nothing to detach")
		return nil
	}
	defer attacher.Close()
	var gone []string
	for _, r := range record.Interfaces {
		if !conf.covers(r, args.IfName) {
			continue
		}
		if err := attacher.Del(args.ContainerID, r.Interface); err != nil {
			return fmt.Errorf("detaching %s from Network %s: %w", r.Interface, r.Network, err)
		}
		log.V(vInfo).Info("Detached", "interface", r.Interface, "network", r.Network, "hostVeth", r.HostVeth)
		gone = append(gone, r.Interface)
	}
	// A record left behind is not a resource already gone: failing has the
	// runtime call DEL again, which finds the interfaces gone (not an
	// error) and retries the record.
	return conf.store().Forget(record, gone)
}

func cmdCheck(ctx context.Context, conf *Config, args *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	record, attacher, ok, err := recorded(conf, args)
	if err != nil {
		return err
	}
	if !ok {
		log.V(vDebug).Info("Nothing recorded for the container: nothing to check")
		return nil
	}
	defer attacher.Close()
	for _, r := range record.Interfaces {
		if !conf.covers(r, args.IfName) {
			continue
		}
		at := cni.Attachment{ContainerID: args.ContainerID, Netns: args.Netns, Interface: r.Interface, Bridge: r.Bridge}
		if at.Addresses, err = cni.Prefixes(r.IPs); err != nil {
			return fmt.Errorf("record of %s: %w", args.ContainerID, err)
		}
		if err := attacher.Check(at); err != nil {
			return fmt.Errorf("Network %s: %w", r.Network, err) //nolint:staticcheck // a Network is a proper noun
		}
		log.V(vDebug).Info("Checked", "interface", r.Interface, "network", r.Network)
	}
	return nil
}

// cmdGC detaches the containers of this configuration that the runtime no
// longer has, and the host ends no record knows (left by a crash).
func cmdGC(ctx context.Context, conf *Config, _ *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	valid := map[string]bool{}
	for _, v := range conf.ValidAttachments {
		valid[v.ContainerID] = true
	}
	records, err := conf.store().List()
	if err != nil {
		return err
	}
	attacher, err := conf.attacher()
	if err != nil {
		return err
	}
	defer attacher.Close()
	known := map[string]bool{}
	var errs []error
	for _, r := range records {
		var gone []string
		for _, i := range r.Interfaces {
			if i.Config != conf.Name || valid[r.ContainerID] {
				known[i.HostVeth] = true
				continue
			}
			if err := attacher.Del(r.ContainerID, i.Interface); err != nil {
				errs = append(errs, fmt.Errorf("detaching %s of %s: %w", i.Interface, r.ContainerID, err))
				known[i.HostVeth] = true
				continue
			}
			log.V(vInfo).Info("Detached a container the runtime no longer has", "containerID", r.ContainerID,
				"interface", i.Interface, "network", i.Network, "hostVeth", i.HostVeth)
			gone = append(gone, i.Interface)
		}
		if err := conf.store().Forget(r, gone); err != nil {
			errs = append(errs, err)
		}
	}
	veths, err := attacher.HostVeths()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, v := range veths {
		if !known[v] {
			if err := attacher.DeleteHostVeth(v); err != nil {
				errs = append(errs, err)
				continue
			}
			log.V(vInfo).Info("Deleted a host end no record knows", "hostVeth", v)
		}
	}
	return errors.Join(errs...)
}

// cmdStatus: the plugin can attach when it can reach the node's namespace
// and write its records.
func cmdStatus(_ context.Context, conf *Config, _ *skel.CmdArgs) error {
	attacher, err := conf.attacher()
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	attacher.Close()
	if err := os.MkdirAll(conf.DataDir, 0o700); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("attachment records: %v", err), "")
	}
	return nil
}
