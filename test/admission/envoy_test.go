package admission

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// readExample decodes a manifest from examples/.
func readExample(t *testing.T, name string, into any) {
	t.Helper()
	data, err := os.ReadFile("../../examples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("examples/%s: %v", name, err)
	}
}

func createTemplate(t *testing.T, env *testenv.Env, namespace string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	readExample(t, "envoy-initializer.yaml", cm)
	cm, err := env.Kube.CoreV1().ConfigMaps(namespace).Create(t.Context(), cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// createPod creates a pod, retrying while the webhook's template cache has
// not caught up with a template made just before (it would skip the pod).
func createPod(t *testing.T, env *testenv.Env, namespace string, pod *corev1.Pod, wantInjected bool) *corev1.Pod {
	t.Helper()
	var created *corev1.Pod
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		p, err := env.Kube.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		injected := slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "envoy" })
		return injected == wantInjected, fmt.Sprintf("dry run: containers %v, annotations %v", names(p), p.Annotations)
	})
	created, err := env.Kube.CoreV1().Pods(namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

func names(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

func volumeNames(p *corev1.Pod) []string {
	var out []string
	for _, v := range p.Spec.Volumes {
		out = append(out, v.Name)
	}
	return out
}

func tutorialPod(t *testing.T) *corev1.Pod {
	pod := &corev1.Pod{}
	readExample(t, "pod.yaml", pod)
	return pod
}

// The tutorial: the envoy-initializer ConfigMap and a pod annotated
// initializer.kubernetes.io/envoy: "true" give [myapp-container envoy] and
// the template's volume; the same spec created again is not injected twice.
func TestTutorialEnvoyInjection(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createTemplate(t, env, ns)
	pod := createPod(t, env, ns, tutorialPod(t), true)
	if got := strings.Join(names(pod), " "); got != "myapp-container envoy" {
		t.Fatalf("containers = [%s], want [myapp-container envoy]", got)
	}
	if !slices.Contains(volumeNames(pod), "envoy-conf") {
		t.Fatalf("volumes = %v, want the template's envoy-conf", volumeNames(pod))
	}
	if pod.Annotations[envoy.Injected] == "" {
		t.Fatalf("no %s annotation: %v", envoy.Injected, pod.Annotations)
	}

	again := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "again", Annotations: pod.Annotations},
		Spec:       pod.Spec,
	}
	again.Spec.NodeName = ""
	again.Spec.Volumes = slices.DeleteFunc(slices.Clone(again.Spec.Volumes), func(v corev1.Volume) bool { return strings.HasPrefix(v.Name, "kube-api-access") })
	for i := range again.Spec.Containers {
		again.Spec.Containers[i].VolumeMounts = slices.DeleteFunc(slices.Clone(again.Spec.Containers[i].VolumeMounts),
			func(m corev1.VolumeMount) bool { return strings.HasPrefix(m.Name, "kube-api-access") })
	}
	second, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), again, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names(second), " "); got != "myapp-container envoy" {
		t.Fatalf("an already injected spec created again: containers [%s]", got)
	}
}

// A namespace label opts every pod in, a pod annotation "false" opts out,
// and the template in the operator's namespace serves namespaces without
// one of their own.
func TestNamespaceLabelOptInAndPodOptOut(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	if _, err := env.Kube.CoreV1().ConfigMaps(operatorNamespace).Get(t.Context(), envoy.ConfigMapName, metav1.GetOptions{}); err != nil {
		createTemplate(t, env, operatorNamespace)
	}
	enableNamespace(t, env, ns)
	plain := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plain"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	if got := names(createPod(t, env, ns, plain, true)); strings.Join(got, " ") != "app envoy" {
		t.Fatalf("labelled namespace: containers %v, want [app envoy]", got)
	}
	optOut := plain.DeepCopy()
	optOut.Name, optOut.Annotations = "opted-out", map[string]string{envoy.OptIn: "false"}
	if got := names(createPod(t, env, ns, optOut, false)); strings.Join(got, " ") != "app" {
		t.Fatalf("opted out: containers %v, want [app]", got)
	}
}

