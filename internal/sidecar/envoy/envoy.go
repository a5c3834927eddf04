// Package envoy is the Envoy sidecar template of the classic Initializer
// tutorial: the ConfigMap envoy-initializer (key "config": YAML with
// containers and volumes) and how it is merged into a pod spec. The Pod
// webhook and the workload initializer both use it, so that they inject the
// same thing and recognise each other's work.
package envoy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation"
	corelisters "k8s.io/client-go/listers/core/v1"
	"sigs.k8s.io/yaml"
)

// Names of the objects, keys, labels and annotations involved.
const (
	ConfigMapName = "envoy-initializer"
	ConfigKey     = "config"

	// OptIn is the tutorial's annotation: "true" asks for the sidecar,
	// "false" refuses it even in an opted-in namespace.
	OptIn = "initializer.kubernetes.io/envoy"
	// NamespaceLabel "enabled" opts every pod of a namespace in;
	// "disabled" opts the namespace out: its pods are never sent to the
	// Pod webhook, whatever their annotation, and the workload initializer
	// leaves its Deployments as they are.
	NamespaceLabel         = "initializer.kubernetes.io/envoy"
	NamespaceLabelEnabled  = "enabled"
	NamespaceLabelDisabled = "disabled"

	// Injected records the hash of the template that was injected;
	// InjectedContainers and InjectedVolumes what it added, so that it can
	// be taken out again.
	Injected           = "initializer.kubernetes.io/envoy-injected"
	InjectedContainers = "initializer.kubernetes.io/envoy-injected-containers"
	InjectedVolumes    = "initializer.kubernetes.io/envoy-injected-volumes"
	// Skipped says why a pod that asked for the sidecar did not get it.
	Skipped = "initializer.kubernetes.io/envoy-skipped"
)

// Reasons of the Events recorded about injection: ReasonInvalidTemplate on
// a broken template's ConfigMap and on what it could not be injected into;
// the others on the workloads injected into at admission or by the
// workload initializer.
const (
	ReasonInvalidTemplate = "InvalidTemplate"
	ReasonInjected        = "SidecarInjected"
	ReasonUpdated         = "SidecarUpdated"
	ReasonRemoved         = "SidecarRemoved"
	// ReasonSkipped: opted in, but the sidecar cannot work in this pod
	// template (hostNetwork, a port both would use, no template, a template
	// the policy refuses); the message says why.
	ReasonSkipped = "SidecarSkipped"
)

// Template is a parsed envoy-initializer ConfigMap.
type Template struct {
	Containers []corev1.Container `json:"containers"`
	Volumes    []corev1.Volume    `json:"volumes,omitempty"`

	// Source is namespace/name of the ConfigMap.
	Source string `json:"-"`
	// Hash identifies the template's content.
	Hash string `json:"-"`
}

// Parse reads a template from its ConfigMap. Unknown keys and incomplete
// containers are errors, never silently dropped.
func Parse(cm *corev1.ConfigMap) (*Template, error) {
	raw, ok := cm.Data[ConfigKey]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s/%s has no key %q", cm.Namespace, cm.Name, ConfigKey)
	}
	t := &Template{}
	if err := yaml.UnmarshalStrict([]byte(raw), t); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s key %q: %w", cm.Namespace, cm.Name, ConfigKey, err)
	}
	if err := t.validate(); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s key %q: %w", cm.Namespace, cm.Name, ConfigKey, err)
	}
	canonical, _ := json.Marshal(t)
	sum := sha256.Sum256(canonical)
	t.Hash = hex.EncodeToString(sum[:8])
	t.Source = cm.Namespace + "/" + cm.Name
	return t, nil
}

func (t *Template) validate() error {
	if len(t.Containers) == 0 {
		return errors.New("containers: at least one container is required")
	}
	var errs []error
	seen := map[string]bool{}
	for i, c := range t.Containers {
		switch {
		case c.Name == "":
			errs = append(errs, fmt.Errorf("containers[%d].name: required", i))
		case len(validation.IsDNS1123Label(c.Name)) > 0:
			errs = append(errs, fmt.Errorf("containers[%d].name: %q: %s", i, c.Name, strings.Join(validation.IsDNS1123Label(c.Name), "; ")))
		case seen[c.Name]:
			errs = append(errs, fmt.Errorf("containers[%d].name: %q appears twice", i, c.Name))
		}
		seen[c.Name] = true
		if c.Image == "" {
			errs = append(errs, fmt.Errorf("containers[%d].image: required", i))
		}
	}
	seen = map[string]bool{}
	for i, v := range t.Volumes {
		switch {
		case v.Name == "":
			errs = append(errs, fmt.Errorf("volumes[%d].name: required", i))
		case seen[v.Name]:
			errs = append(errs, fmt.Errorf("volumes[%d].name: %q appears twice", i, v.Name))
		}
		seen[v.Name] = true
	}
	return errors.Join(errs...)
}

