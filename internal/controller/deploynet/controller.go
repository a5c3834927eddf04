// Package deploynet gives a Deployment a Network of its own, the closing
// idea of the custom-controller tutorial (a controller that also watches
// Deployments). A Deployment annotated samplecrd.k8s.io/network: auto gets
// a Network of its name with a cidr from netop's pool; one annotated
// samplecrd.k8s.io/network-cidr gets that cidr. The Network is owned by
// the Deployment (its controller, blocking the owner's deletion), so that
// deleting the Deployment deletes it through the garbage collector, in
// the foreground or the background, and frees the cidr once netop has
// removed the Network. Its pods join the Network: admission lists it in
// the pod template's Multus annotation (package webhook/deployments), and
// this controller adds it where admission did not (one more rollout).
package deploynet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v2"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// Name is the controller's name in logs and metrics.
const Name = "deployment-network"

// Reasons of the Events on Deployments.
const (
	ReasonNetworkCreated    = "NetworkCreated"
	ReasonNetworkUpdated    = "NetworkUpdated"
	ReasonNetworkRefused    = "NetworkRefused"
	ReasonNetworkConflict   = "NetworkConflict"
	ReasonInvalidAnnotation = "InvalidNetworkAnnotation"
	ReasonPoolExhausted     = "NetworkPoolExhausted"
	ReasonTemplateAttached  = "NetworkAttached"
)

// Label marks the Networks made for Deployments.
const Label = samplecrd.GroupName + "/deployment"

// Options configure the controller.
type Options struct {
	Workers int
	Pool    *Pool
}

// Controller keeps Deployments' Networks.
type Controller struct {
	*runner.Controller
	client      versioned.Interface
	kube        kubernetes.Interface
	deployments appslisters.DeploymentLister
	networks    samplecrdlisters.NetworkLister
	recorder    record.EventRecorder
	pool        *Pool
}

// New makes the controller on the Deployments' and the Networks'
// informers; call it before they start.
func New(ctx context.Context, client versioned.Interface, kube kubernetes.Interface, deployments appsinformers.DeploymentInformer,
	networks samplecrdinformers.NetworkInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	if o.Pool == nil {
		return nil, errors.New("deployment networks need a pool")
	}
	c := &Controller{client: client, kube: kube, deployments: deployments.Lister(), networks: networks.Lister(), recorder: recorder, pool: o.Pool}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: Name, Workers: o.Workers, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	deploymentsHandled, err := deployments.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.Enqueue,
		UpdateFunc: func(_, newObj any) { c.Enqueue(newObj) },
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Deployment event handler: %w", err)
	}
	networksHandled, err := networks.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.networkChanged,
		UpdateFunc: func(_, newObj any) { c.networkChanged(newObj) },
		DeleteFunc: c.networkChanged,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Network event handler: %w", err)
	}
	c.WaitFor(deploymentsHandled.HasSyncedChecker(), networksHandled.HasSyncedChecker())
	return c, nil
}

// deploymentKind is the kind of the Networks' owners.
var deploymentKind = appsv1.SchemeGroupVersion.WithKind("Deployment")

// networkChanged enqueues the Deployment that owns a Network; a Network
// in the cache needs no pending cidr in the pool any more.
func (c *Controller) networkChanged(obj any) {
	if name, ok := runner.ControllerOf(obj, deploymentKind); ok {
		c.pool.Release(name.String())
		c.Add(name)
	}
}

// sync gives an annotated Deployment its Network and lists the Network in
// its pod template.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	d, err := c.deployments.Deployments(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		return nil // the garbage collector deletes its Network
	}
	if err != nil {
		return err
	}
	if d.DeletionTimestamp != nil {
		return nil
	}
	cidr, wanted, err := netselect.DeploymentWants(d.Annotations)
	if err != nil {
		c.recorder.Event(d, corev1.EventTypeWarning, ReasonInvalidAnnotation, err.Error())
		return nil
	}
	if !wanted {
		return nil
	}

	n, err := c.networks.Networks(d.Namespace).Get(d.Name)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.create(ctx, d, cidr); err != nil {
			return err
		}
	case err != nil:
		return err
	case !metav1.IsControlledBy(n, d) && (n.DeletionTimestamp != nil || netselect.OfDeploymentNamed(n, d.Name)):
		// An earlier Deployment's of this name, going or about to be
		// collected: its deletion brings this one's.
		return nil
	case !metav1.IsControlledBy(n, d):
		c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonNetworkConflict,
			"Network %s exists and is not this Deployment's: rename the Deployment or delete that Network", d.Name)
		return nil
	case cidr.IsValid() && n.DeletionTimestamp == nil && (len(n.Spec.CIDRs) == 0 || n.Spec.CIDRs[0] != cidr.String()):
		if err := c.updateCIDR(ctx, d, n, cidr); err != nil {
			return err
		}
	}
	return c.attachTemplate(ctx, d)
}