// A broken template rejects the pods that ask for it, naming the ConfigMap
// and the problem, with a Warning Event on the ConfigMap; a hostNetwork pod
// is skipped with the reason in an annotation.
func TestBrokenTemplateAndSkips(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	broken := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: envoy.ConfigMapName},
		Data:       map[string]string{envoy.ConfigKey: "containers:\n- name: envoy\n  image: envoy\n  imagePullPolice: Always\n"},
	}
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), broken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		_, err := env.Kube.CoreV1().Pods(ns).Create(ctx, tutorialPod(t), metav1.CreateOptions{})
		return err != nil && strings.Contains(err.Error(), "ConfigMap "+ns+"/envoy-initializer") && strings.Contains(err.Error(), `unknown field "imagePullPolice"`),
			fmt.Sprintf("create: %v", err)
	})
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ConfigMap,involvedObject.name=" + envoy.ConfigMapName})
		if err != nil || len(events.Items) == 0 {
			return false, fmt.Sprintf("no event on the ConfigMap: %v", err)
		}
		e := events.Items[0]
		return e.Type == corev1.EventTypeWarning && e.Reason == "InvalidTemplate", fmt.Sprintf("event %s %s", e.Type, e.Reason)
	})

	host := tutorialPod(t)
	host.Name, host.Spec.HostNetwork = "host", true
	pod := createPod(t, env, ns, host, false)
	if !strings.Contains(pod.Annotations[envoy.Skipped], "hostNetwork") {
		t.Fatalf("hostNetwork pod: annotations %v, want a skip reason", pod.Annotations)
	}
}

// An annotated Deployment gets the template in spec.template; its pods,
// made by the real kube-controller-manager, carry exactly one envoy even in
// a namespace where the Pod webhook injects every pod; a template change
// re-patches the Deployment; removing the annotation removes the sidecar.
func TestDeploymentInitializedAndRepatched(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createTemplate(t, env, ns)
	enableNamespace(t, env, ns)
	labelsMap := map[string]string{"app": "myapp"}
	d := annotatedDeployment("myapp", 2, corev1.Container{Name: "myapp-container", Image: "busybox"})
	if _, err := env.Kube.AppsV1().Deployments(ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTemplate := func(want string, image string) {
		t.Helper()
		testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
			got, err := env.Kube.AppsV1().Deployments(ns).Get(ctx, "myapp", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			var cs []string
			for _, c := range got.Spec.Template.Spec.Containers {
				cs = append(cs, c.Name+"="+c.Image)
			}
			ok := strings.Join(cs, " ") == want
			if image != "" {
				ok = ok && strings.Contains(strings.Join(cs, " "), image)
			}
			return ok, fmt.Sprintf("deployment containers %v, want %s", cs, want)
		})
	}
	waitTemplate("myapp-container=busybox envoy=lyft/envoy:845747144ad5fa7a4c0d2ac8bd1d8d8bf7ac2a50", "")

	// Pods from the ReplicaSet that kube-controller-manager makes.
	testenv.Eventually(t, 20*time.Second, func(ctx context.Context) (bool, string) {
		pods, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labelsMap).String()})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) < 2 {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		for _, p := range pods.Items {
			if got := strings.Join(names(&p), " "); got != "myapp-container envoy" {
				t.Fatalf("pod %s of an initialized Deployment has containers [%s]", p.Name, got)
			}
		}
		return true, ""
	})

	// A new template: the Deployment is re-patched.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), envoy.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data[envoy.ConfigKey] = strings.ReplaceAll(cm.Data[envoy.ConfigKey], "lyft/envoy:845747144ad5fa7a4c0d2ac8bd1d8d8bf7ac2a50", "envoyproxy/envoy:v1.31")
		_, err = env.Kube.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitTemplate("myapp-container=busybox envoy=envoyproxy/envoy:v1.31", "")

	// The annotation goes: so does the sidecar.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := env.Kube.AppsV1().Deployments(ns).Get(t.Context(), "myapp", metav1.GetOptions{})
		if err != nil {
			return err
		}
		delete(got.Annotations, envoy.OptIn)
		_, err = env.Kube.AppsV1().Deployments(ns).Update(t.Context(), got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitTemplate("myapp-container=busybox", "")
	got, err := env.Kube.AppsV1().Deployments(ns).Get(t.Context(), "myapp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Template.Spec.Volumes) != 0 || got.Spec.Template.Annotations[envoy.Injected] != "" {
		t.Fatalf("after removal: volumes %v, annotations %v", got.Spec.Template.Spec.Volumes, got.Spec.Template.Annotations)
	}
}

