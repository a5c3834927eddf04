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
	pa, err := cniapi.LoadPodArgs(args.Args)
	if err != nil {
		return nil, fmt.Errorf("CNI_ARGS: %w", err)
	}
	logger := klog.FromContext(serverCtx).WithValues(cniapi.Invocation("ADD", args)...)
	if pa.K8S_POD_NAME == "" {
		if conf.Network != "" {
			return nil, errors.New("CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME: required to attach a pod to a Network")
		}
		logger.V(4).Info("Not a pod: nothing to attach")
		return result, nil
	}
	namespace, name := string(pa.K8S_POD_NAMESPACE), string(pa.K8S_POD_NAME)
	if s.opts.Namespace != "" && namespace != s.opts.Namespace {
		// Its pods are not in the cache, and it joins none of the
		// Networks of this netop, which allocates in one namespace.
		if conf.Network != "" {
			return nil, fmt.Errorf("pod %s/%s: netop manages namespace %s only", namespace, name, s.opts.Namespace)
		}
		logger.V(4).Info("A pod outside the namespace netop manages: nothing to attach")
		return result, nil
	}
	timeout, err := conf.AddTimeout()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(callerCtx, timeout)
	defer cancel()
	waited := time.Now()
	pod, allocations, err := s.podAllocations(ctx, namespace, name, string(pa.K8S_POD_UID))
	s.observe(metrics.CNIPhaseAllocation, waited, err)
	if err != nil {
		return nil, err
	}
	// An interface being detached (hot-plug) is not made again: its
	// addresses are about to be freed.
	allocations = netselect.Active(allocations)
	if conf.Network != "" {
		i := slices.IndexFunc(allocations, func(a netselect.Allocation) bool { return a.Network == conf.Network && a.Interface == args.IfName })
		if i < 0 {
			return nil, fmt.Errorf("pod %s/%s: no allocation on Network %s for interface %s", namespace, name, conf.Network, args.IfName)
		}
		allocations = allocations[i : i+1]
	}
	if len(allocations) == 0 {
		logger.V(4).Info("The pod joins no Network: nothing to attach")
		return result, nil
	}

	defer func(start time.Time) { s.observe(metrics.CNIPhaseAttach, start, err) }(time.Now())
	attacher, err := cni.AttacherIn(conf.NodeNetns)
	if err != nil {
		return nil, err
	}
	defer attacher.Close()
	store := cni.Store{Dir: conf.DataDir}
	// Held until the record says what stands: a DEL the runtime sends
	// after killing the plugin waits for this ADD's undo, or ran before,
	// and then the plugin is gone and nothing is attached.
	record, _, lock, err := store.LoadLocked(args.ContainerID)
	if lock != nil {
		defer func() {
			if err := lock.Unlock(); err != nil {
				logger.Error(err, "Unlocking the container's record")
			}
		}()
	}
	if err != nil {
		return nil, err
	}
	if err := abandoned(ctx); err != nil {
		return nil, fmt.Errorf("given up while the container's record was locked (a DEL or hot-plug holding it): %w", err)
	}
	record.ContainerID, record.Netns, record.Pod, record.PodUID = args.ContainerID, args.Netns, namespace+"/"+name, string(pa.K8S_POD_UID)
	// A delegate adds one interface per call.
	record = record.With(allocated.Interfaces(conf.Name, args.ContainerID, allocations...)...)
	// Recorded before anything is made, so that a DEL or GC after a crash
	// here knows what to undo.
	if err := store.Save(record); err != nil {
		return nil, err
	}
	var made []string
	// undo takes back what this ADD made and recorded, and returns cause
	// with whatever it could not undo: that stays in the record, for the
	// DEL the runtime sends after a failed ADD, or GC, to finish.
	undo := func(cause error) error {
		logger.V(4).Info("Undoing the attachments", "interfaces", made)
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
		if err := store.Forget(record, undone); err != nil {
			errs = append(errs, fmt.Errorf("undoing: %w", err))
		}
		return errors.Join(errs...)
	}
	for _, a := range allocations {
		if err := abandoned(ctx); err != nil {
			return nil, undo(err)
		}
		at, err := allocated.Attachment(args.ContainerID, podNetns, a)
		if err != nil {
			return nil, undo(err)
		}
		made = append(made, a.Interface)
		attached, err := attacher.Add(ctx, at)
		if err != nil {
			return nil, undo(fmt.Errorf("attaching %s to Network %s: %w", a.Interface, a.Network, err))
		}
		logger.V(2).Info("Attached", "interface", a.Interface, "network", a.Network, "ips", a.IPs,
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
	if err := callerExited(ctx); err != nil {
		// Attached, but for nobody: the runtime gave up on the sandbox.
		// Asked under the lock: a DEL after this finds the record. Its
		// time alone being over is not that: the plugin waits a margin
		// past it for the answer.
		return nil, undo(err)
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
