package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cni/allocated"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
)

// add attaches the pod of an ADD, whose network namespace this process
// opens at podNetns, to its Networks with the addresses
// allocated to it, records what it made, and returns the result. serverCtx
// is the server's: the command's own is callerCtx (which ends when the
// plugin exits) bounded by the configuration's timeout, and the
// network-status written after it by the server's.
func (s *Server) add(serverCtx, callerCtx context.Context, conf *cniapi.Config, args *skel.CmdArgs, podNetns string) (_ *current.Result, err error) {
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if conf.PrevResult != nil {
		var err error
		if result, err = current.NewResultFromResult(conf.PrevResult); err != nil {
			return nil, fmt.Errorf("prevResult: %w", err)
		}
	}
	logger := klog.FromContext(serverCtx).WithValues(cniapi.Invocation("ADD", args)...)
	pa, ok, err := s.podToAttach(logger, conf, args)
	if err != nil {
		return nil, err
	}
	if !ok {
		return result, nil
	}
	timeout, err := conf.AddTimeout()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(callerCtx, timeout)
	defer cancel()
	pod, allocations, err := s.allocationsToAttach(ctx, conf, args, pa)
	if err != nil {
		return nil, err
	}
	if len(allocations) == 0 {
		logger.V(4).Info("The pod joins no Network: nothing to attach")
		return result, nil
	}

	defer func(start time.Time) { s.observe(metrics.CNIPhaseAttach, start, err) }(time.Now())
	if err := attachAll(ctx, logger, conf, args, pa, podNetns, allocations, result); err != nil {
		return nil, err
	}
	if conf.Network == "" && conf.PrevResult != nil {
		// Chained after the pod network's plugin, netop knows the default
		// interface too; as Multus's delegate, Multus writes the status.
		// After the answer: the pod works without it (the status the
		// allocator wrote stands), and its sandbox need not wait for the
		// API server, or fail when it is down.
		status, err := networkStatus(conf.Name, args, result, allocations)
		if err != nil {
			return nil, err
		}
		s.after.Go(func() {
			ctx, cancel := context.WithTimeout(serverCtx, statusTimeout)
			defer cancel()
			if err := s.writeNetworkStatus(ctx, pod, status); err != nil {
				logger.Error(err, "Writing the pod's network-status")
			}
		})
	}
	return result, nil
}

// podToAttach reads the pod of an ADD from CNI_ARGS; ok is false when the
// call is not for a pod this node side attaches (and that is no error).
func (s *Server) podToAttach(logger klog.Logger, conf *cniapi.Config, args *skel.CmdArgs) (pa cniapi.PodArgs, ok bool, err error) {
	pa, err = cniapi.LoadPodArgs(args.Args)
	if err != nil {
		return pa, false, fmt.Errorf("CNI_ARGS: %w", err)
	}
	if pa.K8S_POD_NAME == "" {
		if conf.Network != "" {
			return pa, false, errors.New("CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME: required to attach a pod to a Network")
		}
		logger.V(4).Info("Not a pod: nothing to attach")
		return pa, false, nil
	}
	namespace, name := string(pa.K8S_POD_NAMESPACE), string(pa.K8S_POD_NAME)
	if s.opts.Namespace != "" && namespace != s.opts.Namespace {
		// Its pods are not in the cache, and it joins none of the
		// Networks of this netop, which allocates in one namespace.
		if conf.Network != "" {
			return pa, false, fmt.Errorf("pod %s/%s: netop manages namespace %s only", namespace, name, s.opts.Namespace)
		}
		logger.V(4).Info("A pod outside the namespace netop manages: nothing to attach")
		return pa, false, nil
	}
	return pa, true, nil
}

// allocationsToAttach waits for the pod's allocations and returns those
// this call attaches: all of them chained, the one of the delegate's
// Network and interface otherwise.
func (s *Server) allocationsToAttach(ctx context.Context, conf *cniapi.Config, args *skel.CmdArgs, pa cniapi.PodArgs) (*corev1.Pod, []netselect.Allocation, error) {
	namespace, name := string(pa.K8S_POD_NAMESPACE), string(pa.K8S_POD_NAME)
	waited := time.Now()
	pod, allocations, err := s.podAllocations(ctx, namespace, name, string(pa.K8S_POD_UID))
	s.observe(metrics.CNIPhaseAllocation, waited, err)
	if err != nil {
		return nil, nil, err
	}
	// An interface being detached (hot-plug) is not made again: its
	// addresses are about to be freed.
	allocations = netselect.Active(allocations)
	if conf.Network != "" {
		i := slices.IndexFunc(allocations, func(a netselect.Allocation) bool { return a.Network == conf.Network && a.Interface == args.IfName })
		if i < 0 {
			return nil, nil, fmt.Errorf("pod %s/%s: no allocation on Network %s for interface %s", namespace, name, conf.Network, args.IfName)
		}
		allocations = allocations[i : i+1]
	}
	return pod, allocations, nil
}

