// Package at runs the At resource of the code-generator example
// (cnat.programming-kubernetes.info/v1alpha1): at an At's scheduled time,
// or at once if it has passed, a pod of the At's name runs its command
// (sh -c) on a node, owned by the At so that the garbage collector removes
// it with the At. The At's phase follows the pod: PENDING until it is
// made, RUNNING while it runs, DONE when it ended. An At runs once: DONE
// is final; the pod carries a finalizer until its end is recorded, so a
// pod that was made is never missed, and one deleted before it ended makes
// the At DONE, unsucceeded, rather than run the command a second time.
package at

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	cnatv1alpha1 "github.com/netop-dev/netop/pkg/apis/cnat/v1alpha1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	cnatinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/cnat/v1alpha1"
	cnatlisters "github.com/netop-dev/netop/pkg/generated/listers/cnat/v1alpha1"
)

// Name is the controller's name in logs and metrics.
const Name = "at"

// Reasons of the Events on Ats.
const (
	ReasonStarted         = "Started"
	ReasonSucceeded       = "Succeeded"
	ReasonFailed          = "Failed"
	ReasonInvalidSchedule = "InvalidSchedule"
	ReasonPodConflict     = "PodConflict"
	ReasonPodRefused      = "PodRefused"
)

// Finalizer keeps an At's pod until its end is recorded in the At.
const Finalizer = cnatv1alpha1.GroupName + "/run-once"

// Label names an At's pod's At, for `kubectl get pods -l`.
const Label = cnatv1alpha1.GroupName + "/at"

// DefaultImage runs the commands: a shell is all they need.
const DefaultImage = "busybox"

// Options configure the controller.
type Options struct {
	Workers int
	// Image runs the commands; it must have sh.
	Image string
}

// Controller runs Ats.
type Controller struct {
	*runner.Controller
	client   versioned.Interface
	kube     kubernetes.Interface
	ats      cnatlisters.AtLister
	pods     corelisters.PodLister
	recorder record.EventRecorder
	opts     Options
}

// New makes the controller on the Ats' and the pods' informers; the pod
// informer's objects must keep their controller reference and phase. Call
// it before the informers start.
func New(ctx context.Context, client versioned.Interface, kube kubernetes.Interface, ats cnatinformers.AtInformer, pods coreinformers.PodInformer,
	recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	if o.Image == "" {
		o.Image = DefaultImage
	}
	c := &Controller{client: client, kube: kube, ats: ats.Lister(), pods: pods.Lister(), recorder: recorder, opts: o}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: Name, Workers: o.Workers, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	atsHandled, err := ats.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.Enqueue,
		UpdateFunc: func(_, newObj any) { c.Enqueue(newObj) },
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding At event handler: %w", err)
	}
	enqueueAt := c.EnqueueController(cnatv1alpha1.SchemeGroupVersion.WithKind("At"))
	podsHandled, err := pods.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueueAt,
		UpdateFunc: func(_, newObj any) { enqueueAt(newObj) },
		DeleteFunc: enqueueAt,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding pod event handler: %w", err)
	}
	c.WaitFor(atsHandled.HasSyncedChecker(), podsHandled.HasSyncedChecker())
	return c, nil
}