// Finder finds the template for a workload and applies the template
// policy (see policy.go) to it.
type Finder struct {
	// ConfigMaps needs to hold only the envoy-initializer ConfigMaps.
	ConfigMaps corelisters.ConfigMapLister
	// OperatorNamespace holds the default template, which is trusted.
	OperatorNamespace string
	// AllowPrivileged lifts the template policy for every namespace
	// (--allow-privileged-templates).
	AllowPrivileged bool
}

// Find returns the template for a workload in namespace: the ConfigMap in
// that namespace wins, otherwise the one in the operator's namespace. It
// returns nil and no error when there is none, and the ConfigMap it used or
// failed on. A template from the workload's namespace that the template
// policy refuses is an error of type *PolicyError, unless AllowPrivileged
// is set or the operator namespace's template lists the namespace in its
// PrivilegedNamespaces annotation.
func (f Finder) Find(namespace string) (*Template, *corev1.ConfigMap, error) {
	for _, ns := range []string{namespace, f.OperatorNamespace} {
		if ns == "" {
			continue
		}
		cm, err := f.ConfigMaps.ConfigMaps(ns).Get(ConfigMapName)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		t, err := Parse(cm)
		if err != nil || ns == f.OperatorNamespace || f.AllowPrivileged {
			return t, cm, err
		}
		violations := t.violations()
		if len(violations) == 0 {
			return t, cm, nil
		}
		if f.OperatorNamespace != "" {
			operatorTemplate, err := f.ConfigMaps.ConfigMaps(f.OperatorNamespace).Get(ConfigMapName)
			if err != nil && !apierrors.IsNotFound(err) {
				return nil, cm, err
			}
			if privilegedNamespaceAllowed(operatorTemplate, namespace) {
				return t, cm, nil
			}
		}
		return nil, cm, &PolicyError{ConfigMap: t.Source, Fields: violations, OperatorNamespace: f.OperatorNamespace}
	}
	return nil, nil, nil
}

// NoTemplate says that a workload in namespace has no template to get.
func (f Finder) NoTemplate(namespace string) string {
	return fmt.Sprintf("no ConfigMap %s in namespace %s or %s", ConfigMapName, namespace, f.OperatorNamespace)
}

// AlreadyInjected reports whether a pod spec and its annotations already
// carry this or any template: never inject twice.
func (t *Template) AlreadyInjected(annotations map[string]string, spec *corev1.PodSpec) bool {
	if annotations[Injected] != "" {
		return true
	}
	for _, c := range t.Containers {
		if slices.ContainsFunc(spec.Containers, func(have corev1.Container) bool { return have.Name == c.Name }) {
			return true
		}
	}
	return false
}

// Clash names a container or volume of the template that spec already has
// under the same name, or returns "".
func (t *Template) Clash(spec *corev1.PodSpec) string {
	for _, c := range t.Containers {
		if slices.Contains(containerNames(spec.Containers), c.Name) {
			return fmt.Sprintf("the pod template already has a container %q, which %s also defines", c.Name, t.Source)
		}
	}
	for _, v := range t.Volumes {
		if slices.Contains(volumeNames(spec.Volumes), v.Name) {
			return fmt.Sprintf("the pod template already has a volume %q, which %s also defines", v.Name, t.Source)
		}
	}
	return ""
}

// HostNetworkSkip is why a pod or workload on the node's network gets no
// sidecar: the sidecar's ports would be the node's, and would collide with
// the node's and the application's (a Deployment's new pods could then
// never be created).
const HostNetworkSkip = "hostNetwork pods share the node's network; no sidecar"

