package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// labelNamespace sets the labels of namespace ns.
func labelNamespace(t *testing.T, env *testenv.Env, ns string, labels map[string]string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if _, err := env.Kube.CoreV1().Namespaces().Patch(t.Context(), ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// setSelector sets the namespace selector of a v2 Network.
func setSelector(t *testing.T, env *testenv.Env, ns, name string, selector *metav1.LabelSelector) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := env.Netop.SamplecrdV2().Networks(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.NamespaceSelector = selector
		_, err = env.Netop.SamplecrdV2().Networks(ns).Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// networkPod is a pod in ns that asks for networks.
func networkPod(ns, name, networks string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{netselect.NetworksAnnotation: networks}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

// requireRefused creates obj with create and wants it refused with a
// message containing each of wants.
func requireRefused(t *testing.T, what string, create func(context.Context) error, wants ...string) {
	t.Helper()
	err := create(t.Context())
	if err == nil {
		t.Fatalf("%s: admitted, want refused with %q", what, wants)
	}
	for _, want := range wants {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: refused with %q, want it to say %q", what, err, want)
		}
	}
}

// eventuallyAdmitted creates a pod once the webhook's caches admit it.
func eventuallyAdmitted(t *testing.T, env *testenv.Env, pod *corev1.Pod) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := env.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err)
	})
}

// waitAllocated waits until the pod holds an address of network.
func waitAllocated(t *testing.T, env *testenv.Env, ns, name, network string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		p, err := env.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		have, _ := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
		return len(have) == 1 && have[0].Network == network, fmt.Sprintf("pod %s/%s: allocations %v", ns, name, have)
	})
}

