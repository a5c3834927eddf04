package envoy

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// PrivilegedNamespaces is the annotation on the envoy-initializer ConfigMap
// in the operator's namespace that lets the templates of the namespaces it
// lists (comma-separated, or "*" for all) do what the template policy
// refuses.
const PrivilegedNamespaces = "initializer.kubernetes.io/envoy-privileged-namespaces"

// The template policy.
//
// Anyone who may write a ConfigMap in a namespace may write that
// namespace's envoy-initializer, and netop then puts what it says into
// every opted-in pod there, pods that other people create with their own
// service accounts, and into annotated Deployments with netop's service
// account. So a template from a workload's own namespace may not make
// what would escape the pod: it is held to the Pod Security Standards'
// "baseline" profile, for the parts of a pod a template can hold.
//
// A template has containers and volumes only (Parse refuses every other
// key), so the pod-level controls of that profile (hostNetwork, hostPID,
// hostIPC, sysctls, the pod's securityContext) cannot come from it: they
// stay whatever the pod's creator wrote. What is refused:
//
//   - containers[].securityContext.privileged: true;
//   - containers[].securityContext.capabilities.add: any capability (the
//     runtime's default set is what an ordinary container gets; dropping
//     is fine);
//   - containers[].securityContext.windowsOptions.hostProcess: true;
//   - containers[].securityContext.procMount other than Default;
//   - containers[].securityContext.seccompProfile.type: Unconfined, and
//     appArmorProfile.type: Unconfined;
//   - containers[].securityContext.seLinuxOptions with a user or role, or a
//     type other than the container types baseline allows;
//   - containers[].ports[].hostPort (a port of the node);
//   - volumes[].hostPath (a directory of the node).
//
// Not refused: running as root (runAsUser: 0, runAsNonRoot: false) and
// allowPrivilegeEscalation: true. Baseline allows both: a root process
// without privilege, added capabilities or the node's paths is confined as
// any container is, and both are what an image gets when they are left
// unset, so refusing them when written would stop nothing.
//
// The template in the operator's namespace is trusted (only cluster
// administrators write there) and never checked; its PrivilegedNamespaces
// annotation, or the operator's --allow-privileged-templates flag
// (Finder.AllowPrivileged), lifts the policy for other namespaces.

// baselineSELinuxTypes are the SELinux types the baseline profile allows.
var baselineSELinuxTypes = []string{"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}

// PolicyError is a template from a workload's namespace that the template
// policy refuses. Its message names the ConfigMap, the key and every
// refused field.
type PolicyError struct {
	// ConfigMap is namespace/name of the template.
	ConfigMap string
	// Fields are the refused fields, each "path: why".
	Fields []string
	// OperatorNamespace is where the template that may allow it lives.
	OperatorNamespace string
}

func (e *PolicyError) Error() string {
	where := "an administrator may allow it with --allow-privileged-templates"
	if e.OperatorNamespace != "" {
		namespace, _, _ := strings.Cut(e.ConfigMap, "/")
		where = fmt.Sprintf("an administrator may allow it by listing %s in the annotation %s of %s/%s, or with --allow-privileged-templates",
			namespace, PrivilegedNamespaces, e.OperatorNamespace, ConfigMapName)
	}
	return fmt.Sprintf("ConfigMap %s key %q: %s (a template in the workload's own namespace may not add these; %s)",
		e.ConfigMap, ConfigKey, strings.Join(e.Fields, "; "), where)
}

// violations lists what the template policy refuses in t, each as
// "field path: why".
func (t *Template) violations() []string {
	var out []string
	refuse := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	for i, c := range t.Containers {
		for j, p := range c.Ports {
			if p.HostPort != 0 {
				refuse("containers[%d].ports[%d].hostPort: %d: a port of the node", i, j, p.HostPort)
			}
		}
		sc := c.SecurityContext
		if sc == nil {
			continue
		}
		path := fmt.Sprintf("containers[%d].securityContext", i)
		if sc.Privileged != nil && *sc.Privileged {
			refuse("%s.privileged: true: a privileged container", path)
		}
		if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
			refuse("%s.capabilities.add: %v: added capabilities", path, sc.Capabilities.Add)
		}
		if sc.WindowsOptions != nil && sc.WindowsOptions.HostProcess != nil && *sc.WindowsOptions.HostProcess {
			refuse("%s.windowsOptions.hostProcess: true: a process of the node", path)
		}
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			refuse("%s.procMount: %s: an unmasked /proc", path, *sc.ProcMount)
		}
		if sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
			refuse("%s.seccompProfile.type: Unconfined: no seccomp filter", path)
		}
		if sc.AppArmorProfile != nil && sc.AppArmorProfile.Type == corev1.AppArmorProfileTypeUnconfined {
			refuse("%s.appArmorProfile.type: Unconfined: no AppArmor profile", path)
		}
		if se := sc.SELinuxOptions; se != nil {
			if se.User != "" || se.Role != "" {
				refuse("%s.seLinuxOptions: user %q, role %q: a custom SELinux user or role", path, se.User, se.Role)
			}
			if !slices.Contains(baselineSELinuxTypes, se.Type) {
				refuse("%s.seLinuxOptions.type: %q: an SELinux type other than %s", path, se.Type, strings.Join(baselineSELinuxTypes[1:], ", "))
			}
		}
	}
	for i, v := range t.Volumes {
		if v.HostPath != nil {
			refuse("volumes[%d].hostPath: %q: a directory of the node", i, v.HostPath.Path)
		}
	}
	return out
}

// privilegedNamespaceAllowed reports whether the operator namespace's
// ConfigMap lists namespace (or "*") in its PrivilegedNamespaces
// annotation.
func privilegedNamespaceAllowed(operatorTemplate *corev1.ConfigMap, namespace string) bool {
	if operatorTemplate == nil {
		return false
	}
	for item := range strings.SplitSeq(operatorTemplate.Annotations[PrivilegedNamespaces], ",") {
		if item = strings.TrimSpace(item); item == "*" || item == namespace {
			return true
		}
	}
	return false
}