func ptrTo[T any](v T) *T { return &v }

// enableNamespace opts every pod of ns in with the namespace label.
func enableNamespace(t *testing.T, env *testenv.Env, ns string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := env.Kube.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Labels[envoy.NamespaceLabel] = envoy.NamespaceLabelEnabled
		_, err = env.Kube.CoreV1().Namespaces().Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// annotatedDeployment asks for the sidecar; its pods are labelled app=name.
func annotatedDeployment(name string, replicas int32, container corev1.Container) *appsv1.Deployment {
	labelsMap := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{envoy.OptIn: "true"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptrTo(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labelsMap},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labelsMap},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{container}},
			},
		},
	}
}

// A Deployment that already has a container named like the template's is
// not taken over: a Warning Event says why, and its containers stay as
// they are.
func TestDeploymentNameConflictIsNotInjected(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createTemplate(t, env, ns)
	d := annotatedDeployment("own-envoy", 0, corev1.Container{Name: "envoy", Image: "my/own-envoy"})
	if _, err := env.Kube.AppsV1().Deployments(ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=own-envoy"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Reason == envoy.ReasonSkipped && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, `already has a container "envoy"`) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, no %s naming the container", len(events.Items), envoy.ReasonSkipped)
	})
	got, err := env.Kube.AppsV1().Deployments(ns).Get(t.Context(), "own-envoy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := got.Spec.Template.Spec.Containers; len(cs) != 1 || cs[0].Image != "my/own-envoy" {
		t.Fatalf("containers changed: %+v", cs)
	}
}

// privilegedTemplate is issue 12's hole: a namespace's template that makes
// a privileged container with the node's / mounted.
const privilegedTemplate = `containers:
- name: envoy
  image: envoy
  securityContext: {privileged: true}
  volumeMounts: [{name: host, mountPath: /host}]
volumes:
- name: host
  hostPath: {path: /}
`

// The template policy: a namespace's privileged template is refused for a
// pod, which is admitted without the sidecar, its skip annotation naming
// the ConfigMap and the field, with a Warning Event on the ConfigMap.
func TestTemplatePolicyRefusesPrivilegedNamespaceTemplate(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: envoy.ConfigMapName},
		Data:       map[string]string{envoy.ConfigKey: privilegedTemplate},
	}
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"ConfigMap " + ns + `/envoy-initializer key "config"`, "containers[0].securityContext.privileged: true", `volumes[0].hostPath: "/"`}
	says := func(s string) bool {
		return !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(s, w) })
	}
	// Until the webhook's cache has the template, the pod may be skipped
	// for want of one, or get the operator namespace's.
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		p, err := env.Kube.CoreV1().Pods(ns).Create(ctx, tutorialPod(t), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		return says(p.Annotations[envoy.Skipped]), fmt.Sprintf("dry run: containers %v, annotations %v", names(p), p.Annotations)
	})
	pod, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), tutorialPod(t), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !says(pod.Annotations[envoy.Skipped]) || strings.Join(names(pod), " ") != "myapp-container" || slices.Contains(volumeNames(pod), "host") {
		t.Fatalf("pod: containers %v, volumes %v, annotations %v; want it as created, skipped with %q", names(pod), volumeNames(pod), pod.Annotations, want)
	}
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ConfigMap,involvedObject.name=" + envoy.ConfigMapName})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == envoy.ReasonInvalidTemplate && says(e.Message) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events on the ConfigMap, none a Warning naming %q", len(events.Items), want)
	})
}

// newNamespace makes a namespace with labels, ready for pods.
func newNamespace(t *testing.T, env *testenv.Env, labels map[string]string) string {
	t.Helper()
	ns, err := env.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "template-policy-", Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Kube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := env.Kube.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprintf("no default ServiceAccount in %s: %v", ns.Name, err)
	})
	return ns.Name
}