// A Network admits pods of its own namespace; pods of others only where
// its spec.namespaceSelector selects their namespace, refused at
// admission otherwise, naming the pod's namespace, the Network and why.
// Workload templates are refused the same way. A namespace relabelled
// under a running pod keeps it, and the Network's status says so.
func TestWhoMayJoinANetwork(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	tenantA, tenantB, tenantC := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	labelNamespace(t, env, tenantB, map[string]string{"team": "b"})
	labelNamespace(t, env, tenantC, map[string]string{"team": "c"})
	network := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: tenantA, Name: "neta"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.171.0.0/24"}}}
	if _, err := env.Netop.SamplecrdV2().Networks(tenantA).Create(ctx, network, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	neta := tenantA + "/neta"
	pods := func(ns string) func(context.Context, *corev1.Pod) error {
		return func(ctx context.Context, p *corev1.Pod) error {
			_, err := env.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		}
	}

	// Its own namespace joins, by name alone.
	eventuallyAdmitted(t, env, networkPod(tenantA, "own", "neta"))
	waitAllocated(t, env, tenantA, "own", neta)

	// Another namespace is refused: the Network has no selector.
	foreign := networkPod(tenantB, "foreign", neta)
	requireRefused(t, "a pod of another namespace", func(ctx context.Context) error { return pods(tenantB)(ctx, foreign) },
		"pod "+tenantB+"/foreign", netselect.NetworksAnnotation,
		"pods of namespace "+tenantB+" may not join Network "+neta+": the Network admits pods of its own namespace only")
	// A Network of another namespace that does not exist is refused too.
	requireRefused(t, "a pod naming a missing Network", func(ctx context.Context) error {
		return pods(tenantB)(ctx, networkPod(tenantB, "missing", tenantA+"/nope"))
	}, "may not join Network "+tenantA+"/nope: the Network does not exist")
	// One of its own namespace that does not exist yet is a warning: the
	// pod waits for it (a directory applied in any order).
	if _, err := env.Kube.CoreV1().Pods(tenantB).Create(ctx, networkPod(tenantB, "early", "later"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a pod naming a Network of its own namespace not made yet: %v", err)
	}

	// Workload templates are refused alike, with the template's path.
	deployment := annotatedDeployment("web", 1, corev1.Container{Name: "c", Image: "busybox"})
	deployment.Annotations = nil
	deployment.Spec.Template.Annotations = map[string]string{netselect.NetworksAnnotation: neta}
	requireRefused(t, "a Deployment of another namespace", func(ctx context.Context) error {
		_, err := env.Kube.AppsV1().Deployments(tenantC).Create(ctx, deployment, metav1.CreateOptions{})
		return err
	}, "Deployment "+tenantC+"/web", "spec.template.metadata.annotations["+netselect.NetworksAnnotation+"]", "may not join Network "+neta)
	cronJob := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly"}, Spec: batchv1.CronJobSpec{Schedule: "0 0 * * *",
		JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{netselect.NetworksAnnotation: neta}},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}}}}}
	requireRefused(t, "a CronJob of another namespace", func(ctx context.Context) error {
		_, err := env.Kube.BatchV1().CronJobs(tenantC).Create(ctx, cronJob, metav1.CreateOptions{})
		return err
	}, "CronJob "+tenantC+"/nightly", "spec.jobTemplate.spec.template.metadata.annotations", "may not join Network "+neta)

	// The Network selects team=b: tenant-b's pod is admitted and joins;
	// tenant-c's is refused, the message saying the selector.
	setSelector(t, env, tenantA, "neta", &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}})
	eventuallyAdmitted(t, env, foreign)
	waitAllocated(t, env, tenantB, "foreign", neta)
	requireRefused(t, "a pod of a namespace the selector does not select", func(ctx context.Context) error {
		return pods(tenantC)(ctx, networkPod(tenantC, "unselected", neta))
	}, "pods of namespace "+tenantC+" may not join Network "+neta+": its spec.namespaceSelector (team=b) does not select the namespace")
	if _, err := env.Kube.AppsV1().Deployments(tenantB).Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a Deployment of a selected namespace: %v", err)
	}

	// tenant-b relabelled: its running pod keeps its address, and the
	// Network says so in status and an Event; no new pod of it joins.
	labelNamespace(t, env, tenantB, map[string]string{"team": "x"})
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Netop.SamplecrdV2().Networks(tenantA).Get(ctx, "neta", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionPodsAdmitted)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == samplecrd.ReasonPodsNotAdmitted &&
				strings.Contains(c.Message, "1 pods hold addresses of the Network ("+tenantB+"/foreign)"),
			fmt.Sprintf("PodsAdmitted condition %+v", c)
	})
	waitAllocated(t, env, tenantB, "foreign", neta)
	waitEvent(t, env, tenantA, "Network", "neta", samplecrd.ReasonPodsNotAdmitted)
	requireRefused(t, "a pod of the relabelled namespace", func(ctx context.Context) error {
		return pods(tenantB)(ctx, networkPod(tenantB, "after", neta))
	}, "does not select the namespace")

	// {} selects every namespace: the condition turns True.
	setSelector(t, env, tenantA, "neta", &metav1.LabelSelector{})
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Netop.SamplecrdV2().Networks(tenantA).Get(ctx, "neta", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionPodsAdmitted)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("PodsAdmitted condition %+v", c)
	})
	eventuallyAdmitted(t, env, networkPod(tenantC, "everyone", neta))

	// A v1 client reads the selector in an annotation and keeps it.
	v1, err := env.Netop.SamplecrdV1().Networks(tenantA).Get(ctx, "neta", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := v1.Annotations[samplecrdv1.NamespaceSelectorAnnotation]; got != "{}" {
		t.Fatalf("v1 annotation %s = %q, want {}", samplecrdv1.NamespaceSelectorAnnotation, got)
	}
	v1.Labels = map[string]string{"touched": "by-v1"}
	if v1, err = env.Netop.SamplecrdV1().Networks(tenantA).Update(ctx, v1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, err := env.Netop.SamplecrdV2().Networks(tenantA).Get(ctx, "neta", metav1.GetOptions{}); err != nil || n.Spec.NamespaceSelector == nil {
		t.Fatalf("after a v1 update: selector %v (%v), want {} kept", n.Spec.NamespaceSelector, err)
	}
	for value, why := range map[string]string{
		"{broken":                     "not a label selector",
		"null":                        "null is no selector",
		`{"matchLabel":{"team":"b"}}`: `unknown field "matchLabel"`,
	} {
		v1.Annotations[samplecrdv1.NamespaceSelectorAnnotation] = value
		requireRefused(t, "a v1 client's selector "+value, func(ctx context.Context) error {
			_, err := env.Netop.SamplecrdV1().Networks(tenantA).Update(ctx, v1, metav1.UpdateOptions{})
			return err
		}, "metadata.annotations["+samplecrdv1.NamespaceSelectorAnnotation+"]", why)
	}
}

// Pinned addresses and MACs are checked at admission: inside the cidr,
// never the gateway, never another pod's, never a multicast or zero MAC,
// nor one of those netop makes from addresses.
func TestPinnedAddressesAreChecked(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	ns := env.Namespace(t)
	if _, err := env.Netop.SamplecrdV2().Networks(ns).Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "pins"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.172.0.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pinned := func(name, ips, mac string) *corev1.Pod {
		element := map[string]any{"name": "pins"}
		if ips != "" {
			element["ips"] = []string{ips}
		}
		if mac != "" {
			element["mac"] = mac
		}
		selection, _ := json.Marshal([]any{element})
		return networkPod(ns, name, string(selection))
	}
	eventuallyAdmitted(t, env, pinned("first", "10.172.0.10/24", "02:00:00:00:00:07"))
	waitAllocated(t, env, ns, "first", ns+"/pins")
	for _, tc := range []struct {
		name, ips, mac, want string
	}{
		{"gateway", "10.172.0.1", "", "address 10.172.0.1: the gateway of cidr 10.172.0.0/24, which no pod may hold"},
		{"broadcast", "10.172.0.255", "", "the broadcast address of cidr 10.172.0.0/24"},
		{"neighbour", "10.172.0.10", "", "address 10.172.0.10: held by pod " + ns + "/first"},
		{"outside", "10.99.0.5", "", "address 10.99.0.5: not in cidr 10.172.0.0/24"},
		{"prefix", "10.172.0.11/16", "", "prefix length 16, the Network's is 24"},
		{"multicast", "", "01:00:5e:00:00:01", "a multicast address cannot be an interface's"},
		{"zero", "", "00:00:00:00:00:00", "the zero address cannot be an interface's"},
		{"neighbour-mac", "", "02:00:00:00:00:07", "mac 02:00:00:00:00:07: held by pod " + ns + "/first"},
		{"derived-mac", "", "0a:58:0a:ac:00:0b", "netop gives interfaces MACs 0a:58:… made from their addresses"},
	} {
		requireRefused(t, "pinning the "+tc.name, func(ctx context.Context) error {
			_, err := env.Kube.CoreV1().Pods(ns).Create(ctx, pinned(tc.name, tc.ips, tc.mac), metav1.CreateOptions{})
			return err
		}, "pod "+ns+"/"+tc.name, tc.want)
	}
	// Pinning a template's address is checked against the cidr alone: its
	// pods come and go holding it in turn.
	deployment := annotatedDeployment("pinned", 1, corev1.Container{Name: "c", Image: "busybox"})
	deployment.Annotations = nil
	deployment.Spec.Template.Annotations = pinned("", "10.172.0.1", "").Annotations
	requireRefused(t, "a template pinning the gateway", func(ctx context.Context) error {
		_, err := env.Kube.AppsV1().Deployments(ns).Create(ctx, deployment, metav1.CreateOptions{})
		return err
	}, "Deployment "+ns+"/pinned", "the gateway of cidr")
	deployment.Spec.Template.Annotations = pinned("", "10.172.0.10", "").Annotations
	if _, err := env.Kube.AppsV1().Deployments(ns).Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a template pinning an address a pod holds now: %v", err)
	}
}
