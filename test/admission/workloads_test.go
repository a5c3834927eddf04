package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// typedClient is what the typed clients of every workload kind have.
type typedClient[T runtime.Object] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
	Get(context.Context, string, metav1.GetOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
}

// workloadKind is one workload kind as the tests drive it.
type workloadKind struct {
	name string
	// make builds an object of the kind around a pod template.
	make     func(meta metav1.ObjectMeta, tmpl corev1.PodTemplateSpec) runtime.Object
	template func(runtime.Object) *corev1.PodTemplateSpec
	create   func(ctx context.Context, obj runtime.Object) (runtime.Object, error)
	get      func(ctx context.Context, name string) (runtime.Object, error)
	update   func(ctx context.Context, obj runtime.Object) (runtime.Object, error)
	// templateFixed: the API server refuses changes of the pod template
	// (Jobs), so the sidecar stays what admission made it.
	templateFixed bool
	// rollouts counts the rollouts of a workload (ReplicaSets of a
	// Deployment, ControllerRevisions of a StatefulSet or DaemonSet), or
	// is nil for kinds without any.
	rollouts func(ctx context.Context, obj runtime.Object) (int, error)
}

func kindOf[T runtime.Object](name string, client typedClient[T], make func(metav1.ObjectMeta, corev1.PodTemplateSpec) T,
	template func(T) *corev1.PodTemplateSpec) workloadKind {
	return workloadKind{
		name:     name,
		make:     func(m metav1.ObjectMeta, p corev1.PodTemplateSpec) runtime.Object { return make(m, p) },
		template: func(obj runtime.Object) *corev1.PodTemplateSpec { return template(obj.(T)) },
		create: func(ctx context.Context, obj runtime.Object) (runtime.Object, error) {
			return client.Create(ctx, obj.(T), metav1.CreateOptions{})
		},
		get: func(ctx context.Context, name string) (runtime.Object, error) {
			return client.Get(ctx, name, metav1.GetOptions{})
		},
		update: func(ctx context.Context, obj runtime.Object) (runtime.Object, error) {
			return client.Update(ctx, obj.(T), metav1.UpdateOptions{})
		},
	}
}

// workloadKinds are the kinds netop injects into, in namespace ns; each
// makes one pod (DaemonSets: none, the API server has no node).
func workloadKinds(env *testenv.Env, ns string) []workloadKind {
	selector := func(m metav1.ObjectMeta) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": m.Name}}
	}
	one := ptrTo[int32](1)
	revisions := func(ctx context.Context, obj runtime.Object) (int, error) {
		owner, err := meta.Accessor(obj)
		if err != nil {
			return 0, err
		}
		list, err := env.Kube.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		return countOwned(list.Items, func(r appsv1.ControllerRevision) []metav1.OwnerReference { return r.OwnerReferences }, owner.GetUID()), nil
	}
	deployment := kindOf("Deployment", env.Kube.AppsV1().Deployments(ns), func(m metav1.ObjectMeta, p corev1.PodTemplateSpec) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: m, Spec: appsv1.DeploymentSpec{Replicas: one, Selector: selector(m), Template: p}}
	}, func(o *appsv1.Deployment) *corev1.PodTemplateSpec { return &o.Spec.Template })
	deployment.rollouts = func(ctx context.Context, obj runtime.Object) (int, error) {
		list, err := env.Kube.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		return countOwned(list.Items, func(r appsv1.ReplicaSet) []metav1.OwnerReference { return r.OwnerReferences }, obj.(*appsv1.Deployment).UID), nil
	}
	statefulSet := kindOf("StatefulSet", env.Kube.AppsV1().StatefulSets(ns), func(m metav1.ObjectMeta, p corev1.PodTemplateSpec) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{ObjectMeta: m, Spec: appsv1.StatefulSetSpec{Replicas: one, Selector: selector(m), Template: p}}
	}, func(o *appsv1.StatefulSet) *corev1.PodTemplateSpec { return &o.Spec.Template })
	statefulSet.rollouts = revisions
	daemonSet := kindOf("DaemonSet", env.Kube.AppsV1().DaemonSets(ns), func(m metav1.ObjectMeta, p corev1.PodTemplateSpec) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: m, Spec: appsv1.DaemonSetSpec{Selector: selector(m), Template: p}}
	}, func(o *appsv1.DaemonSet) *corev1.PodTemplateSpec { return &o.Spec.Template })
	daemonSet.rollouts = revisions
	replicaSet := kindOf("ReplicaSet", env.Kube.AppsV1().ReplicaSets(ns), func(m metav1.ObjectMeta, p corev1.PodTemplateSpec) *appsv1.ReplicaSet {
		return &appsv1.ReplicaSet{ObjectMeta: m, Spec: appsv1.ReplicaSetSpec{Replicas: one, Selector: selector(m), Template: p}}
	}, func(o *appsv1.ReplicaSet) *corev1.PodTemplateSpec { return &o.Spec.Template })
	job := kindOf("Job", env.Kube.BatchV1().Jobs(ns), func(m metav1.ObjectMeta, p corev1.PodTemplateSpec) *batchv1.Job {
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		return &batchv1.Job{ObjectMeta: m, Spec: batchv1.JobSpec{Template: p}}
	}, func(o *batchv1.Job) *corev1.PodTemplateSpec { return &o.Spec.Template })
	job.templateFixed = true
	cronJob := kindOf("CronJob", env.Kube.BatchV1().CronJobs(ns), func(m metav1.ObjectMeta, p corev1.PodTemplateSpec) *batchv1.CronJob {
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		return &batchv1.CronJob{ObjectMeta: m, Spec: batchv1.CronJobSpec{Schedule: "0 0 1 1 *",
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: p}}}}
	}, func(o *batchv1.CronJob) *corev1.PodTemplateSpec { return &o.Spec.JobTemplate.Spec.Template })
	return []workloadKind{deployment, statefulSet, daemonSet, replicaSet, job, cronJob}
}

