// Package netpolicy is the MultiNetworkPolicy controller. On a node that
// builds bridges (the agent, the standalone) it enforces the policies:
// on any change of a policy, a pod, a namespace or a Network it resolves
// every policy (internal/netpolicy) and hands the result to the node's
// firewall, which writes only what changed. Where it reports (the
// cluster's controller, the standalone) it tells on each policy, by
// Events, which Networks and how many pods it applies to, and what of it
// is not enforced and why.
package netpolicy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netpolicy"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/networkcache"
	"github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	policyinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/k8s.cni.cncf.io/v1beta1"
	policylisters "github.com/netop-dev/netop/pkg/generated/listers/k8s.cni.cncf.io/v1beta1"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// Resource is the MultiNetworkPolicies' resource.
var Resource = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1beta1", Resource: "multi-networkpolicies"}

// Reasons of the Events on policies.
const (
	ReasonApplied     = "PolicyApplied"
	ReasonNotEnforced = "PolicyNotEnforced"
)

// everything is the controller's one work item: every change resolves
// every policy, and the firewall writes the difference.
var everything = cache.ObjectName{Name: "policies"}

// Options configure the controller: Firewall, if set, is enforced;
// Report makes it write Events on the policies.
type Options struct {
	Firewall *linux.Firewall
	Report   bool
	// Resync is how often the firewall's table is checked and repaired.
	Resync time.Duration
}

// Controller resolves the policies and enforces or reports them.
type Controller struct {
	*runner.Controller
	policies   policylisters.MultiNetworkPolicyLister
	pods       corelisters.PodLister
	namespaces corelisters.NamespaceLister
	networks   samplecrdlisters.NetworkLister
	recorder   record.EventRecorder
	metrics    *metrics.Metrics
	opts       Options
	// reported is the last report on each policy, namespace/name.
	reported map[string]string
}

// NewWhereServed makes the controller if the cluster serves
// MultiNetworkPolicies, else nil: a cluster without the CRD has no policy.
func NewWhereServed(ctx context.Context, d discovery.DiscoveryInterface, policies policyinformers.MultiNetworkPolicyInformer, pods coreinformers.PodInformer,
	namespaces coreinformers.NamespaceInformer, networks networkcache.Source, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	served, err := kubeclient.Serves(d, Resource)
	if err != nil {
		return nil, err
	}
	if !served {
		klog.FromContext(ctx).Info("The cluster serves no MultiNetworkPolicies: no policy to enforce", "resource", Resource.String())
		return nil, nil
	}
	return New(ctx, policies, pods, namespaces, networks, recorder, m, o)
}

// New makes the controller; call it before the informers start. networks
// may be a node's own (an agent's on demand): a policy on a Network it
// does not hold selects nothing there.
func New(ctx context.Context, policies policyinformers.MultiNetworkPolicyInformer, pods coreinformers.PodInformer,
	namespaces coreinformers.NamespaceInformer, networks networkcache.Source, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	c := &Controller{policies: policies.Lister(), pods: pods.Lister(), namespaces: namespaces.Lister(), networks: samplecrdlisters.NewNetworkLister(networks.GetIndexer()),
		recorder: recorder, metrics: m, opts: o, reported: map[string]string{}}
	name := "netpolicy-report"
	if o.Firewall != nil {
		name = "netpolicy"
	}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: name, Workers: 1, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	enqueue := func(any) { c.Add(everything) }
	handler := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, cur any) { enqueue(cur) }, DeleteFunc: enqueue}
	// Pods change often (their status most of all): only what policies
	// read of them is worth resolving again.
	podHandler := handler
	podHandler.UpdateFunc = func(old, cur any) {
		if o, ok := old.(*corev1.Pod); !ok || policyRelevantChange(o, cur.(*corev1.Pod)) {
			enqueue(cur)
		}
	}
	for informer, handler := range map[networkcache.Source]cache.ResourceEventHandler{policies.Informer(): handler, pods.Informer(): podHandler,
		namespaces.Informer(): handler, networks: handler} {
		handled, err := informer.AddEventHandlerWithOptions(handler, cache.HandlerOptions{Logger: &logger})
		if err != nil {
			return nil, fmt.Errorf("adding event handler: %w", err)
		}
		c.WaitFor(handled.HasSyncedChecker())
	}
	if o.Firewall != nil {
		c.Go(func(ctx context.Context) {
			if err := o.Firewall.Watch(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Watching the policy table stopped; the resync repairs it")
			}
		})
		if o.Resync > 0 {
			c.Every("policy table repair", o.Resync, func(ctx context.Context) {
				if repaired, err := o.Firewall.Repair(); err != nil {
					klog.FromContext(ctx).Error(err, "Checking the policy table failed")
				} else if repaired {
					klog.FromContext(ctx).Info("Repaired the policy table", "table", linux.PolicyTable)
				}
			})
		}
	}
	return c, nil
}