// sync moves an At along: it waits for the schedule, makes the pod, and
// follows it to its end. The pod carries Finalizer until its end is in
// the At's status (as the Job controller tracks its pods), so a pod that
// was made is always seen again, even deleted, and the command runs at
// most once.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	at, err := c.ats.Ats(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		// The garbage collector deletes its pod; let it go.
		return c.letGo(ctx, name, "")
	}
	if err != nil {
		return err
	}
	if at.DeletionTimestamp != nil || at.Status.Phase == cnatv1alpha1.PhaseDone {
		return c.letGo(ctx, name, at.UID)
	}
	pod, err := c.pod(ctx, at)
	if err != nil {
		return err
	}

	if pod == nil {
		if at.Status.Pod != "" {
			// Made, and gone without netop seeing its end (its
			// finalizer was removed by hand): never made again.
			msg := fmt.Sprintf("pod %s went before it ended", at.Status.Pod)
			return c.setStatus(ctx, at, cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhaseDone, Pod: at.Status.Pod, Succeeded: ptr.To(false), Message: msg},
				corev1.EventTypeWarning, ReasonFailed)
		}
		// The schedule matters only until the pod is made.
		when, err := ParseSchedule(at.Spec.Schedule)
		if err != nil {
			// The CRD refuses such a schedule; one stored before it did
			// is reported, and waits for a fix.
			return c.setStatus(ctx, at, cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhasePending, Message: err.Error()}, corev1.EventTypeWarning, ReasonInvalidSchedule)
		}
		if wait := time.Until(when); wait > 0 {
			c.AddAfter(name, wait)
			msg := "runs at " + when.UTC().Format(time.RFC3339)
			return c.setStatus(ctx, at, cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhasePending, Message: msg}, "", "")
		}
		if pod, err = c.createPod(ctx, at); err != nil {
			return err
		}
	}
	if !metav1.IsControlledBy(pod, at) {
		msg := fmt.Sprintf("pod %s exists and is not this At's: delete it or rename the At", pod.Name)
		return c.setStatus(ctx, at, cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhasePending, Message: msg}, corev1.EventTypeWarning, ReasonPodConflict)
	}
	var done cnatv1alpha1.AtStatus
	var eventType, reason string
	switch {
	case pod.Status.Phase == corev1.PodSucceeded:
		done = cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhaseDone, Pod: pod.Name, Succeeded: ptr.To(true),
			Message: fmt.Sprintf("pod %s ran the command, which exited 0", pod.Name)}
		eventType, reason = corev1.EventTypeNormal, ReasonSucceeded
	case pod.Status.Phase == corev1.PodFailed:
		// The pod cache keeps only the phase of a pod; its end is read
		// once, from the API server.
		if live, err := c.kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			pod = live
		}
		done = cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhaseDone, Pod: pod.Name, Succeeded: ptr.To(false),
			Message: fmt.Sprintf("pod %s failed: %s", pod.Name, failure(pod))}
		eventType, reason = corev1.EventTypeWarning, ReasonFailed
	case pod.DeletionTimestamp != nil:
		done = cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhaseDone, Pod: pod.Name, Succeeded: ptr.To(false),
			Message: fmt.Sprintf("pod %s was deleted before it ended", pod.Name)}
		eventType, reason = corev1.EventTypeWarning, ReasonFailed
	default:
		return c.setStatus(ctx, at, cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhaseRunning, Pod: pod.Name,
			Message: fmt.Sprintf("pod %s runs the command", pod.Name)}, corev1.EventTypeNormal, ReasonStarted)
	}
	// The end is recorded before the pod may go.
	if err := c.setStatus(ctx, at, done, eventType, reason); err != nil {
		return err
	}
	return c.release(ctx, pod)
}

// ParseSchedule reads an At's schedule: RFC 3339, as the CRD's date-time
// format accepts it (the letters in either case).
func ParseSchedule(schedule string) (time.Time, error) {
	when, err := time.Parse(time.RFC3339, strings.ToUpper(schedule))
	if err != nil {
		return time.Time{}, fmt.Errorf("spec.schedule %q is not an RFC 3339 time such as 2019-07-03T02:00:00Z: %w", schedule, err)
	}
	return when, nil
}

// createPod makes the At's pod; one that exists (made by a sync whose
// status write failed, or someone else's) is read instead.
func (c *Controller) createPod(ctx context.Context, at *cnatv1alpha1.At) (*corev1.Pod, error) {
	pod, err := c.kube.CoreV1().Pods(at.Namespace).Create(ctx, c.desiredPod(at), metav1.CreateOptions{})
	switch {
	case err == nil:
		klog.FromContext(ctx).V(1).Info("Created the At's pod", "at", klog.KObj(at), "pod", klog.KObj(pod))
		return pod, nil
	case apierrors.IsAlreadyExists(err):
		if pod, err = c.kube.CoreV1().Pods(at.Namespace).Get(ctx, at.Name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("reading pod %s/%s: %w", at.Namespace, at.Name, err)
		}
		return pod, nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
		// Pod Security, a quota, a policy: said where the user looks,
		// and retried with backoff, as the cause may go.
		msg := fmt.Sprintf("the pod cannot be made: %v", err)
		if serr := c.setStatus(ctx, at, cnatv1alpha1.AtStatus{Phase: cnatv1alpha1.PhasePending, Message: msg}, corev1.EventTypeWarning, ReasonPodRefused); serr != nil {
			return nil, serr
		}
	}
	return nil, fmt.Errorf("creating pod %s/%s: %w", at.Namespace, at.Name, err)
}

