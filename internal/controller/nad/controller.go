// Package nad keeps, in clusters that run Multus, one
// NetworkAttachmentDefinition (k8s.cni.cncf.io/v1) per Network: the same
// name and namespace, owned by the Network (so the garbage collector
// removes it with the Network), its CNI configuration naming netop's
// plugin as the delegate for that Network. Multus then attaches pods that
// declare the Network with no change on its side.
//
// netop has no Go types for NetworkAttachmentDefinitions (their client
// module is not one netop depends on): it reads and writes them with the
// dynamic client, as unstructured objects.
package nad

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/metrics"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v2"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// Name is the controller's name in logs and metrics.
const Name = "networkattachmentdefinition"

// Resource is the NetworkAttachmentDefinitions' resource.
var Resource = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}

// Kind is their kind.
const Kind = "NetworkAttachmentDefinition"

// fieldManager owns what netop applies.
const fieldManager = "netop"

// ReasonConflict is the Event on a Network whose name a
// NetworkAttachmentDefinition netop does not own already has.
const ReasonConflict = "NetworkAttachmentDefinitionConflict"

// Installed reports whether the cluster serves NetworkAttachmentDefinitions.
func Installed(d discovery.DiscoveryInterface) (bool, error) { return kubeclient.Serves(d, Resource) }

// Options configure the plugin configuration written into each definition:
// where netop's node side serves the plugin and keeps its records on the
// nodes.
type Options struct {
	Workers int
	// Socket is the path, on the nodes, of the node side's socket.
	Socket string
	// DataDir is the path, on the nodes, of the plugin's records.
	DataDir string
}

// Controller keeps the definitions.
type Controller struct {
	*runner.Controller
	dynamic  dynamic.Interface
	networks samplecrdlisters.NetworkLister
	nads     cache.GenericLister
	recorder record.EventRecorder
	opts     Options
}

// New makes the controller on the Networks' informer and the definitions'
// (a dynamic informer of Resource); call it before the informers start.
func New(ctx context.Context, dyn dynamic.Interface, networks samplecrdinformers.NetworkInformer, nads kubeinformers.GenericInformer,
	recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	c := &Controller{dynamic: dyn, networks: networks.Lister(), nads: nads.Lister(), recorder: recorder, opts: o}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: Name, Workers: o.Workers, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	networksHandled, err := networks.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.Enqueue,
		UpdateFunc: func(_, newObj any) { c.Enqueue(newObj) },
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Network event handler: %w", err)
	}
	// A definition changed or deleted by someone else is put back; the
	// Network of the same name is its owner.
	nadsHandled, err := nads.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, newObj any) { c.Enqueue(newObj) },
		DeleteFunc: c.Enqueue,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding %s event handler: %w", Kind, err)
	}
	c.WaitFor(networksHandled.HasSyncedChecker(), nadsHandled.HasSyncedChecker())
	return c, nil
}

// sync makes the Network's definition what it should be.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	n, err := c.networks.Networks(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		return nil // the garbage collector removes its definition
	}
	if err != nil {
		return err
	}
	if n.DeletionTimestamp != nil {
		return nil
	}
	want, err := c.desired(n)
	if err != nil {
		return err
	}
	obj, err := c.nads.ByNamespace(n.Namespace).Get(n.Name)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	default:
		have, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return fmt.Errorf("%s %s: unexpected %T in the cache", Kind, name, obj)
		}
		if !ownedBy(have, n) {
			c.recorder.Eventf(n, corev1.EventTypeWarning, ReasonConflict,
				"%s %s exists and is not this Network's: netop leaves it alone, and Multus pods asking for %s get what it says", Kind, n.Name, n.Name)
			return nil
		}
		if configOf(have) == configOf(want) {
			return nil
		}
	}
	if _, err := c.dynamic.Resource(Resource).Namespace(n.Namespace).Apply(ctx, n.Name, want,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
		return fmt.Errorf("applying %s: %w", Kind, err)
	}
	klog.FromContext(ctx).V(1).Info("Applied NetworkAttachmentDefinition", "network", klog.KObj(n))
	return nil
}

// desired is the Network's definition.
func (c *Controller) desired(n *samplecrdv2.Network) (*unstructured.Unstructured, error) {
	conf := cniapi.Config{Socket: c.opts.Socket, DataDir: c.opts.DataDir, Network: n.Namespace + "/" + n.Name}
	conf.CNIVersion, conf.Name, conf.Type = "1.0.0", n.Name, cniapi.Type
	config, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Resource.GroupVersion().String(),
		"kind":       Kind,
		"metadata": map[string]any{
			"name":      n.Name,
			"namespace": n.Namespace,
			"labels":    map[string]any{"app.kubernetes.io/managed-by": "netop"},
		},
		"spec": map[string]any{"config": string(config)},
	}}
	u.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(n, samplecrdv1.SchemeGroupVersion.WithKind("Network"))})
	return u, nil
}

func configOf(u *unstructured.Unstructured) string {
	config, _, _ := unstructured.NestedString(u.Object, "spec", "config")
	return config
}

func ownedBy(u *unstructured.Unstructured, n *samplecrdv2.Network) bool {
	return slices.ContainsFunc(u.GetOwnerReferences(), func(r metav1.OwnerReference) bool { return r.UID == n.UID })
}