func countOwned[T any](items []T, owners func(T) []metav1.OwnerReference, uid types.UID) int {
	n := 0
	for _, item := range items {
		if slices.ContainsFunc(owners(item), func(r metav1.OwnerReference) bool { return r.UID == uid }) {
			n++
		}
	}
	return n
}

// podTemplateOf labels the pods app=name; its one container serves port.
func podTemplateOf(name string, port int32) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app", Ports: []corev1.ContainerPort{{ContainerPort: port}}}}}}
}

func containerImages(tmpl *corev1.PodTemplateSpec) string {
	var cs []string
	for _, c := range tmpl.Spec.Containers {
		cs = append(cs, c.Name+"="+c.Image)
	}
	return strings.Join(cs, " ")
}

const (
	tutorialEnvoy = "app=app envoy=lyft/envoy:845747144ad5fa7a4c0d2ac8bd1d8d8bf7ac2a50"
	newerEnvoy    = "app=app envoy=envoyproxy/envoy:v1.31"
)

// The whole life of the sidecar in each workload kind, against the real API
// server and kube-controller-manager: injected at admission so that the
// first pods carry it and there is one rollout only; re-injected when the
// template changes, as one more rollout; removed when the opt-in goes;
// hostNetwork and port clashes skipped with the reason on the workload and
// in an Event, the workload still able to make its pods. Jobs, whose pod
// template the API server keeps as created, keep their sidecar and accept
// updates.
func TestWorkloadKindsSidecarLifecycle(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	for _, kindName := range []string{"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"} {
		t.Run(kindName, func(t *testing.T) {
			ns := env.Namespace(t)
			kinds := workloadKinds(env, ns)
			k := kinds[slices.IndexFunc(kinds, func(k workloadKind) bool { return k.name == kindName })]
			createTemplate(t, env, ns)
			optIn := func(name string) metav1.ObjectMeta {
				return metav1.ObjectMeta{Name: name, Annotations: map[string]string{envoy.OptIn: "true"}}
			}
			waitTemplateSeen(t, env, ns)

			created, err := k.create(t.Context(), k.make(optIn("w"), podTemplateOf("w", 8080)))
			if err != nil {
				t.Fatal(err)
			}
			if got := containerImages(k.template(created)); got != tutorialEnvoy {
				t.Fatalf("created with containers %s, want %s", got, tutorialEnvoy)
			}
			waitEvent(t, env, ns, kindName, "w", envoy.ReasonInjected)
			waitPodsCarry(t, env, ns, k, created, "app envoy")
			waitRollouts(t, k, created, 1)

			// A new template: one more rollout with it (none for a Job).
			setTemplateImage(t, env, ns, "envoyproxy/envoy:v1.31")
			if k.templateFixed {
				// Once another kind in the namespace has the new template,
				// the initializer has seen it; the Job is as it was.
				other, err := kinds[0].create(t.Context(), kinds[0].make(optIn("witness"), podTemplateOf("witness", 8080)))
				if err != nil {
					t.Fatal(err)
				}
				waitTemplate(t, kinds[0], other, newerEnvoy)
				waitTemplate(t, k, created, tutorialEnvoy)
			} else {
				waitTemplate(t, k, created, newerEnvoy)
				waitEvent(t, env, ns, kindName, "w", envoy.ReasonUpdated)
				waitRollouts(t, k, created, 2)
			}
			if got := generation(t, k, created); got != map[bool]int64{false: 2, true: 1}[k.templateFixed] {
				t.Errorf("generation %d after the template change: a rollout too many or too few", got)
			}

			// The opt-in goes: so does the sidecar (a Job keeps it, and the
			// update is not refused).
			updateWorkload(t, k, created, func(m metav1.Object) {
				a := m.GetAnnotations()
				delete(a, envoy.OptIn)
				m.SetAnnotations(a)
			})
			if k.templateFixed {
				waitTemplate(t, k, created, tutorialEnvoy)
			} else {
				waitTemplate(t, k, created, "app=app")
				waitEvent(t, env, ns, kindName, "w", envoy.ReasonRemoved)
				got, err := k.get(t.Context(), "w")
				if err != nil {
					t.Fatal(err)
				}
				if tmpl := k.template(got); len(tmpl.Spec.Volumes) != 0 || tmpl.Annotations[envoy.Injected] != "" {
					t.Errorf("after removal: volumes %v, annotations %v", tmpl.Spec.Volumes, tmpl.Annotations)
				}
			}

			// hostNetwork, and the app on the sidecar's port: skipped, with
			// the reason; the workload still makes its pods.
			hostNet := podTemplateOf("host", 80)
			hostNet.Spec.HostNetwork = true
			hostNet.Spec.Containers[0].Ports[0].HostPort = 80
			for name, c := range map[string]struct {
				tmpl corev1.PodTemplateSpec
				says string
			}{
				"host":  {hostNet, "hostNetwork"},
				"clash": {podTemplateOf("clash", 80), `port 80/TCP of container "envoy"`},
			} {
				skipped, err := k.create(t.Context(), k.make(optIn(name), c.tmpl))
				if err != nil {
					t.Fatal(err)
				}
				m, _ := meta.Accessor(skipped)
				if got := containerImages(k.template(skipped)); got != "app=app" || !strings.Contains(m.GetAnnotations()[envoy.Skipped], c.says) {
					t.Errorf("%s: containers %s, skip annotation %q, want no sidecar and a reason saying %q", name, got, m.GetAnnotations()[envoy.Skipped], c.says)
				}
				waitEvent(t, env, ns, kindName, name, envoy.ReasonSkipped)
				waitPodsCarry(t, env, ns, k, skipped, "app")
			}
		})
	}
}

