package workloads

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
)

const sidecar = "containers:\n- name: envoy\n  image: envoy\n  ports: [{containerPort: 80}]\nvolumes:\n- name: envoy-conf\n  emptyDir: {}\n"

func injector(t *testing.T) *Injector {
	cms := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := cms.Add(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: envoy.ConfigMapName, Namespace: "ns"},
		Data: map[string]string{envoy.ConfigKey: sidecar}}); err != nil {
		t.Fatal(err)
	}
	return &Injector{Templates: envoy.Finder{ConfigMaps: corelisters.NewConfigMapLister(cms), OperatorNamespace: "netop-system"}}
}

func podTemplate(port int32, hostNetwork bool) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{HostNetwork: hostNetwork,
		Containers: []corev1.Container{{Name: "app", Image: "app", Ports: []corev1.ContainerPort{{ContainerPort: port}}}}}}
}

var optIn = metav1.ObjectMeta{Namespace: "ns", Name: "w", Annotations: map[string]string{envoy.OptIn: "true"}}

// admit runs the webhook on obj of kind and returns the object patched and
// the response.
func admit(t *testing.T, i *Injector, kind string, obj runtime.Object) (runtime.Object, *admissionv1.AdmissionResponse) {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	group := "apps"
	if kind == "Job" || kind == "CronJob" {
		group = "batch"
	}
	resp := i.Admit(context.Background(), &admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: "ns", Name: "w",
		Kind:   metav1.GroupVersionKind{Group: group, Version: "v1", Kind: kind},
		Object: runtime.RawExtension{Raw: raw},
	})
	if !resp.Allowed {
		t.Fatalf("%s refused: %+v", kind, resp.Result)
	}
	if len(resp.Patch) > 0 {
		patch, err := jsonpatch.DecodePatch(resp.Patch)
		if err != nil {
			t.Fatal(err)
		}
		if raw, err = patch.Apply(raw); err != nil {
			t.Fatalf("%s: the patch does not apply: %v", kind, err)
		}
	}
	out := obj.DeepCopyObject()
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatal(err)
	}
	return out, resp
}

func TestInjectsEveryWorkloadKind(t *testing.T) {
	i := injector(t)
	for _, tc := range []struct {
		kind     string
		make     func(corev1.PodTemplateSpec) runtime.Object
		template func(runtime.Object) *corev1.PodTemplateSpec
	}{
		{"Deployment", func(p corev1.PodTemplateSpec) runtime.Object {
			return &appsv1.Deployment{ObjectMeta: optIn, Spec: appsv1.DeploymentSpec{Template: p}}
		}, func(o runtime.Object) *corev1.PodTemplateSpec { return &o.(*appsv1.Deployment).Spec.Template }},
		{"StatefulSet", func(p corev1.PodTemplateSpec) runtime.Object {
			return &appsv1.StatefulSet{ObjectMeta: optIn, Spec: appsv1.StatefulSetSpec{Template: p}}
		}, func(o runtime.Object) *corev1.PodTemplateSpec { return &o.(*appsv1.StatefulSet).Spec.Template }},
		{"DaemonSet", func(p corev1.PodTemplateSpec) runtime.Object {
			return &appsv1.DaemonSet{ObjectMeta: optIn, Spec: appsv1.DaemonSetSpec{Template: p}}
		}, func(o runtime.Object) *corev1.PodTemplateSpec { return &o.(*appsv1.DaemonSet).Spec.Template }},
		{"ReplicaSet", func(p corev1.PodTemplateSpec) runtime.Object {
			return &appsv1.ReplicaSet{ObjectMeta: optIn, Spec: appsv1.ReplicaSetSpec{Template: p}}
		}, func(o runtime.Object) *corev1.PodTemplateSpec { return &o.(*appsv1.ReplicaSet).Spec.Template }},
		{"Job", func(p corev1.PodTemplateSpec) runtime.Object {
			return &batchv1.Job{ObjectMeta: optIn, Spec: batchv1.JobSpec{Template: p}}
		}, func(o runtime.Object) *corev1.PodTemplateSpec { return &o.(*batchv1.Job).Spec.Template }},
		{"CronJob", func(p corev1.PodTemplateSpec) runtime.Object {
			return &batchv1.CronJob{ObjectMeta: optIn, Spec: batchv1.CronJobSpec{JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: p}}}}
		}, func(o runtime.Object) *corev1.PodTemplateSpec {
			return &o.(*batchv1.CronJob).Spec.JobTemplate.Spec.Template
		}},
	} {
		// Injected: the sidecar after the app, the volume, the record.
		got, _ := admit(t, i, tc.kind, tc.make(podTemplate(8080, false)))
		tmpl := tc.template(got)
		if len(tmpl.Spec.Containers) != 2 || tmpl.Spec.Containers[1].Name != "envoy" || len(tmpl.Spec.Volumes) != 1 || tmpl.Annotations[envoy.Injected] == "" {
			t.Errorf("%s: pod template after admission %+v", tc.kind, tmpl)
		}
		// Injected already: left alone.
		if _, resp := admit(t, i, tc.kind, got); len(resp.Patch) != 0 {
			t.Errorf("%s: injected twice: %s", tc.kind, resp.Patch)
		}
		// hostNetwork and a port clash: skipped, with the reason on the
		// workload and in a warning, the pod template untouched.
		for what, p := range map[string]corev1.PodTemplateSpec{"hostNetwork": podTemplate(8080, true), `port 80/TCP of container "envoy"`: podTemplate(80, false)} {
			got, resp := admit(t, i, tc.kind, tc.make(p))
			meta := got.(metav1.Object)
			if n := len(tc.template(got).Spec.Containers); n != 1 || len(resp.Warnings) != 1 || !strings.Contains(meta.GetAnnotations()[envoy.Skipped], what) {
				t.Errorf("%s, %s: %d containers, warnings %q, skip annotation %q", tc.kind, what, n, resp.Warnings, meta.GetAnnotations()[envoy.Skipped])
			}
		}
		// Not opted in: nothing.
		o := tc.make(podTemplate(8080, false))
		o.(metav1.Object).SetAnnotations(nil)
		if _, resp := admit(t, i, tc.kind, o); len(resp.Patch) != 0 {
			t.Errorf("%s not opted in: patched %s", tc.kind, resp.Patch)
		}
	}
}