// The workload initializer leaves kube-system and namespaces labelled
// initializer.kubernetes.io/envoy=disabled alone, while it initializes a
// Deployment of an ordinary namespace made after them; the Pod webhook is
// not even called for the opted-out namespace's pods.
func TestTemplatePolicyWorkloadInitializerSkipsNamespaces(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	if _, err := env.Kube.CoreV1().ConfigMaps(operatorNamespace).Get(t.Context(), envoy.ConfigMapName, metav1.GetOptions{}); err != nil {
		createTemplate(t, env, operatorNamespace)
	}
	optedOut := newNamespace(t, env, map[string]string{envoy.NamespaceLabel: envoy.NamespaceLabelDisabled})
	createTemplate(t, env, optedOut)
	ordinary := env.Namespace(t)
	createTemplate(t, env, ordinary)

	system := annotatedDeployment("netop-test-"+ordinary, 0, corev1.Container{Name: "app", Image: "busybox"})
	created := map[string]string{} // namespace: Deployment
	for _, d := range []struct {
		namespace string
		d         *appsv1.Deployment
	}{
		{metav1.NamespaceSystem, system},
		{optedOut, annotatedDeployment("app", 0, corev1.Container{Name: "app", Image: "busybox"})},
		{ordinary, annotatedDeployment("app", 0, corev1.Container{Name: "app", Image: "busybox"})},
	} {
		if _, err := env.Kube.AppsV1().Deployments(d.namespace).Create(t.Context(), d.d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		created[d.namespace] = d.d.Name
	}
	t.Cleanup(func() {
		_ = env.Kube.AppsV1().Deployments(metav1.NamespaceSystem).Delete(context.Background(), system.Name, metav1.DeleteOptions{})
	})
	containers := func(ctx context.Context, namespace string) (string, error) {
		d, err := env.Kube.AppsV1().Deployments(namespace).Get(ctx, created[namespace], metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		var cs []string
		for _, c := range d.Spec.Template.Spec.Containers {
			cs = append(cs, c.Name)
		}
		return strings.Join(cs, " "), nil
	}
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		got, err := containers(ctx, ordinary)
		return got == "app envoy", fmt.Sprintf("the ordinary namespace's Deployment: containers [%s] (%v), want [app envoy]", got, err)
	})
	// The initializer has come past the others; give it a moment more.
	time.Sleep(time.Second)
	for _, namespace := range []string{metav1.NamespaceSystem, optedOut} {
		if got, err := containers(t.Context(), namespace); err != nil || got != "app" {
			t.Errorf("the Deployment in %s: containers [%s] (%v), want it untouched: [app]", namespace, got, err)
		}
	}

	// Called, the webhook would inject it or annotate why not.
	pod, err := env.Kube.CoreV1().Pods(optedOut).Create(t.Context(), tutorialPod(t), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names(pod), " ") != "myapp-container" || pod.Annotations[envoy.Skipped] != "" || pod.Annotations[envoy.Injected] != "" {
		t.Errorf("a pod of the opted-out namespace: containers %v, annotations %v; want the webhook never called", names(pod), pod.Annotations)
	}
}

// Issue 13's broken rollout: a hostNetwork Deployment whose app uses host
// port 80, with the example template (whose sidecar listens on 80). The
// initializer skips it with a Warning saying why, instead of injecting a
// sidecar that would leave the ReplicaSet unable to create any pod; its
// pod is created, without the sidecar.
func TestHostNetworkDeploymentIsSkipped(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createTemplate(t, env, ns)
	d := annotatedDeployment("on-the-host", 1, corev1.Container{Name: "app", Image: "nginx",
		Ports: []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}})
	d.Spec.Template.Spec.HostNetwork = true
	if _, err := env.Kube.AppsV1().Deployments(ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=on-the-host"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Reason == "SidecarInjected" {
				t.Fatalf("Event %s: %s", e.Reason, e.Message)
			}
			if e.Reason == "SidecarSkipped" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "hostNetwork") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, no SidecarSkipped", len(events.Items))
	})
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		pods, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=on-the-host"})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		if got := names(&pods.Items[0]); len(got) != 1 {
			t.Fatalf("pod containers %v, want the app alone", got)
		}
		return true, ""
	})
	got, err := env.Kube.AppsV1().Deployments(ns).Get(t.Context(), "on-the-host", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := got.Spec.Template.Spec.Containers; len(cs) != 1 {
		t.Fatalf("the Deployment was patched: %d containers", len(cs))
	}
}

