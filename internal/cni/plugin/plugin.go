// Package plugin is netop's CNI plugin: the CNI protocol (ADD, CHECK, DEL,
// GC, STATUS, VERSION; spec 1.0.0 and 1.1.0) as the runtime runs it, on top
// of package cni's attacher and records.
//
// The binary is thin, as Kube-OVN's and Cilium's are: ADD is forwarded
// over a unix socket to netop's node side (the agent, or the standalone's
// operator), which reads the pod's addresses from its informer cache
// rather than from the API server, attaches the pod and records it
// (package cni/server). DEL, CHECK and GC need only what ADD recorded on
// the node, and run here, so they work with the agent down and the API
// server down. The plugin links no Kubernetes client: it starts in a few
// milliseconds, once per pod and Network.
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
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	cniversion "github.com/containernetworking/cni/pkg/version"
	"github.com/go-logr/logr"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/version"
)

// Versions are the CNI spec versions the plugin speaks.
var Versions = cniversion.PluginSupports("1.0.0", "1.1.0")

// Main runs the plugin as the runtime calls it (environment and stdin) and
// exits.
func Main() {
	r := runner{stderr: os.Stderr}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add: r.cmd("ADD", cmdAdd), Del: r.cmd("DEL", cmdDel), Check: r.cmd("CHECK", cmdCheck),
		GC: r.cmd("GC", cmdGC), Status: r.cmd("STATUS", cmdStatus),
	}, Versions, "netop CNI plugin "+version.String())
}

// recorded loads what ADD recorded for the container, and an attacher for
// the node; ok is false when nothing was recorded, so nothing attached.
func recorded(conf *cniapi.Config, args *skel.CmdArgs) (record cni.Record, attacher *cni.Attacher, ok bool, err error) {
	if record, ok, err = store(conf).Load(args.ContainerID); err != nil || !ok {
		return record, nil, false, err
	}
	if attacher, err = cni.AttacherIn(conf.NodeNetns); err != nil {
		return record, nil, false, err
	}
	return record, attacher, true, nil
}

// covers: the configuration is about the recorded interface (a delegate
// is about its Network's interface it was called for, a chained
// configuration about all).
func covers(c *cniapi.Config, r cni.RecordedInterface, ifname string) bool {
	return c.Network == "" || r.Network == c.Network && r.Interface == ifname
}

func cmdDel(ctx context.Context, conf *cniapi.Config, args *skel.CmdArgs) (err error) {
	log := logr.FromContextOrDiscard(ctx)
	// No records' directory, no record, and DEL succeeds as before: it
	// makes no directory (the node side's ADD does), also after netop was
	// removed from the node.
	if _, err := os.Stat(conf.DataDir); errors.Is(err, fs.ErrNotExist) {
		log.V(cniapi.LogInfo).Info("Nothing recorded for the container: nothing to detach")
		return nil
	}
	// The node side may be undoing an ADD of the container whose plugin
	// the runtime killed: its record is read once that is done.
	record, ok, lock, err := store(conf).LoadLocked(args.ContainerID)
	if lock != nil {
		defer func() { err = errors.Join(err, lock.Unlock()) }()
	}
	if errors.Is(err, cni.ErrUnreadable) {
		return delUnreadable(ctx, conf, args, err)
	}
	if err != nil {
		return err
	}
	if !ok {
		log.V(cniapi.LogInfo).Info("Nothing recorded for the container: nothing to detach")
		return nil
	}
	attacher, err := cni.AttacherIn(conf.NodeNetns)
	if err != nil {
		return err
	}
	defer attacher.Close()
	var gone []string
	for _, r := range record.Interfaces {
		if !covers(conf, r, args.IfName) {
			continue
		}
		if err := attacher.Del(args.ContainerID, r.Interface); err != nil {
			return fmt.Errorf("detaching %s from Network %s: %w", r.Interface, r.Network, err)
		}
		log.V(cniapi.LogInfo).Info("Detached", "interface", r.Interface, "network", r.Network, "hostVeth", r.HostVeth)
		gone = append(gone, r.Interface)
	}
	// A record left behind is not a resource already gone: failing has the
	// runtime call DEL again, which finds the interfaces gone (not an
	// error) and retries the record.
	return store(conf).Forget(record, gone)
}

// delUnreadable detaches a container whose record is not one (another
// version's, edited by hand) with what DEL knows without it: a delegate's
// own interface, whose host end is named after the container and the
// interface; a chained configuration's interfaces go with the sandbox's
// namespace. The record goes too: failing would have the runtime retry,
// forever, a sandbox it could then never remove, and GC deletes the host
// ends that no record knows once none is unreadable.
func delUnreadable(ctx context.Context, conf *cniapi.Config, args *skel.CmdArgs, cause error) error {
	log := logr.FromContextOrDiscard(ctx)
	log.Error(cause, "Detaching without the container's record, and removing it")
	if conf.Network != "" {
		attacher, err := cni.AttacherIn(conf.NodeNetns)
		if err != nil {
			return err
		}
		defer attacher.Close()
		if err := attacher.Del(args.ContainerID, args.IfName); err != nil {
			return fmt.Errorf("detaching %s without its record: %w", args.IfName, err)
		}
	}
	if err := store(conf).Remove(args.ContainerID); err != nil {
		return fmt.Errorf("removing the unreadable record of %s: %w", args.ContainerID, err)
	}
	return nil
}