// ranBy says whether pod is the pod of the At of that name (and UID, if
// given) and still carries Finalizer.
func ranBy(pod *corev1.Pod, name string, uid types.UID) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "At" && ref.APIVersion == cnatv1alpha1.SchemeGroupVersion.String() &&
		ref.Name == name && (uid == "" || ref.UID == uid) && slices.Contains(pod.Finalizers, Finalizer)
}

// letGo releases the cached pod of the At of that name (and UID, if
// given) if it still carries Finalizer: the At is done or gone. A held pod
// is in the cache (it cannot go while held), so no read of the API server
// is needed, however often a done At is synced.
func (c *Controller) letGo(ctx context.Context, name cache.ObjectName, uid types.UID) error {
	pod, err := c.pods.Pods(name.Namespace).Get(name.Name)
	if err != nil || !ranBy(pod, name.Name, uid) {
		return nil //nolint:nilerr // no pod of the At, or not held
	}
	return c.release(ctx, pod)
}

// release removes Finalizer from the pod: its end is recorded, or its At
// is gone.
func (c *Controller) release(ctx context.Context, pod *corev1.Pod) error {
	finalizers := slices.DeleteFunc(slices.Clone(pod.Finalizers), func(f string) bool { return f == Finalizer })
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": finalizers, "resourceVersion": pod.ResourceVersion}})
	if err != nil {
		return err
	}
	_, err = c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing the finalizer of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// pod is the pod of the At's name: from the cache, and when the cache has
// none, from the API server, so that a pod just made is never made again
// and a pod that went is known to be gone. nil if there is none.
func (c *Controller) pod(ctx context.Context, at *cnatv1alpha1.At) (*corev1.Pod, error) {
	pod, err := c.pods.Pods(at.Namespace).Get(at.Name)
	if err == nil {
		return pod, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if at.Status.Pod == "" && at.Status.Phase != cnatv1alpha1.PhaseRunning {
		// Not made yet, as far as the status says; a pod made by a sync
		// whose status write failed is found when its create fails.
		return nil, nil
	}
	pod, err = c.kube.CoreV1().Pods(at.Namespace).Get(ctx, at.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading pod %s/%s: %w", at.Namespace, at.Name, err)
	}
	return pod, nil
}

// desiredPod is the pod that runs the At's command.
func (c *Controller) desiredPod(at *cnatv1alpha1.At) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: at.Name, Namespace: at.Namespace,
			Labels:          map[string]string{Label: at.Name},
			Finalizers:      []string{Finalizer},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(at, cnatv1alpha1.SchemeGroupVersion.WithKind("At"))},
		},
		// Pod Security's restricted profile: a command needs no more, and
		// no credentials.
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534), RunAsGroup: ptr.To[int64](65534),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "command", Image: c.opts.Image, Command: []string{"sh", "-c", at.Spec.Command},
				ImagePullPolicy: corev1.PullIfNotPresent,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// failure says why a failed pod failed: its container's exit, or the pod's
// own reason.
func failure(pod *corev1.Pod) string {
	for _, s := range pod.Status.ContainerStatuses {
		if t := s.State.Terminated; t != nil {
			return fmt.Sprintf("the command exited %d (%s)", t.ExitCode, t.Reason)
		}
	}
	if pod.Status.Reason != "" {
		return pod.Status.Reason + ": " + pod.Status.Message
	}
	return "no reason given"
}

// setStatus writes the status if it changed, with an Event of the reason
// (none if reason is empty).
func (c *Controller) setStatus(ctx context.Context, at *cnatv1alpha1.At, status cnatv1alpha1.AtStatus, eventType, reason string) error {
	if apiequality.Semantic.DeepEqual(at.Status, status) {
		return nil
	}
	at = at.DeepCopy()
	at.Status = status
	if _, err := c.client.CnatV1alpha1().Ats(at.Namespace).UpdateStatus(ctx, at, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing the status of At %s/%s: %w", at.Namespace, at.Name, err)
	}
	klog.FromContext(ctx).V(1).Info("At status", "at", klog.KObj(at), "phase", status.Phase, "message", status.Message)
	if reason != "" {
		c.recorder.Event(at, eventType, reason, status.Message)
	}
	return nil
}