// waitTemplateSeen waits until the workload webhook, which reads templates
// from a cache, has the one just made in ns: a dry run shows it.
func waitTemplateSeen(t *testing.T, env *testenv.Env, ns string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		dry, err := env.Kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "dry", Annotations: map[string]string{envoy.OptIn: "true"}},
			Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "dry"}}, Template: podTemplateOf("dry", 8080)}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		return len(dry.Spec.Template.Spec.Containers) == 2, "the webhook has not seen the template yet"
	})
}

// waitPodsCarry waits for a pod of the workload obj with the containers
// want (space-separated names). A CronJob's pods come from a Job made from
// it, as `kubectl create job --from=cronjob/NAME` makes one; a DaemonSet
// makes none without a node.
func waitPodsCarry(t *testing.T, env *testenv.Env, ns string, k workloadKind, obj runtime.Object, want string) {
	t.Helper()
	m, _ := meta.Accessor(obj)
	switch k.name {
	case "DaemonSet":
		return
	case "CronJob":
		cron := obj.(*batchv1.CronJob)
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: cron.Name + "-manual", Annotations: map[string]string{"cronjob.kubernetes.io/instantiate": "manual"},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cron, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
			Spec: cron.Spec.JobTemplate.Spec,
		}
		if _, err := env.Kube.BatchV1().Jobs(ns).Create(t.Context(), job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A Job's pods are labelled with its name; the others' with their
	// template's labels.
	selector := labels.SelectorFromSet(k.template(obj).Labels).String()
	switch k.name {
	case "Job":
		selector = batchv1.JobNameLabel + "=" + m.GetName()
	case "CronJob":
		selector = batchv1.JobNameLabel + "=" + m.GetName() + "-manual"
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		pods, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Sprintf("no pod of %s %s yet (%v)", k.name, m.GetName(), err)
		}
		if got := strings.Join(names(&pods.Items[0]), " "); got != want {
			t.Fatalf("the first pod of %s %s has containers [%s], want [%s]", k.name, m.GetName(), got, want)
		}
		return true, ""
	})
}