// BenchmarkInject64KBDeployment measures Admit of a Deployment whose pod
// template is 64 KB of JSON, as BenchmarkInject64KBPod does for a pod, and
// reports the p99 besides the mean.
func BenchmarkInject64KBDeployment(b *testing.B) {
	cms := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := cms.Add(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: envoy.ConfigMapName, Namespace: "ns"},
		Data: map[string]string{envoy.ConfigKey: sidecar}}); err != nil {
		b.Fatal(err)
	}
	i := &Injector{Templates: envoy.Finder{ConfigMaps: corelisters.NewConfigMapLister(cms), OperatorNamespace: "netop-system"}}
	d := &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}, ObjectMeta: optIn}
	var raw []byte
	for c := 0; len(raw) < 64<<10; c++ {
		container := corev1.Container{Name: fmt.Sprintf("app-%d", c), Image: "busybox"}
		for e := range 50 {
			container.Env = append(container.Env, corev1.EnvVar{Name: fmt.Sprintf("VARIABLE_%d_%d", c, e), Value: "some value that takes a little room"})
		}
		d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, container)
		raw, _ = json.Marshal(d)
	}
	req := &admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns", Name: "w",
		Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Object: runtime.RawExtension{Raw: raw}}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	took := make([]time.Duration, 0, 1<<16)
	for b.Loop() {
		start := time.Now()
		resp := i.Admit(context.Background(), req)
		took = append(took, time.Since(start))
		if resp.Patch == nil {
			b.Fatal("not injected")
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[(len(took)-1)*99/100].Nanoseconds()), "p99-ns/op")
}

// What admission did is recorded on the workload as an Event, except for a
// dry run, which must have no side effects.
func TestEvents(t *testing.T) {
	i := injector(t)
	recorder := record.NewFakeRecorder(10)
	i.Recorder = recorder
	dryRun := true
	for _, tc := range []struct {
		port   int32
		dryRun *bool
		want   string
	}{
		{8080, nil, "Normal " + envoy.ReasonInjected},
		{80, nil, "Warning " + envoy.ReasonSkipped},
		{8080, &dryRun, ""},
		{80, &dryRun, ""},
	} {
		raw, _ := json.Marshal(&appsv1.Deployment{ObjectMeta: optIn, Spec: appsv1.DeploymentSpec{Template: podTemplate(tc.port, false)}})
		i.Admit(context.Background(), &admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns", Name: "w", DryRun: tc.dryRun,
			Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Object: runtime.RawExtension{Raw: raw}})
		var got string
		select {
		case e := <-recorder.Events:
			got = e
		default:
		}
		if tc.want == "" && got != "" || !strings.HasPrefix(got, tc.want) {
			t.Errorf("port %d, dry run %v: Event %q, want %q", tc.port, tc.dryRun != nil, got, tc.want)
		}
	}
}

// A ReplicaSet made by a Deployment carries the Deployment's opt-in
// annotation but is made from its template: injecting it would make it
// differ from the Deployment's, and the Deployment controller would make
// another. It is left alone.
func TestControlledWorkloadsAreLeftAlone(t *testing.T) {
	i := injector(t)
	rs := &appsv1.ReplicaSet{ObjectMeta: *optIn.DeepCopy(), Spec: appsv1.ReplicaSetSpec{Template: podTemplate(8080, true)}}
	rs.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "d", UID: "u", Controller: ptrTo(true)}}
	if _, resp := admit(t, i, "ReplicaSet", rs); len(resp.Patch) != 0 || len(resp.Warnings) != 0 {
		t.Errorf("a Deployment's ReplicaSet was changed: patch %s, warnings %q", resp.Patch, resp.Warnings)
	}
	rs.OwnerReferences[0].Controller = nil // owned, not controlled: its own
	if _, resp := admit(t, i, "ReplicaSet", rs); len(resp.Warnings) != 1 {
		t.Errorf("an uncontrolled ReplicaSet was not handled: warnings %q", resp.Warnings)
	}
}

func ptrTo[T any](v T) *T { return &v }

// A Job's pod template cannot change once the Job exists: an update of an
// opted-in Job that was not injected at its creation (made while the
// webhook was down) is left as it is, or the API server would refuse it.
func TestJobUpdateIsNotInjected(t *testing.T) {
	raw, err := json.Marshal(&batchv1.Job{ObjectMeta: optIn, Spec: batchv1.JobSpec{Template: podTemplate(8080, false)}})
	if err != nil {
		t.Fatal(err)
	}
	resp := injector(t).Admit(context.Background(), &admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, Namespace: "ns", Name: "w",
		Kind:   metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"},
		Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: raw},
	})
	if !resp.Allowed || len(resp.Patch) != 0 {
		t.Fatalf("Job update: allowed %v, patch %s", resp.Allowed, resp.Patch)
	}
}