// create makes the Deployment's Network, with a cidr from the pool unless
// the Deployment names one.
func (c *Controller) create(ctx context.Context, d *appsv1.Deployment, cidr netip.Prefix) error {
	owner := cache.MetaObjectToName(d).String()
	if cidr.IsValid() {
		c.pool.Reserve(owner, cidr)
	} else {
		var err error
		if cidr, err = c.pool.Allocate(owner, c.taken); err != nil {
			c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonPoolExhausted, "No Network for this Deployment: %v", err)
			return err
		}
	}
	n := &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{
			Name: d.Name, Namespace: d.Namespace,
			Labels:          map[string]string{Label: d.Name, "app.kubernetes.io/managed-by": "netop"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, deploymentKind)},
		},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{cidr.String()}},
	}
	created, err := c.client.SamplecrdV2().Networks(d.Namespace).Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		c.pool.Release(owner)
		if apierrors.IsAlreadyExists(err) {
			return err // the cache is behind; the retry reads it
		}
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
			c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonNetworkRefused, "Network %s with cidr %s refused: %v", d.Name, cidr, err)
		}
		return fmt.Errorf("creating Network %s/%s: %w", d.Namespace, d.Name, err)
	}
	klog.FromContext(ctx).V(1).Info("Created the Deployment's Network", "deployment", klog.KObj(d), "cidrs", created.Spec.CIDRs)
	c.recorder.Eventf(d, corev1.EventTypeNormal, ReasonNetworkCreated, "Created Network %s with cidr %s", d.Name, cidr)
	return nil
}

// taken are the cidrs of every Network in the cache, as asked and as
// built.
func (c *Controller) taken() ([]netip.Prefix, error) {
	all, err := c.networks.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(all))
	for _, n := range all {
		out = append(out, netspec.ParsePrefixes(slices.Concat(n.Spec.CIDRs, n.Status.CIDRs)...)...)
	}
	return out, nil
}

// updateCIDR moves the Network to the cidr the Deployment now names; its
// gateway is defaulted again.
func (c *Controller) updateCIDR(ctx context.Context, d *appsv1.Deployment, n *samplecrdv2.Network, cidr netip.Prefix) error {
	n = n.DeepCopy()
	// The annotation names the first family; a second one a user added
	// stays.
	n.Spec.CIDRs = append([]string{cidr.String()}, n.Spec.CIDRs[min(1, len(n.Spec.CIDRs)):]...)
	if len(n.Spec.Gateways) > 0 {
		n.Spec.Gateways = append([]string{""}, n.Spec.Gateways[1:]...)
	}
	if _, err := c.client.SamplecrdV2().Networks(n.Namespace).Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonNetworkRefused, "Network %s cannot move to %s: %v", n.Name, cidr, err)
		}
		return fmt.Errorf("updating Network %s/%s: %w", n.Namespace, n.Name, err)
	}
	c.recorder.Eventf(d, corev1.EventTypeNormal, ReasonNetworkUpdated, "Network %s moved to cidr %s", n.Name, cidr)
	return nil
}

// attachTemplate lists the Network in the pod template's Multus
// annotation, where admission did not (the webhook was down, or the
// Deployment predates netop): a rollout, so that the pods join it.
func (c *Controller) attachTemplate(ctx context.Context, d *appsv1.Deployment) error {
	annotation, added, err := netselect.TemplateNetworks(d)
	if err != nil {
		c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonInvalidAnnotation, "The pod template's %v; its pods cannot join Network %s", err, d.Name)
		return nil
	}
	if !added {
		return nil
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": d.ResourceVersion},
		"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{netselect.NetworksAnnotation: annotation}}}},
	})
	if err != nil {
		return err
	}
	if _, err := c.kube.AppsV1().Deployments(d.Namespace).Patch(ctx, d.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("listing Network %s in the pod template of Deployment %s/%s: %w", d.Name, d.Namespace, d.Name, err)
	}
	c.recorder.Eventf(d, corev1.EventTypeNormal, ReasonTemplateAttached, "Pods join Network %s: added to the pod template's %s", d.Name, netselect.NetworksAnnotation)
	return nil
}
