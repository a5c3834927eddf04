// Package workload is the tutorial's Initializer loop for workloads that
// exist: Deployments, StatefulSets, DaemonSets, ReplicaSets and CronJobs
// annotated initializer.kubernetes.io/envoy: "true" are re-patched when
// the Envoy template changes (a rolling update, by design) and lose what
// was injected when the annotation goes. Injection itself happens at
// admission (package webhook/workloads), so that the first rollout already
// has the sidecar; this loop injects only what admission missed (created
// while the webhook was down, or before netop ran). Their pods carry the
// injection record, so the Pod webhook leaves them alone.
//
// It never touches workloads in kube-system, in the operator's namespace,
// or in a namespace labelled initializer.kubernetes.io/envoy=disabled: it
// patches with netop's service account, so where it may write is decided
// by the cluster's administrators (the namespace label), not by whoever may
// annotate a workload. Nor does it touch workloads made by a controller
// (a Deployment's ReplicaSets, a CronJob's Jobs): their template is their
// owner's. The template a workload gets obeys the template policy of
// envoy.Finder.
package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/sidecar/envoy"
)

// Name is the controller's name in logs; each kind's queue is named
// workload-<kind>.
const Name = "workload"

// Reasons of the Events on workloads and templates.
const (
	ReasonInjected        = envoy.ReasonInjected
	ReasonUpdated         = envoy.ReasonUpdated
	ReasonRemoved         = envoy.ReasonRemoved
	ReasonSkipped         = envoy.ReasonSkipped
	ReasonInvalidTemplate = envoy.ReasonInvalidTemplate
)

// Options configure the controller.
type Options struct {
	// OperatorNamespace holds the default template; its workloads are
	// left alone.
	OperatorNamespace string
	// AllowPrivilegedTemplates lifts the template policy for every
	// namespace (--allow-privileged-templates).
	AllowPrivilegedTemplates bool
	Workers                  int
}

// Controller keeps the Envoy sidecar of workloads in line with their
// annotation and the template: one queue per kind on the shared runner.
type Controller struct {
	namespaces        corelisters.NamespaceLister
	finder            envoy.Finder
	recorder          record.EventRecorder
	operatorNamespace string
	kinds             []*kindController
}

// kindController is the queue and sync of one workload kind.
type kindController struct {
	*runner.Controller
	kind Kind
	c    *Controller
}

// New makes the controller for kinds (see Kinds); call it before the
// informers start. templates needs to hold only the envoy-initializer
// ConfigMaps.
func New(ctx context.Context, kinds []Kind, namespaces coreinformers.NamespaceInformer,
	templates coreinformers.ConfigMapInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	c := &Controller{
		namespaces: namespaces.Lister(),
		finder: envoy.Finder{ConfigMaps: templates.Lister(), OperatorNamespace: o.OperatorNamespace,
			AllowPrivileged: o.AllowPrivilegedTemplates},
		recorder:          recorder,
		operatorNamespace: o.OperatorNamespace,
	}
	logger := klog.FromContext(ctx)
	var synced []cache.DoneChecker
	for _, kind := range kinds {
		k := &kindController{kind: kind, c: c}
		var err error
		if k.Controller, err = runner.New(runner.Options{Name: Name + "-" + strings.ToLower(kind.Name), Workers: o.Workers, Metrics: m}, k.sync); err != nil {
			return nil, err
		}
		handled, err := kind.informer.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
			AddFunc: k.enqueue,
			UpdateFunc: func(oldObj, newObj any) {
				oldMeta, err1 := meta.Accessor(oldObj)
				newMeta, err2 := meta.Accessor(newObj)
				if err1 == nil && err2 == nil && oldMeta.GetResourceVersion() != newMeta.GetResourceVersion() {
					k.enqueue(newObj)
				}
			},
		}, cache.HandlerOptions{Logger: &logger})
		if err != nil {
			return nil, fmt.Errorf("adding %s event handler: %w", kind.Name, err)
		}
		synced = append(synced, handled.HasSyncedChecker())
		c.kinds = append(c.kinds, k)
	}
	templatesHandled, err := templates.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueForTemplate,
		UpdateFunc: func(_, newObj any) { c.enqueueForTemplate(newObj) },
		DeleteFunc: c.enqueueForTemplate,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding ConfigMap event handler: %w", err)
	}
	// A namespace that loses its opt-out label: its workloads are looked
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
	synced = append(synced, templatesHandled.HasSyncedChecker(), namespacesHandled.HasSyncedChecker())
	for _, k := range c.kinds {
		k.WaitFor(synced...)
	}
	return c, nil
}

