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

// Issues 35 and 36: a node's agent writes the network-status of its own
// node's pods (once it attached them for the CNI plugin, or hot-plugged
// them) and the acknowledgement of interfaces it took down, and nothing
// else of them: not another node's pods, not another annotation (the
// allocations least of all), not the pod's status.
func TestAgentWritesOnlyHotPlugStatus(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	ctx := t.Context()
	ns := env.Namespace(t)
	mine, theirs := podsOfTwoNodes(t, env, ns, nil)
	agent := onNodeA(env, "netop-agent")
	patchBody := func(p *corev1.Pod, body map[string]any) error {
		data, _ := json.Marshal(body)
		_, err := agent.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, data, metav1.PatchOptions{}, "status")
		return err
	}
	patch := func(p *corev1.Pod, kv ...string) error {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return patchBody(p, map[string]any{"metadata": map[string]any{"annotations": m}})
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
		{"the pod's phase", nil, "may change only these annotations of a pod"},
	} {
		err := patch(mine, c.kv...)
		if c.kv == nil {
			err = patchBody(mine, map[string]any{"status": map[string]any{"phase": "Failed"}})
		}
		saysWhy := slices.ContainsFunc(strings.Split(c.want, "|"), func(want string) bool { return strings.Contains(fmt.Sprint(err), want) })
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !saysWhy {
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