// attachAll attaches the pod to each allocation's Network under the
// container's lock, recording first what it makes, and adds each
// interface to result. On failure it undoes what it made.
func attachAll(ctx context.Context, logger klog.Logger, conf *cniapi.Config, args *skel.CmdArgs, pa cniapi.PodArgs, podNetns string,
	allocations []netselect.Allocation, result *current.Result) error {
	attacher, err := cni.AttacherIn(conf.NodeNetns)
	if err != nil {
		return err
	}
	defer attacher.Close()
	a := &attachment{logger: logger, attacher: attacher, store: cni.Store{Dir: conf.DataDir}, containerID: args.ContainerID, allocations: allocations}
	// Held until the record says what stands: a DEL the runtime sends
	// after killing the plugin waits for this ADD's undo, or ran before,
	// and then the plugin is gone and nothing is attached.
	record, _, lock, err := a.store.LoadLocked(args.ContainerID)
	if lock != nil {
		defer func() {
			if err := lock.Unlock(); err != nil {
				logger.Error(err, "Unlocking the container's record")
			}
		}()
	}
	if err != nil {
		return err
	}
	if err := abandoned(ctx); err != nil {
		return fmt.Errorf("given up while the container's record was locked (a DEL or hot-plug holding it): %w", err)
	}
	record.ContainerID, record.Netns = args.ContainerID, args.Netns
	record.Pod, record.PodUID = string(pa.K8S_POD_NAMESPACE)+"/"+string(pa.K8S_POD_NAME), string(pa.K8S_POD_UID)
	// A delegate adds one interface per call.
	a.record = record.With(allocated.Interfaces(conf.Name, args.ContainerID, allocations...)...)
	// Recorded before anything is made, so that a DEL or GC after a crash
	// here knows what to undo.
	if err := a.store.Save(a.record); err != nil {
		return err
	}
	for _, alloc := range allocations {
		if err := abandoned(ctx); err != nil {
			return a.undo(err)
		}
		if err := a.attach(ctx, args, podNetns, alloc, result); err != nil {
			return a.undo(err)
		}
	}
	if err := callerExited(ctx); err != nil {
		// Attached, but for nobody: the runtime gave up on the sandbox.
		// Asked under the lock: a DEL after this finds the record. Its
		// time alone being over is not that: the plugin waits a margin
		// past it for the answer.
		return a.undo(err)
	}
	return nil
}

// attachment is one ADD's work on the node under the container's lock:
// what it recorded and which interfaces it made so far.
type attachment struct {
	logger      klog.Logger
	attacher    *cni.Attacher
	store       cni.Store
	containerID string
	allocations []netselect.Allocation
	record      cni.Record
	made        []string
}

// attach makes one allocation's interface and adds it to result.
func (a *attachment) attach(ctx context.Context, args *skel.CmdArgs, podNetns string, alloc netselect.Allocation, result *current.Result) error {
	at, err := allocated.Attachment(args.ContainerID, podNetns, alloc)
	if err != nil {
		return err
	}
	a.made = append(a.made, alloc.Interface)
	attached, err := a.attacher.Add(ctx, at)
	if err != nil {
		return fmt.Errorf("attaching %s to Network %s: %w", alloc.Interface, alloc.Network, err)
	}
	a.logger.V(2).Info("Attached", "interface", alloc.Interface, "network", alloc.Network, "ips", alloc.IPs,
		"mac", attached.MAC.String(), "hostVeth", attached.HostVeth)
	result.Interfaces = append(result.Interfaces,
		&current.Interface{Name: attached.HostVeth},
		&current.Interface{Name: alloc.Interface, Mac: attached.MAC.String(), Sandbox: args.Netns})
	podIface := len(result.Interfaces) - 1
	for _, p := range at.Addresses {
		result.IPs = append(result.IPs, &current.IPConfig{Interface: current.Int(podIface), Address: *cni.IPNet(p)})
	}
	for _, r := range at.Routes {
		result.Routes = append(result.Routes, &types.Route{Dst: *cni.IPNet(r.Dst), GW: r.GW.AsSlice()})
	}
	return nil
}