// Run runs every kind's queue until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.kinds))
	for i, k := range c.kinds {
		wg.Go(func() { errs[i] = k.Run(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Len is the number of workloads waiting, of every kind.
func (c *Controller) Len() int {
	n := 0
	for _, k := range c.kinds {
		n += k.Len()
	}
	return n
}

// optedOut: the namespace is labelled initializer.kubernetes.io/envoy=disabled.
func optedOut(ns *corev1.Namespace) bool {
	return ns.Labels[envoy.NamespaceLabel] == envoy.NamespaceLabelDisabled
}

// excluded says why the initializer leaves the workloads of namespace
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
		// workload's and not retry.
		return "", fmt.Errorf("namespace %s: %v", namespace, err)
	}
	if optedOut(ns) {
		return fmt.Sprintf("namespace %s is labelled %s=%s", namespace, envoy.NamespaceLabel, envoy.NamespaceLabelDisabled), nil
	}
	return "", nil
}

// enqueue queues a workload that asked for the sidecar or carries one to
// take out, unless it is made by a controller or lives where the
// initializer never goes.
func (k *kindController) enqueue(obj any) {
	o, ok := obj.(runtime.Object)
	if !ok {
		return
	}
	m, err := meta.Accessor(o)
	if err != nil || m.GetNamespace() == metav1.NamespaceSystem || m.GetNamespace() == k.c.operatorNamespace ||
		metav1.GetControllerOfNoCopy(m) != nil {
		return
	}
	if m.GetAnnotations()[envoy.OptIn] == "true" || k.kind.template(o).Annotations[envoy.Injected] != "" {
		k.Enqueue(o)
	}
}

// enqueueNamespace re-checks the workloads of a namespace.
func (c *Controller) enqueueNamespace(namespace string) {
	for _, k := range c.kinds {
		objs, err := k.kind.informer.GetIndexer().ByIndex(cache.NamespaceIndex, namespace)
		if err != nil {
			continue
		}
		for _, obj := range objs {
			k.enqueue(obj)
		}
	}
}

// enqueueForTemplate re-checks the workloads a template serves: those in
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
	for _, k := range c.kinds {
		for _, obj := range k.kind.informer.GetStore().List() {
			k.enqueue(obj)
		}
	}
}

// sync brings one workload's pod template in line with its annotation and
// the current template.
func (k *kindController) sync(ctx context.Context, name cache.ObjectName) error {
	obj, exists, err := k.kind.informer.GetIndexer().GetByKey(name.String())
	if err != nil || !exists {
		return err
	}
	w := obj.(runtime.Object).DeepCopyObject()
	m, err := meta.Accessor(w)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues(strings.ToLower(k.kind.Name), klog.KObj(m))
	if metav1.GetControllerOfNoCopy(m) != nil {
		return nil // its template is its owner's
	}
	if why, err := k.c.excluded(m.GetNamespace()); err != nil || why != "" {
		if why != "" {
			logger.V(2).Info("Left alone", "reason", why)
		}
		return err
	}
	injected := k.kind.template(w).Annotations[envoy.Injected]
	tmpl, act := k.wanted(w, m, injected)
	if !act {
		return nil
	}
	original, err := json.Marshal(w)
	if err != nil {
		return err
	}
	modified, skip, err := k.desired(original, w, m, tmpl)
	if err != nil {
		return err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(original, modified, k.kind.newObject())
	if err != nil {
		return fmt.Errorf("computing the patch: %w", err)
	}
	if string(patch) == "{}" {
		return nil
	}
	if err := k.kind.patch(ctx, m.GetNamespace(), m.GetName(), patch); err != nil {
		return fmt.Errorf("patching %s: %w", strings.ToLower(k.kind.Name), err)
	}
	k.recordOutcome(logger, w, injected, tmpl, skip)
	return nil
}

// wanted is the template the workload should carry (nil: none), and
// whether its pod template may need a change at all.
func (k *kindController) wanted(w runtime.Object, m metav1.Object, injected string) (*envoy.Template, bool) {
	if m.GetAnnotations()[envoy.OptIn] != "true" {
		return nil, injected != ""
	}
	tmpl, cm, err := k.c.finder.Find(m.GetNamespace())
	if err != nil {
		// A broken template, or one the template policy refuses: not
		// retried, since a fixed or allowed template is a new event.
		k.c.recorder.Eventf(w, corev1.EventTypeWarning, ReasonInvalidTemplate, "Envoy sidecar not injected: %v", err)
		if cm != nil {
			k.c.recorder.Eventf(cm, corev1.EventTypeWarning, ReasonInvalidTemplate, "%s %s/%s not initialized: %v", k.kind.Name, m.GetNamespace(), m.GetName(), err)
		}
		return nil, false
	}
	// A hostNetwork template with a sidecar (injected before it became
	// one) goes on, to have the sidecar taken out.
	if tmpl == nil || tmpl.Hash == injected && !k.kind.template(w).Spec.HostNetwork {
		return nil, false
	}
	return tmpl, true
}

// desired is the workload (original, as JSON) with its sidecar taken out
// and tmpl's put in, unless skipped (skip says why), and the skip reason
// recorded on the workload.
func (k *kindController) desired(original []byte, w runtime.Object, m metav1.Object, tmpl *envoy.Template) (modified []byte, skip string, err error) {
	modified = original
	podTemplate := k.kind.template(w)
	if podTemplate.Annotations[envoy.Injected] != "" {
		removal, err := envoy.RemovalPatch(podTemplate.Annotations, k.kind.path...)
		if err != nil {
			return nil, "", err
		}
		if modified, err = envoy.Merge(modified, k.kind.newObject(), removal); err != nil {
			return nil, "", err
		}
	}
	if tmpl != nil {
		if modified, skip, err = k.inject(modified, tmpl); err != nil {
			return nil, "", err
		}
	}
	// The skip reason lives on the workload itself, as admission leaves
	// it, and says it once: the Event is recorded only when the reason
	// changes, not on every status update of the workload.
	annotations := map[string]any{}
	switch had := m.GetAnnotations()[envoy.Skipped]; {
	case skip != "" && had != skip:
		annotations[envoy.Skipped] = skip
	case skip == "" && tmpl != nil && had != "":
		annotations[envoy.Skipped] = nil
	}
	if len(annotations) > 0 {
		set, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		if err != nil {
			return nil, "", err
		}
		if modified, err = envoy.Merge(modified, k.kind.newObject(), set); err != nil {
			return nil, "", err
		}
	}
	return modified, skip, nil
}

// inject merges tmpl into the workload stripped of its sidecar, unless
// it would clash (skip says why).
func (k *kindController) inject(stripped []byte, tmpl *envoy.Template) (modified []byte, skip string, err error) {
	obj := k.kind.newObject()
	if err := json.Unmarshal(stripped, obj); err != nil {
		return nil, "", err
	}
	spec := &k.kind.template(obj).Spec
	// The same skips as at admission: a sidecar here would take over
	// the workload's own container or volume (and removing it later
	// would delete that), leave the workload unable to create pods,
	// or one container unable to bind.
	skip = tmpl.Clash(spec)
	if skip == "" {
		skip = tmpl.PortClash(spec)
	}
	if spec.HostNetwork {
		skip = envoy.HostNetworkSkip
	}
	if skip != "" {
		return stripped, skip, nil
	}
	add, err := tmpl.Patch(spec, k.kind.path...)
	if err != nil {
		return nil, "", err
	}
	modified, err = envoy.Merge(stripped, k.kind.newObject(), add)
	return modified, "", err
}

// recordOutcome says what a patch of the workload did, in Events and the
// log.
func (k *kindController) recordOutcome(logger klog.Logger, w runtime.Object, injected string, tmpl *envoy.Template, skip string) {
	if skip != "" {
		k.c.recorder.Eventf(w, corev1.EventTypeWarning, ReasonSkipped, "Envoy sidecar not injected: %s", skip)
		logger.Info("Envoy sidecar not injected", "reason", skip)
	}
	switch {
	case injected != "" && (tmpl == nil || skip != ""):
		k.c.recorder.Event(w, corev1.EventTypeNormal, ReasonRemoved, "Removed the envoy sidecar")
		logger.Info("Removed the envoy sidecar")
	case skip != "" || tmpl == nil:
	case injected == "":
		k.c.recorder.Eventf(w, corev1.EventTypeNormal, ReasonInjected, "Injected the envoy sidecar from %s", tmpl.Source)
		logger.Info("Injected the envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	default:
		k.c.recorder.Eventf(w, corev1.EventTypeNormal, ReasonUpdated, "Updated the envoy sidecar from %s", tmpl.Source)
		logger.Info("Updated the envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	}
}