// policyRelevantChange reports whether a pod changed in what policies
// read: its labels or what it holds (named ports never change).
func policyRelevantChange(old, cur *corev1.Pod) bool {
	return !maps.Equal(old.Labels, cur.Labels) || netselect.HoldingChanged(old, cur)
}

// sync resolves every policy against the caches, enforces the result and
// reports on the policies whose outcome changed.
func (c *Controller) sync(ctx context.Context, _ cache.ObjectName) error {
	policies, err := c.policies.List(labels.Everything())
	if err != nil {
		return err
	}
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	namespaces, err := c.namespaces.List(labels.Everything())
	if err != nil {
		return err
	}
	nsLabels := make(map[string]map[string]string, len(namespaces))
	for _, ns := range namespaces {
		nsLabels[ns.Name] = ns.Labels
	}
	resolved, outcomes := netpolicy.Resolve(netpolicy.Inputs{Policies: policies, Pods: pods, NamespaceLabels: nsLabels,
		Network: func(namespace, name string) *samplecrdv2.Network {
			n, err := c.networks.Networks(namespace).Get(name)
			if err != nil || n.DeletionTimestamp != nil {
				return nil
			}
			return n
		}})
	if c.opts.Firewall != nil {
		start := time.Now()
		stats, err := c.opts.Firewall.Apply(resolved)
		if err != nil {
			return fmt.Errorf("enforcing %d policies: %w", len(resolved), err)
		}
		kind := "elements"
		if stats.Replaced {
			kind = "replace"
		}
		c.metrics.PolicyProgramming.WithLabelValues(kind).Observe(time.Since(start).Seconds())
		c.metrics.PolicyRules.Set(float64(stats.Rules))
		c.metrics.PolicyElements.Set(float64(stats.Elements))
		if stats.Replaced || stats.Changed > 0 {
			klog.FromContext(ctx).V(2).Info("Enforced the policies", "policies", len(resolved), "replaced", stats.Replaced,
				"changed", stats.Changed, "rules", stats.Rules, "elements", stats.Elements, "duration", time.Since(start))
		}
	}
	if c.opts.Report {
		c.report(policies, outcomes)
	}
	return nil
}

// report writes an Event on each policy whose outcome changed since the
// last: which Networks and how many pods, or what is not enforced.
func (c *Controller) report(policies []*v1beta1.MultiNetworkPolicy, outcomes map[string]*netpolicy.Outcome) {
	seen := make(map[string]bool, len(policies))
	for _, p := range policies {
		key := p.Namespace + "/" + p.Name
		seen[key] = true
		o := outcomes[key]
		networks := slices.Clone(o.Networks)
		slices.Sort(networks)
		message := fmt.Sprintf("Applies to Networks %s: selects %d pods", strings.Join(networks, ", "), o.Pods)
		if len(networks) == 0 {
			message = "Applies to no Network"
		}
		kind, reason := corev1.EventTypeNormal, ReasonApplied
		if len(o.Problems) > 0 {
			message += "; not enforced: " + strings.Join(o.Problems, "; ")
			kind, reason = corev1.EventTypeWarning, ReasonNotEnforced
		}
		last := string(p.UID) + " " + message
		if c.reported[key] == last {
			continue
		}
		c.reported[key] = last
		c.recorder.Event(p, kind, reason, message)
	}
	for key := range c.reported {
		if !seen[key] {
			delete(c.reported, key)
		}
	}
}