// Workloads get the sidecar in their pod template at admission: the first
// rollout of a Deployment already has it, and there is no second one (one
// ReplicaSet, generation 1); every workload kind is injected as it is
// created, and a hostNetwork one is skipped with the reason on it.
func TestWorkloadsInjectedAtAdmission(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createTemplate(t, env, ns)
	ctx := t.Context()
	// The webhook reads templates from a cache: wait until a dry run
	// shows it has the one just made.
	d := annotatedDeployment("first-rollout", 1, corev1.Container{Name: "app", Image: "app"})
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		dry, err := env.Kube.AppsV1().Deployments(ns).Create(ctx, d.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		return len(dry.Spec.Template.Spec.Containers) == 2, "the webhook has not seen the template yet"
	})

	created, err := env.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := created.Spec.Template.Spec.Containers; len(cs) != 2 || cs[1].Name != "envoy" {
		t.Fatalf("the created Deployment's containers: %v", cs)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		pods, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=first-rollout"})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Sprintf("no pod yet (%v)", err)
		}
		if got := names(&pods.Items[0]); len(got) != 2 {
			t.Fatalf("the first pod's containers: %v", got)
		}
		return true, ""
	})
	rss, err := env.Kube.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=first-rollout"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := env.Kube.AppsV1().Deployments(ns).Get(ctx, "first-rollout", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rss.Items) != 1 || got.Generation != 1 {
		t.Errorf("%d ReplicaSets, generation %d: want one rollout", len(rss.Items), got.Generation)
	}

	template := func(container ...corev1.Container) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "w"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: container}}
	}
	app := corev1.Container{Name: "app", Image: "app"}
	optIn := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Annotations: map[string]string{envoy.OptIn: "true"}}
	}
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}
	check := func(kind string, tmpl corev1.PodTemplateSpec, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if cs := tmpl.Spec.Containers; len(cs) != 2 || cs[1].Name != "envoy" || tmpl.Annotations[envoy.Injected] == "" {
			t.Errorf("%s: pod template containers %v annotations %v", kind, names(&corev1.Pod{Spec: tmpl.Spec}), tmpl.Annotations)
		}
	}
	always := template(app)
	always.Spec.RestartPolicy = corev1.RestartPolicyAlways
	sts, err := env.Kube.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: optIn("sts"),
		Spec: appsv1.StatefulSetSpec{Selector: selector, Template: always, Replicas: ptrTo[int32](0)}}, metav1.CreateOptions{})
	check("StatefulSet", sts.Spec.Template, err)
	ds, err := env.Kube.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: optIn("ds"),
		Spec: appsv1.DaemonSetSpec{Selector: selector, Template: always}}, metav1.CreateOptions{})
	check("DaemonSet", ds.Spec.Template, err)
	rs, err := env.Kube.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: optIn("rs"),
		Spec: appsv1.ReplicaSetSpec{Selector: selector, Template: always, Replicas: ptrTo[int32](0)}}, metav1.CreateOptions{})
	check("ReplicaSet", rs.Spec.Template, err)
	job, err := env.Kube.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: optIn("job"),
		Spec: batchv1.JobSpec{Template: template(app), Suspend: ptrTo(true)}}, metav1.CreateOptions{})
	check("Job", job.Spec.Template, err)
	cron, err := env.Kube.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{ObjectMeta: optIn("cron"),
		Spec: batchv1.CronJobSpec{Schedule: "0 0 1 1 *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: template(app)}}}}, metav1.CreateOptions{})
	check("CronJob", cron.Spec.JobTemplate.Spec.Template, err)

	// Each workload says, in an Event, what admission did to it.
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=sts"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Reason == envoy.ReasonInjected && e.InvolvedObject.Kind == "StatefulSet" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events of sts, no %s", len(events.Items), envoy.ReasonInjected)
	})

	hostNet := always.DeepCopy()
	hostNet.Spec.HostNetwork = true
	skipped, err := env.Kube.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: optIn("on-the-host"),
		Spec: appsv1.DaemonSetSpec{Selector: selector, Template: *hostNet}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped.Spec.Template.Spec.Containers) != 1 || !strings.Contains(skipped.Annotations[envoy.Skipped], "hostNetwork") {
		t.Errorf("hostNetwork DaemonSet: containers %d, skip annotation %q", len(skipped.Spec.Template.Spec.Containers), skipped.Annotations[envoy.Skipped])
	}
}