// PortClash names a port that a container of the template and a container
// of spec both use, or returns "". The containers of a pod share one
// network namespace, so two containers on one port cannot both bind it; a
// host port used twice is refused by the API server.
func (t *Template) PortClash(spec *corev1.PodSpec) string {
	for _, tc := range t.Containers {
		for _, tp := range tc.Ports {
			for _, pc := range spec.Containers {
				for _, pp := range pc.Ports {
					if protocol(tp) != protocol(pp) {
						continue
					}
					if tp.ContainerPort == pp.ContainerPort {
						return fmt.Sprintf("port %d/%s of container %q from %s is also the port of the pod's container %q; no sidecar", tp.ContainerPort, protocol(tp), tc.Name, t.Source, pc.Name)
					}
					if tp.HostPort != 0 && tp.HostPort == pp.HostPort {
						return fmt.Sprintf("host port %d/%s of container %q from %s is also a host port of the pod's container %q; no sidecar", tp.HostPort, protocol(tp), tc.Name, t.Source, pc.Name)
					}
				}
			}
		}
	}
	return ""
}

func protocol(p corev1.ContainerPort) corev1.Protocol {
	if p.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return p.Protocol
}

// Patch is the strategic merge patch that injects the template into the
// pod template found at path (none for a Pod; "spec", "template" for a
// workload) whose spec is into, recording what was injected in the
// annotations there. The sidecar goes after the pod's own containers, as
// the tutorial shows ([myapp-container envoy]).
func (t *Template) Patch(into *corev1.PodSpec, path ...string) ([]byte, error) {
	containers, volumes := containerNames(t.Containers), volumeNames(t.Volumes)
	spec := map[string]any{
		"containers":                  t.Containers,
		"$setElementOrder/containers": elementOrder(containerNames(into.Containers), containers),
	}
	if len(t.Volumes) > 0 {
		spec["volumes"] = t.Volumes
		spec["$setElementOrder/volumes"] = elementOrder(volumeNames(into.Volumes), volumes)
	}
	podTemplate := map[string]any{
		"metadata": map[string]any{"annotations": t.Annotations()},
		"spec":     spec,
	}
	return json.Marshal(nest(podTemplate, path))
}

// Annotations are what an injection of t records on the pod template.
func (t *Template) Annotations() map[string]string {
	return map[string]string{
		Injected:           t.Hash,
		InjectedContainers: strings.Join(containerNames(t.Containers), ","),
		InjectedVolumes:    strings.Join(volumeNames(t.Volumes), ","),
	}
}

// RemovalPatch is the strategic merge patch that takes out what the
// annotations say was injected into the pod template at path.
func RemovalPatch(annotations map[string]string, path ...string) ([]byte, error) {
	var containers, volumes []map[string]string
	for _, name := range splitList(annotations[InjectedContainers]) {
		containers = append(containers, map[string]string{"name": name, "$patch": "delete"})
	}
	for _, name := range splitList(annotations[InjectedVolumes]) {
		volumes = append(volumes, map[string]string{"name": name, "$patch": "delete"})
	}
	spec := map[string]any{}
	if len(containers) > 0 {
		spec["containers"] = containers
	}
	if len(volumes) > 0 {
		spec["volumes"] = volumes
	}
	podTemplate := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{Injected: nil, InjectedContainers: nil, InjectedVolumes: nil}},
		"spec":     spec,
	}
	return json.Marshal(nest(podTemplate, path))
}

// elementOrder is a $setElementOrder directive: the names the pod has,
// then the added names it does not have yet.
func elementOrder(have, added []string) []map[string]string {
	var order []map[string]string
	for _, name := range append(slices.Clone(have), added...) {
		if !slices.ContainsFunc(order, func(o map[string]string) bool { return o["name"] == name }) {
			order = append(order, map[string]string{"name": name})
		}
	}
	return order
}

func nest(v map[string]any, path []string) map[string]any {
	for i := len(path) - 1; i >= 0; i-- {
		v = map[string]any{path[i]: v}
	}
	return v
}

func containerNames(cs []corev1.Container) []string {
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, c.Name)
	}
	return names
}

func volumeNames(vs []corev1.Volume) []string {
	names := make([]string, 0, len(vs))
	for _, v := range vs {
		names = append(names, v.Name)
	}
	return names
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// Merge applies strategic merge patches to the JSON of an object whose Go
// type is like (corev1.Pod{}, appsv1.Deployment{}): containers and volumes
// merge by name.
func Merge(original []byte, like any, patches ...[]byte) ([]byte, error) {
	merged := original
	for _, p := range patches {
		if len(bytes.TrimSpace(p)) == 0 {
			continue
		}
		var err error
		if merged, err = strategicpatch.StrategicMergePatch(merged, p, like); err != nil {
			return nil, fmt.Errorf("merging the envoy template: %w", err)
		}
	}
	return merged, nil
}