func waitRollouts(t *testing.T, k workloadKind, obj runtime.Object, want int) {
	t.Helper()
	if k.rollouts == nil {
		return
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		n, err := k.rollouts(ctx, obj)
		if err != nil {
			return false, err.Error()
		}
		if n > want {
			t.Fatalf("%d rollouts, want %d", n, want)
		}
		return n == want, fmt.Sprintf("%d rollouts, want %d", n, want)
	})
}

func waitTemplate(t *testing.T, k workloadKind, obj runtime.Object, want string) {
	t.Helper()
	m, _ := meta.Accessor(obj)
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		got, err := k.get(ctx, m.GetName())
		if err != nil {
			return false, err.Error()
		}
		images := containerImages(k.template(got))
		return images == want, fmt.Sprintf("%s %s has containers %s, want %s", k.name, m.GetName(), images, want)
	})
}

func waitEvent(t *testing.T, env *testenv.Env, ns, kind, name, reason string) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range events.Items {
			if e.Reason == reason && e.InvolvedObject.Kind == kind {
				return true, ""
			}
			seen = append(seen, e.InvolvedObject.Kind+" "+e.Reason)
		}
		return false, fmt.Sprintf("no %s Event on %s %s; seen %v", reason, kind, name, seen)
	})
}

func generation(t *testing.T, k workloadKind, obj runtime.Object) int64 {
	t.Helper()
	m, _ := meta.Accessor(obj)
	got, err := k.get(t.Context(), m.GetName())
	if err != nil {
		t.Fatal(err)
	}
	gm, _ := meta.Accessor(got)
	return gm.GetGeneration()
}

func updateWorkload(t *testing.T, k workloadKind, obj runtime.Object, change func(metav1.Object)) {
	t.Helper()
	m, _ := meta.Accessor(obj)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := k.get(t.Context(), m.GetName())
		if err != nil {
			return err
		}
		gm, _ := meta.Accessor(got)
		change(gm)
		_, err = k.update(t.Context(), got)
		return err
	})
	if err != nil {
		t.Fatalf("updating %s %s: %v", k.name, m.GetName(), err)
	}
}

// setTemplateImage changes the sidecar's image in ns's template.
func setTemplateImage(t *testing.T, env *testenv.Env, ns, image string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), envoy.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data[envoy.ConfigKey] = strings.ReplaceAll(cm.Data[envoy.ConfigKey], "lyft/envoy:845747144ad5fa7a4c0d2ac8bd1d8d8bf7ac2a50", image)
		_, err = env.Kube.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
