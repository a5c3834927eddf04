package install

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// Issue 33: a pod cannot be given addresses by anyone but netop. A user
// who may create and update pods in their namespace is refused, by the API
// server itself (netop's ValidatingAdmissionPolicy), a pod that carries
// allocations or a refusal of its own making, and an update that adds or
// changes them, through the pod, its status or its binding; their ordinary pods are
// admitted, and netop's controller may write them.
func TestOnlyNetopWritesAllocations(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	ctx := t.Context()
	ns := env.Namespace(t)
	if _, err := env.Kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := func(user string, groups ...string) kubernetes.Interface {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	mallory := as("mallory")
	forged := `[{"network":"` + ns + `/any","networkUID":"00000000-0000-0000-0000-000000000000","interface":"net1","ips":["10.0.0.1/24"],"mac":"0a:58:0a:00:00:01"}]`
	pod := func(name string, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	refused := func(what string, err error, annotation string) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "only netop writes the annotation "+annotation+" of a pod") {
			t.Errorf("%s: %v, want refused naming %s", what, err, annotation)
		}
	}
	// The policy takes a moment to be enforced once created, and the
	// RoleBinding to be seen by the authorizer: until both, another
	// error (mallory may not create pods at all) or none.
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := mallory.CoreV1().Pods(ns).Create(ctx, pod("forged", map[string]string{netselect.AllocationsAnnotation: forged}),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "only netop writes the annotation"), fmt.Sprintf("a pod with forged allocations: %v", err)
	})
	_, err := mallory.CoreV1().Pods(ns).Create(ctx, pod("forged", map[string]string{netselect.AllocationsAnnotation: forged}), metav1.CreateOptions{})
	refused("creating a pod with allocations", err, netselect.AllocationsAnnotation)
	_, err = mallory.CoreV1().Pods(ns).Create(ctx, pod("refusal", map[string]string{netselect.RefusedAnnotation: "none"}), metav1.CreateOptions{})
	refused("creating a pod with a refusal", err, netselect.RefusedAnnotation)

	own, err := mallory.CoreV1().Pods(ns).Create(ctx, pod("own", map[string]string{"team": "x"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("an ordinary pod: %v", err)
	}
	// A patch, not an update: others (the scheduler) change a new pod too.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{netselect.AllocationsAnnotation: forged}}})
	_, err = mallory.CoreV1().Pods(ns).Patch(ctx, own.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	refused("adding allocations to a pod", err, netselect.AllocationsAnnotation)

	// Nor through the pod's status, for whoever may write it (kubelets).
	grant(t, env, ns, "pod-status", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}}, "mallory")
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := mallory.CoreV1().Pods(ns).Patch(ctx, own.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		return err != nil && !apierrors.IsForbidden(err) || err != nil && strings.Contains(err.Error(), "only netop writes"), fmt.Sprintf("adding allocations through the pod's status: %v", err)
	})
	_, err = mallory.CoreV1().Pods(ns).Patch(ctx, own.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	refused("adding allocations through the pod's status", err, netselect.AllocationsAnnotation)

	// Nor through its binding, for whoever may bind pods (a second
	// scheduler): the API server copies a Binding's annotations onto the
	// pod. The pod names a scheduler that does not run, so that only the
	// test binds it.
	grant(t, env, ns, "pod-binding", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}}, "mallory")
	unbound := pod("unbound", nil)
	unbound.Spec.SchedulerName = "nobody"
	if _, err := mallory.CoreV1().Pods(ns).Create(ctx, unbound, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: unbound.Name, Annotations: map[string]string{netselect.AllocationsAnnotation: forged}},
		Target: corev1.ObjectReference{Kind: "Node", Name: "any-node"}}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		err := mallory.CoreV1().Pods(ns).Bind(ctx, binding, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return !apierrors.IsForbidden(err) || strings.Contains(err.Error(), "only netop writes"), fmt.Sprintf("binding a pod with allocations: %v", err)
	})
	err = mallory.CoreV1().Pods(ns).Bind(ctx, binding, metav1.CreateOptions{})
	refused("binding a pod with allocations", err, netselect.AllocationsAnnotation)
	// The older bindings resource binds the same way.
	grant(t, env, ns, "bindings", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"bindings"}, Verbs: []string{"create"}}, "mallory")
	legacyBind := func(ctx context.Context, dryRun bool) error {
		req := mallory.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").Body(binding)
		if dryRun {
			req = req.Param("dryRun", metav1.DryRunAll)
		}
		return req.Do(ctx).Error()
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		err := legacyBind(ctx, true)
		return !apierrors.IsForbidden(err) || strings.Contains(err.Error(), "only netop writes"), fmt.Sprintf("binding a pod with allocations through bindings: %v", err)
	})
	refused("binding a pod with allocations through bindings", legacyBind(ctx, false), netselect.AllocationsAnnotation)
	// Nor wipe them: an empty annotation on a Binding is set on the pod.
	binding.Annotations[netselect.AllocationsAnnotation] = ""
	err = mallory.CoreV1().Pods(ns).Bind(ctx, binding, metav1.CreateOptions{})
	refused("binding a pod with empty allocations", err, netselect.AllocationsAnnotation)
	if got, err := env.Kube.CoreV1().Pods(ns).Get(ctx, unbound.Name, metav1.GetOptions{}); err != nil || got.Annotations[netselect.AllocationsAnnotation] != "" {
		t.Errorf("the pod after the refused binding: %v, annotations %v; want none", err, got.GetAnnotations())
	}

	// netop's controller writes them, as it does: a merge patch.
	controller := as("system:serviceaccount:"+operatorNamespace+":netop", serviceAccountGroups...)
	if _, err := controller.CoreV1().Pods(ns).Patch(ctx, own.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("netop's controller writing allocations: %v", err)
	}
}

// grant gives user the rule in namespace ns, through a Role and a
// RoleBinding named name.
func grant(t *testing.T, env *testenv.Env, ns, name string, rule rbacv1.PolicyRule, user string) {
	t.Helper()
	if _, err := env.Kube.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Kube.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
