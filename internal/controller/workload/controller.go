// Package workload is the tutorial's Initializer loop for objects that can
// still change: Deployments annotated initializer.kubernetes.io/envoy:
// "true" get the Envoy template merged into spec.template with a PATCH (a
// rolling update), are re-patched when the template changes, and lose what
// was injected when the annotation goes. Their pods then carry the
// injection record, so the Pod webhook leaves them alone.
//
// It never touches Deployments in kube-system, in the operator's namespace,
// or in a namespace labelled initializer.kubernetes.io/envoy=disabled: it
// patches with netop's service account, so where it may write is decided
// by the cluster's administrators (the namespace label), not by whoever may
// annotate a Deployment. The template a Deployment gets obeys the template
// policy of envoy.Finder.
package workload

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/envoy"
	"github.com/netop-dev/netop/internal/metrics"
)

// Name is the controller's name in logs and metrics.
const Name = "workload"

// Reasons of the Events on Deployments and templates.
const (
	ReasonInjected        = envoy.ReasonInjected
	ReasonUpdated         = envoy.ReasonUpdated
	ReasonRemoved         = envoy.ReasonRemoved
	ReasonNameConflict    = "NameConflict"
	ReasonSkipped         = envoy.ReasonSkipped
	ReasonInvalidTemplate = envoy.ReasonInvalidTemplate
)

// Options configure the controller.
type Options struct {
	// OperatorNamespace holds the default template; its Deployments are
	// left alone.
	OperatorNamespace string
	// AllowPrivilegedTemplates lifts the template policy for every
	// namespace (--allow-privileged-templates).
	AllowPrivilegedTemplates bool
	Workers                  int
}

// Controller initializes Deployments with the Envoy template.
type Controller struct {
	*runner.Controller
	kube              kubernetes.Interface
	deployments       appslisters.DeploymentLister
	namespaces        corelisters.NamespaceLister
	finder            envoy.Finder
	recorder          record.EventRecorder
	operatorNamespace string
}

// New makes the controller; call it before the informers start. templates
// needs to hold only the envoy-initializer ConfigMaps.
func New(ctx context.Context, kube kubernetes.Interface, deployments appsinformers.DeploymentInformer, namespaces coreinformers.NamespaceInformer,
	templates coreinformers.ConfigMapInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	c := &Controller{
		kube:        kube,
		deployments: deployments.Lister(),
		namespaces:  namespaces.Lister(),
		finder: envoy.Finder{ConfigMaps: templates.Lister(), OperatorNamespace: o.OperatorNamespace,
			AllowPrivileged: o.AllowPrivilegedTemplates},
		recorder:          recorder,
		operatorNamespace: o.OperatorNamespace,
	}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: Name, Workers: o.Workers, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	deploymentsHandled, err := deployments.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueueDeployment,
		UpdateFunc: func(oldObj, newObj any) {
			if oldObj.(*appsv1.Deployment).ResourceVersion != newObj.(*appsv1.Deployment).ResourceVersion {
				c.enqueueDeployment(newObj)
			}
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Deployment event handler: %w", err)
	}
	templatesHandled, err := templates.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueForTemplate,
		UpdateFunc: func(_, newObj any) { c.enqueueForTemplate(newObj) },
		DeleteFunc: c.enqueueForTemplate,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding ConfigMap event handler: %w", err)
	}
	// A namespace that loses its opt-out label: its Deployments are looked
	// at anew.
	namespacesHandled, err := namespaces.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			oldNs, newNs := oldObj.(*corev1.Namespace), newObj.(*corev1.Namespace)
			if optedOut(oldNs) && !optedOut(newNs) {
				c.enqueueNamespace(newNs.Name)
			}
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Namespace event handler: %w", err)
	}
	// Synced once the caches are full and the handlers have been handed
	// their initial lists.
	c.WaitFor(deploymentsHandled.HasSyncedChecker(), templatesHandled.HasSyncedChecker(), namespacesHandled.HasSyncedChecker())
	return c, nil
}

// optedOut: the namespace is labelled initializer.kubernetes.io/envoy=disabled.
func optedOut(ns *corev1.Namespace) bool {
	return ns.Labels[envoy.NamespaceLabel] == envoy.NamespaceLabelDisabled
}

// excluded says why the initializer leaves the Deployments of namespace
// alone, or returns "". kube-system and the operator's namespace hold what
// the cluster and netop need to run; a namespace labelled
// initializer.kubernetes.io/envoy=disabled was opted out by whoever may
// label namespaces.
func (c *Controller) excluded(namespace string) (string, error) {
	if namespace == metav1.NamespaceSystem || namespace == c.operatorNamespace {
		return "namespace " + namespace + " is never initialized", nil
	}
	ns, err := c.namespaces.Get(namespace)
	if err != nil {
		// Not in the cache yet: retried, never patched unseen. %v, not
		// %w: the runner would take the namespace's NotFound for the
		// Deployment's and not retry.
		return "", fmt.Errorf("namespace %s: %v", namespace, err)
	}
	if optedOut(ns) {
		return fmt.Sprintf("namespace %s is labelled %s=%s", namespace, envoy.NamespaceLabel, envoy.NamespaceLabelDisabled), nil
	}
	return "", nil
}

