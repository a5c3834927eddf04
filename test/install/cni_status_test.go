package install

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// Issue 35: the CNI plugin's identity, whose token lies on every host,
// writes the network-status of its own node's pods through pods/status,
// and nothing else there: not another node's pods, not another annotation
// (the allocations least of all), not the pod's status.
func TestCNIWritesOnlyNetworkStatus(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	ctx := t.Context()
	ns := env.Namespace(t)
	mine, theirs := podsOfTwoNodes(t, env, ns, map[string]string{"team": "x"})
	plugin := onNodeA(env, "netop-cni")
	patch := func(p *corev1.Pod, body map[string]any) error {
		data, _ := json.Marshal(body)
		_, err := plugin.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, data, metav1.PatchOptions{}, "status")
		return err
	}
	annotations := func(kv ...string) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return map[string]any{"metadata": map[string]any{"annotations": m}}
	}
	status := `[{"name":"netop-pods","interface":"eth0","ips":["10.88.0.5"],"mac":"0a:58:0a:58:00:05","default":true,"dns":{}}]`
	// The policy takes a moment to be enforced once created: until then,
	// no error, or the authorizer's while it catches up.
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		err := patch(theirs, annotations(netselect.StatusAnnotation, status))
		return err != nil && strings.Contains(err.Error(), "may write the network-status only of pods on that node"),
			fmt.Sprintf("writing another node's pod's network-status: %v", err)
	})
	if err := patch(mine, annotations(netselect.StatusAnnotation, status)); err != nil {
		t.Fatalf("the plugin of node-a writing its pod's network-status: %v", err)
	}
	for _, c := range []struct {
		what string
		pod  *corev1.Pod
		body map[string]any
		want string
	}{
		{"another node's pod", theirs, annotations(netselect.StatusAnnotation, status), "the CNI plugin and the agent of node node-a may write the network-status only of pods on that node"},
		// Only agents acknowledge an interface down (hot-plug).
		{"the acknowledgement", mine, annotations(netselect.DetachedAnnotation, "net1/x"), "may change only these annotations of a pod|only netop writes the annotation networks.netop.dev/detached"},
		{"another annotation", mine, annotations("team", "y"), "may change only these annotations of a pod: k8s.v1.cni.cncf.io/network-status"},
		// Two policies refuse it; the API server reports whichever it
		// evaluated first.
		{"the allocations", mine, annotations(netselect.AllocationsAnnotation, "[]"), "may change only these annotations of a pod|only netop writes the annotation networks.netop.dev/allocations"},
		{"the pod's phase", mine, map[string]any{"status": map[string]any{"phase": "Failed"}}, "may change only these annotations of a pod"},
	} {
		err := patch(c.pod, c.body)
		saysWhy := slices.ContainsFunc(strings.Split(c.want, "|"), func(want string) bool { return strings.Contains(fmt.Sprint(err), want) })
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !saysWhy {
			t.Errorf("the plugin writing %s: %v, want refused with %q", c.what, err, c.want)
		}
	}
	got, err := env.Kube.CoreV1().Pods(ns).Get(ctx, "mine", metav1.GetOptions{})
	if err != nil || got.Annotations[netselect.StatusAnnotation] != status || got.Annotations["team"] != "x" || got.Status.Phase == corev1.PodFailed {
		t.Errorf("the pod after the plugin's writes: annotations %v, phase %s (%v)", got.Annotations, got.Status.Phase, err)
	}
}

// Issue 36: a node's agent writes, for hot-plug, the network-status of its
// own node's pods and the acknowledgement of interfaces it took down, and
// nothing else of them.
func TestAgentWritesOnlyHotPlugStatus(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	ctx := t.Context()
	ns := env.Namespace(t)
	mine, theirs := podsOfTwoNodes(t, env, ns, nil)
	agent := onNodeA(env, "netop-agent")
	patch := func(p *corev1.Pod, kv ...string) error {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": m}})
		_, err := agent.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, data, metav1.PatchOptions{}, "status")
		return err
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		err := patch(theirs, netselect.DetachedAnnotation, "net2/x")
		return err != nil && strings.Contains(err.Error(), "may write the network-status only of pods on that node"),
			fmt.Sprintf("the agent of node-a acknowledging on node-b's pod: %v", err)
	})
	if err := patch(mine, netselect.StatusAnnotation, "[]", netselect.DetachedAnnotation, "net2/x"); err != nil {
		t.Fatalf("the agent of node-a writing its pod's network-status and acknowledgement: %v", err)
	}
	for _, c := range []struct {
		what string
		kv   []string
		want string
	}{
		{"the allocations", []string{netselect.AllocationsAnnotation, "[]"}, "may change only these annotations of a pod|only netop writes the annotation networks.netop.dev/allocations"},
		{"another annotation", []string{"team", "y"}, "may change only these annotations of a pod: k8s.v1.cni.cncf.io/network-status, networks.netop.dev/detached"},
	} {
		err := patch(mine, c.kv...)
		saysWhy := slices.ContainsFunc(strings.Split(c.want, "|"), func(want string) bool { return strings.Contains(fmt.Sprint(err), want) })
		if !apierrors.IsForbidden(err) || !saysWhy {
			t.Errorf("the agent writing %s: %v, want refused with %q", c.what, err, c.want)
		}
	}
}

// podsOfTwoNodes makes the pods mine, on node-a, and theirs, on node-b,
// annotated with annotations.
func podsOfTwoNodes(t *testing.T, env *testenv.Env, ns string, annotations map[string]string) (mine, theirs *corev1.Pod) {
	t.Helper()
	pod := func(name, node string) *corev1.Pod {
		p, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return pod("mine", "node-a"), pod("theirs", "node-b")
}

// onNodeA is a client of the service account of operatorNamespace, with a
// token bound to a pod on node-a.
func onNodeA(env *testenv.Env, serviceAccount string) kubernetes.Interface {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + operatorNamespace + ":" + serviceAccount, Groups: serviceAccountGroups,
		Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"node-a"}}}
	return kubernetes.NewForConfigOrDie(cfg)
}
