package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/controller/at"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	cnatv1alpha1 "github.com/netop-dev/netop/pkg/apis/cnat/v1alpha1"
)

var atResource = schema.GroupVersionResource{Group: "cnat.programming-kubernetes.info", Version: "v1alpha1", Resource: "ats"}

// waitAt waits until the At's status satisfies ok, and returns it.
func waitAt(t *testing.T, ns, name string, ok func(cnatv1alpha1.AtStatus) bool) *cnatv1alpha1.At {
	t.Helper()
	env := testenv.Get(t)
	var got *cnatv1alpha1.At
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		var err error
		if got, err = env.Netop.CnatV1alpha1().Ats(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		return ok(got.Status), fmt.Sprintf("status %+v", got.Status)
	})
	return got
}

// endPod does what a kubelet does when the pod's container exits.
func endPod(t *testing.T, ns, name string, exitCode int32) {
	t.Helper()
	env := testenv.Get(t)
	// Read and written again on a conflict, as the kubelet does: another
	// writer may change the pod between the read and the write (CI saw a
	// conflict here once).
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodSucceeded
		if exitCode != 0 {
			pod.Status.Phase = corev1.PodFailed
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "command", Image: at.DefaultImage,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exitCode, Reason: "Completed"}}}}
		_, err = env.Kube.CoreV1().Pods(ns).UpdateStatus(t.Context(), pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The At of the code-generator example, against the real API server (the
// test plays the kubelet; test/standalone runs it on a real node): the
// seed's YAML applies unchanged through the dynamic client and runs at
// once (its 2019 schedule has passed) with the default command; a future
// schedule waits for its time; the phase follows the pod to DONE, with
// the command's exit; a pod deleted before it ended ends the At rather
// than run it twice; a bad schedule is refused naming the field; deleting
// an At removes its pod (the garbage collector).
func TestAt(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	opts := operator.NewOptions()
	opts.Metrics.Addr, opts.Webhooks.Addr, opts.Workloads.Enabled = "0", "0", false
	testenv.StartOperator(t, env.Config, opts, backendtest.New())
	ats := env.Netop.CnatV1alpha1().Ats(ns)

	t.Run("the seed's At runs at once", func(t *testing.T) {
		data, err := os.ReadFile("../../examples/at.yaml")
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			t.Fatal(err)
		}
		dyn := dynamic.NewForConfigOrDie(env.Config).Resource(atResource).Namespace(ns)
		if _, err := dyn.Create(t.Context(), obj, metav1.CreateOptions{FieldManager: "kubectl"}); err != nil {
			t.Fatalf("creating examples/at.yaml: %v", err)
		}
		// The seed's own read: a Get by GroupVersionResource.
		got, err := dyn.Get(t.Context(), "example-at", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if command, _, _ := unstructured.NestedString(got.Object, "spec", "command"); command != "date -u" {
			t.Errorf("spec.command defaulted to %q, want %q", command, "date -u")
		}
		running := waitAt(t, ns, "example-at", func(s cnatv1alpha1.AtStatus) bool { return s.Phase == cnatv1alpha1.PhaseRunning })
		pod, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), running.Status.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pod.Finalizers, at.Finalizer) {
			t.Errorf("pod finalizers %v: want %s until its end is recorded", pod.Finalizers, at.Finalizer)
		}
		if !metav1.IsControlledBy(pod, running) || pod.Spec.RestartPolicy != corev1.RestartPolicyNever ||
			strings.Join(pod.Spec.Containers[0].Command, " ") != "sh -c date -u" {
			t.Errorf("pod: owners %+v, restart %s, command %q", pod.OwnerReferences, pod.Spec.RestartPolicy, pod.Spec.Containers[0].Command)
		}
		endPod(t, ns, pod.Name, 0)
		done := waitAt(t, ns, "example-at", func(s cnatv1alpha1.AtStatus) bool { return s.Phase == cnatv1alpha1.PhaseDone })
		if done.Status.Succeeded == nil || !*done.Status.Succeeded {
			t.Errorf("DONE with %+v, want succeeded", done.Status)
		}
		// Recorded, the pod is let go (and kept, for its logs).
		testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
			p, err := env.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return err == nil && len(p.Finalizers) == 0, fmt.Sprintf("pod finalizers %v (%v)", p.GetFinalizers(), err)
		})

		// Deleted, its pod goes with it.
		if err := ats.Delete(t.Context(), "example-at", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
			_, err := env.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("pod still there (%v)", err)
		})
	})

	t.Run("a future schedule waits for its time", func(t *testing.T) {
		when := time.Now().Add(4 * time.Second).UTC().Truncate(time.Second)
		if _, err := ats.Create(t.Context(), &cnatv1alpha1.At{ObjectMeta: metav1.ObjectMeta{Name: "later"},
			Spec: cnatv1alpha1.AtSpec{Schedule: when.Format(time.RFC3339), Command: "exit 3"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pending := waitAt(t, ns, "later", func(s cnatv1alpha1.AtStatus) bool { return s.Phase == cnatv1alpha1.PhasePending })
		if !strings.Contains(pending.Status.Message, when.Format(time.RFC3339)) {
			t.Errorf("PENDING says %q, want the time it runs at", pending.Status.Message)
		}
		running := waitAt(t, ns, "later", func(s cnatv1alpha1.AtStatus) bool { return s.Phase == cnatv1alpha1.PhaseRunning })
		pod, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), running.Status.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Creation timestamps have whole seconds.
		if pod.CreationTimestamp.Before(&metav1.Time{Time: when}) {
			t.Errorf("pod made at %v, before the schedule %v", pod.CreationTimestamp, when)
		}
		endPod(t, ns, pod.Name, 3)
		done := waitAt(t, ns, "later", func(s cnatv1alpha1.AtStatus) bool { return s.Phase == cnatv1alpha1.PhaseDone })
		if done.Status.Succeeded == nil || *done.Status.Succeeded || !strings.Contains(done.Status.Message, "exited 3") {
			t.Errorf("DONE with %+v, want unsucceeded, exit 3", done.Status)
		}
	})

	t.Run("a pod deleted before it ended is not run again", func(t *testing.T) {
		if _, err := ats.Create(t.Context(), &cnatv1alpha1.At{ObjectMeta: metav1.ObjectMeta{Name: "interrupted"},
			Spec: cnatv1alpha1.AtSpec{Schedule: "2020-01-01T00:00:00Z", Command: "sleep 3600"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		running := waitAt(t, ns, "interrupted", func(s cnatv1alpha1.AtStatus) bool { return s.Phase == cnatv1alpha1.PhaseRunning })
		first, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), running.Status.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Kube.CoreV1().Pods(ns).Delete(t.Context(), first.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		done := waitAt(t, ns, "interrupted", func(s cnatv1alpha1.AtStatus) bool { return s.Phase == cnatv1alpha1.PhaseDone })
		if done.Status.Succeeded == nil || *done.Status.Succeeded || !strings.Contains(done.Status.Message, "deleted before it ended") {
			t.Errorf("DONE with %+v, want unsucceeded, deleted", done.Status)
		}
		// The finalizer held the deleted pod until its end was recorded;
		// then it goes, and no second pod is made.
		testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
			pod, err := env.Kube.CoreV1().Pods(ns).Get(ctx, first.Name, metav1.GetOptions{})
			if err == nil && pod.UID != first.UID {
				t.Fatalf("the command runs again: pod %s (uid %s, first %s)", pod.Name, pod.UID, first.UID)
			}
			return apierrors.IsNotFound(err), fmt.Sprintf("pod still there (%v)", err)
		})
	})

	t.Run("a bad schedule is refused, naming the field", func(t *testing.T) {
		for _, schedule := range []string{"tomorrow", "2019-07-03 02:00:00"} {
			_, err := ats.Create(t.Context(), &cnatv1alpha1.At{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
				Spec: cnatv1alpha1.AtSpec{Schedule: schedule}}, metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.schedule") {
				t.Errorf("schedule %q: got %v, want Invalid naming spec.schedule", schedule, err)
			}
		}
	})

	t.Run("someone else's pod of the name is left alone", func(t *testing.T) {
		theirs := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "taken"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if _, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), theirs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := ats.Create(t.Context(), &cnatv1alpha1.At{ObjectMeta: metav1.ObjectMeta{Name: "taken"},
			Spec: cnatv1alpha1.AtSpec{Schedule: "2020-01-01T00:00:00Z"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := waitAt(t, ns, "taken", func(s cnatv1alpha1.AtStatus) bool { return strings.Contains(s.Message, "not this At's") })
		if got.Status.Phase != cnatv1alpha1.PhasePending {
			t.Errorf("phase %s, want PENDING", got.Status.Phase)
		}
		pod, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), "taken", metav1.GetOptions{})
		if err != nil || len(pod.OwnerReferences) != 0 || pod.Spec.Containers[0].Name != "c" {
			t.Errorf("their pod changed: %+v, %v", pod, err)
		}
	})
}