// undo takes back what this ADD made and recorded, and returns cause
// with whatever it could not undo: that stays in the record, for the
// DEL the runtime sends after a failed ADD, or GC, to finish.
func (a *attachment) undo(cause error) error {
	a.logger.V(4).Info("Undoing the attachments", "interfaces", a.made)
	errs := []error{cause}
	var left []string
	for _, iface := range a.made {
		if err := a.attacher.Del(a.containerID, iface); err != nil {
			errs = append(errs, fmt.Errorf("undoing %s: %w", iface, err))
			left = append(left, iface)
		}
	}
	var undone []string
	for _, alloc := range a.allocations {
		if !slices.Contains(left, alloc.Interface) {
			undone = append(undone, alloc.Interface)
		}
	}
	if err := a.store.Forget(a.record, undone); err != nil {
		errs = append(errs, fmt.Errorf("undoing: %w", err))
	}
	return errors.Join(errs...)
}

// observe records a phase of an ADD that began at start and ended with
// err.
func (s *Server) observe(phase string, start time.Time, err error) {
	if s.opts.Metrics != nil {
		s.opts.Metrics.ObserveCNIAdd(phase, time.Since(start), err)
	}
}

// networkStatus is the pod's network-status as Multus writes it: the
// default interface first (the runtime's interface in prevResult, named
// after the pod network's configuration, "default": true), then netop's
// interfaces as attached.
func networkStatus(network string, args *skel.CmdArgs, result *current.Result, allocations []netselect.Allocation) (string, error) {
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
	return netselect.StatusAnnotationValue(append([]netselect.Status{def}, netselect.StatusesOf(allocations)...))
}

// writeNetworkStatus writes the pod's network-status: one patch of
// pods/status, which holds only if the pod is still the one read.
func (s *Server) writeNetworkStatus(ctx context.Context, pod *corev1.Pod, status string) error {
	patch, err := netselect.AnnotationsPatch(pod, map[string]string{netselect.StatusAnnotation: status}, false)
	if err != nil {
		return err
	}
	if _, err := s.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, apitypes.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// podAllocations waits until the node's cache holds the pod, the one the
// runtime names, with its allocations written, and returns them (none if
// it declares no Networks). The cache may be behind the API server, so
// a pod not there yet, or an older pod of the same name, is waited for
// rather than refused; the timeout says why it was not found.
func (s *Server) podAllocations(ctx context.Context, namespace, name, uid string) (*corev1.Pod, []netselect.Allocation, error) {
	logger := klog.FromContext(ctx)
	key := namespace + "/" + name
	for {
		changed, done := s.changes.wait(key)
		pod, err := s.pods.Pods(namespace).Get(name)
		var why error
		switch {
		case apierrors.IsNotFound(err):
			why = fmt.Errorf("pod %s: not found in the node's cache of pods", key)
		case err != nil:
			done()
			return nil, nil, fmt.Errorf("reading pod %s: %w", key, err)
		case uid != "" && string(pod.UID) != uid:
			why = fmt.Errorf("pod %s: UID %s, the runtime's is %s (the pod was replaced)", key, pod.UID, uid)
		default:
			allocations, ok, notYet := allocationsOf(pod)
			if ok {
				done()
				return pod, allocations, nil
			}
			if refused, ok := pod.Annotations[netselect.RefusedAnnotation]; ok {
				done()
				// Waiting would only delay the same answer.
				return nil, nil, fmt.Errorf("pod %s: netop refuses its Networks: %s", key, refused)
			}
			why = notYet
		}
		logger.V(4).Info("Waiting for the pod", "reason", why.Error())
		select {
		case <-changed:
		case <-ctx.Done():
			done()
			return nil, nil, why
		}
	}
}

// allocationsOf: the pod's allocations, once written (they are the pod's for
// its life, even if its networks annotation changed since); none if it
// declares no Networks; else why not yet.
func allocationsOf(pod *corev1.Pod) ([]netselect.Allocation, bool, error) {
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