func cmdCheck(ctx context.Context, conf *cniapi.Config, args *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	record, attacher, ok, err := recorded(conf, args)
	if err != nil {
		return err
	}
	if !ok {
		log.V(cniapi.LogDebug).Info("Nothing recorded for the container: nothing to check")
		return nil
	}
	defer attacher.Close()
	for _, r := range record.Interfaces {
		if !covers(conf, r, args.IfName) {
			continue
		}
		at := cni.Attachment{ContainerID: args.ContainerID, Netns: args.Netns, Interface: r.Interface, Bridge: r.Bridge}
		if at.Addresses, err = cni.Prefixes(r.IPs); err != nil {
			return fmt.Errorf("record of %s: %w", args.ContainerID, err)
		}
		if err := attacher.Check(at); err != nil {
			return fmt.Errorf("Network %s: %w", r.Network, err) //nolint:staticcheck // a Network is a proper noun
		}
		log.V(cniapi.LogDebug).Info("Checked", "interface", r.Interface, "network", r.Network)
	}
	return nil
}

// cmdGC detaches the containers of this configuration that the runtime no
// longer has, and the host ends no record knows (left by a crash).
func cmdGC(ctx context.Context, conf *cniapi.Config, _ *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	valid := map[string]bool{}
	for _, v := range conf.ValidAttachments {
		valid[v.ContainerID] = true
	}
	records, _, err := store(conf).List()
	if err != nil {
		return err
	}
	attacher, err := cni.AttacherIn(conf.NodeNetns)
	if err != nil {
		return err
	}
	defer attacher.Close()
	var errs []error
	for _, listed := range records {
		// As it is now: a DEL may have taken it since the listing.
		r, _, lock, err := store(conf).LoadLocked(listed.ContainerID)
		if err != nil {
			if lock != nil {
				err = errors.Join(err, lock.Unlock())
			}
			errs = append(errs, err)
			continue
		}
		var gone []string
		for _, i := range r.Interfaces {
			if i.Config != conf.Name || valid[r.ContainerID] {
				continue
			}
			if err := attacher.Del(r.ContainerID, i.Interface); err != nil {
				errs = append(errs, fmt.Errorf("detaching %s of %s: %w", i.Interface, r.ContainerID, err))
				continue
			}
			log.V(cniapi.LogInfo).Info("Detached a container the runtime no longer has", "containerID", r.ContainerID,
				"interface", i.Interface, "network", i.Network, "hostVeth", i.HostVeth)
			gone = append(gone, i.Interface)
		}
		if err := store(conf).Forget(r, gone); err != nil {
			errs = append(errs, err)
		}
		if err := lock.Unlock(); err != nil {
			errs = append(errs, err)
		}
	}
	veths, err := attacher.HostVeths()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	// The host ends the records know are those kept above (another
	// configuration's, a valid container's, one that failed to go) and
	// those made since the listing: an ADD or a hot-plug records before it
	// makes one, so the records read after the host ends know them all.
	records, unreadable, err := store(conf).List()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	// A container whose record is not one holds host ends that no record
	// says: none is deleted for being unknown while one is there (its
	// container's DEL removes it).
	if len(unreadable) > 0 {
		return errors.Join(append(errs, fmt.Errorf("records of %s: %w: the host ends no record knows are kept until their containers' DEL",
			strings.Join(unreadable, ", "), cni.ErrUnreadable))...)
	}
	known := map[string]bool{}
	for _, r := range records {
		for _, i := range r.Interfaces {
			known[i.HostVeth] = true
		}
	}
	for _, v := range veths {
		if !known[v.Attrs().Name] {
			if err := attacher.DeleteHostVeth(v); err != nil {
				errs = append(errs, err)
				continue
			}
			log.V(cniapi.LogInfo).Info("Deleted a host end no record knows", "hostVeth", v.Attrs().Name)
		}
	}
	return errors.Join(errs...)
}

// cmdStatus: the plugin can attach when it can reach the node's namespace
// and write its records.
func cmdStatus(_ context.Context, conf *cniapi.Config, _ *skel.CmdArgs) error {
	attacher, err := cni.AttacherIn(conf.NodeNetns)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	attacher.Close()
	if err := os.MkdirAll(conf.DataDir, 0o700); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("attachment records: %v", err), "")
	}
	return nil
}

// store is where the configuration's attachments are recorded.
func store(conf *cniapi.Config) cni.Store { return cni.Store{Dir: conf.DataDir} }