// relevant: asked for the sidecar, or carries one to take out.
func relevant(d *appsv1.Deployment) bool {
	return d.Annotations[envoy.OptIn] == "true" || d.Spec.Template.Annotations[envoy.Injected] != ""
}

func (c *Controller) enqueueDeployment(obj any) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok || !relevant(d) || d.Namespace == metav1.NamespaceSystem || d.Namespace == c.operatorNamespace {
		return
	}
	c.Enqueue(d)
}

// enqueueNamespace re-checks the Deployments of a namespace.
func (c *Controller) enqueueNamespace(namespace string) {
	ds, err := c.deployments.Deployments(namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, d := range ds {
		c.enqueueDeployment(d)
	}
}

// enqueueForTemplate re-checks the Deployments a template serves: those in
// its namespace, or everywhere for the operator namespace's template.
func (c *Controller) enqueueForTemplate(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || cm.Name != envoy.ConfigMapName {
		return
	}
	if cm.Namespace != c.operatorNamespace {
		c.enqueueNamespace(cm.Namespace)
		return
	}
	ds, err := c.deployments.List(labels.Everything())
	if err != nil {
		return
	}
	for _, d := range ds {
		c.enqueueDeployment(d)
	}
}

// sync brings one Deployment's pod template in line with its annotation
// and the current template.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	cached, err := c.deployments.Deployments(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("deployment", klog.KObj(cached))
	if why, err := c.excluded(cached.Namespace); err != nil || why != "" {
		if why != "" {
			logger.V(2).Info("Left alone", "reason", why)
		}
		return err
	}
	d := cached.DeepCopy()
	injected := d.Spec.Template.Annotations[envoy.Injected]

	var tmpl *envoy.Template
	if d.Annotations[envoy.OptIn] == "true" {
		var cm *corev1.ConfigMap
		tmpl, cm, err = c.finder.Find(d.Namespace)
		if err != nil {
			// A broken template, or one the template policy refuses: not
			// retried, since a fixed or allowed template is a new event.
			c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonInvalidTemplate, "Envoy sidecar not injected: %v", err)
			if cm != nil {
				c.recorder.Eventf(cm, corev1.EventTypeWarning, ReasonInvalidTemplate, "Deployment %s/%s not initialized: %v", d.Namespace, d.Name, err)
			}
			return nil
		}
		// A hostNetwork template with a sidecar (injected before it became
		// one) goes on, to have the sidecar taken out.
		if tmpl == nil || tmpl.Hash == injected && !d.Spec.Template.Spec.HostNetwork {
			return nil
		}
	} else if injected == "" {
		return nil
	}

	original, err := json.Marshal(d)
	if err != nil {
		return err
	}
	modified := original
	if injected != "" {
		removal, err := envoy.RemovalPatch(d.Spec.Template.Annotations, "spec", "template")
		if err != nil {
			return err
		}
		if modified, err = envoy.Merge(modified, appsv1.Deployment{}, removal); err != nil {
			return err
		}
	}
	if tmpl != nil {
		stripped := &appsv1.Deployment{}
		if err := json.Unmarshal(modified, stripped); err != nil {
			return err
		}
		if clash := tmpl.Clash(&stripped.Spec.Template.Spec); clash != "" {
			// Merging by name would take over the workload's own container
			// or volume, and removing the sidecar later would delete it.
			c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonNameConflict, "Envoy sidecar not injected: %s", clash)
			return nil
		}
		// The same skips as for pods: a sidecar here would leave the
		// Deployment unable to create pods, or one container unable to bind.
		skip := tmpl.PortClash(&stripped.Spec.Template.Spec)
		if stripped.Spec.Template.Spec.HostNetwork {
			skip = envoy.HostNetworkSkip
		}
		if skip != "" {
			c.recorder.Eventf(d, corev1.EventTypeWarning, ReasonSkipped, "Envoy sidecar not injected: %s", skip)
			logger.Info("Envoy sidecar not injected", "reason", skip)
			if injected == "" {
				return nil
			}
			tmpl = nil // take out what an earlier injection added
		}
	}
	if tmpl != nil {
		stripped := &appsv1.Deployment{}
		if err := json.Unmarshal(modified, stripped); err != nil {
			return err
		}
		add, err := tmpl.Patch(&stripped.Spec.Template.Spec, "spec", "template")
		if err != nil {
			return err
		}
		if modified, err = envoy.Merge(modified, appsv1.Deployment{}, add); err != nil {
			return err
		}
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(original, modified, appsv1.Deployment{})
	if err != nil {
		return fmt.Errorf("computing the patch: %w", err)
	}
	if _, err := c.kube.AppsV1().Deployments(d.Namespace).Patch(ctx, d.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching deployment: %w", err)
	}
	switch {
	case tmpl == nil:
		c.recorder.Event(d, corev1.EventTypeNormal, ReasonRemoved, "Removed the envoy sidecar")
		logger.Info("Removed the envoy sidecar")
	case injected == "":
		c.recorder.Eventf(d, corev1.EventTypeNormal, ReasonInjected, "Injected the envoy sidecar from %s", tmpl.Source)
		logger.Info("Injected the envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	default:
		c.recorder.Eventf(d, corev1.EventTypeNormal, ReasonUpdated, "Updated the envoy sidecar from %s", tmpl.Source)
		logger.Info("Updated the envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	}
	return nil
}
