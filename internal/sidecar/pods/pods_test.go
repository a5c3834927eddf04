package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
)

// injector serves the example template of the tutorial.
func injector(t testing.TB) *Injector {
	data, err := os.ReadFile("../../../examples/envoy-initializer.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := yaml.Unmarshal(data, cm); err != nil {
		t.Fatal(err)
	}
	return injectorWith(t, cm.Data[envoy.ConfigKey])
}

// injectorWith serves the template config in namespace "ns".
func injectorWith(t testing.TB, config string) *Injector {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: envoy.ConfigMapName, Namespace: "ns"},
		Data:       map[string]string{envoy.ConfigKey: config},
	}
	cms := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := cms.Add(cm); err != nil {
		t.Fatal(err)
	}
	return &Injector{
		Templates: envoy.Finder{ConfigMaps: corelisters.NewConfigMapLister(cms)},
		Recorder:  record.NewFakeRecorder(10),
	}
}

// bigPod is an annotated pod of about size bytes of JSON, the size at which
// an Istio version once needed 22 s to inject.
func bigPod(size int) *corev1.Pod {
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "ns", Annotations: map[string]string{envoy.OptIn: "true"}},
	}
	for c := 0; ; c++ {
		container := corev1.Container{Name: fmt.Sprintf("app-%d", c), Image: "busybox"}
		for e := range 50 {
			container.Env = append(container.Env, corev1.EnvVar{Name: fmt.Sprintf("VARIABLE_%d_%d", c, e), Value: "some value that takes a little room"})
		}
		pod.Spec.Containers = append(pod.Spec.Containers, container)
		if raw, _ := json.Marshal(pod); len(raw) >= size {
			return pod
		}
	}
}

func review(pod *corev1.Pod) *admissionv1.AdmissionRequest {
	raw, _ := json.Marshal(pod)
	return &admissionv1.AdmissionRequest{UID: "u", Kind: podKind, Operation: admissionv1.Create, Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw}}
}

func TestInjectBigPodAppendsSidecar(t *testing.T) {
	pod := bigPod(64 << 10)
	resp := injector(t).Admit(context.Background(), review(pod))
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("not injected: %+v", resp.Result)
	}
	var ops []map[string]any
	if err := json.Unmarshal(resp.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	// The patch adds, it does not rewrite the pod's own containers.
	if len(ops) > 6 || slices.ContainsFunc(ops, func(op map[string]any) bool { return op["op"] != "add" }) {
		t.Fatalf("patch for a 64 KB pod: %s", resp.Patch)
	}
}

// admitAndApply admits req, which must be injected, and applies the answer
// as the API server does, with evanphx/json-patch.
func admitAndApply(t *testing.T, i *Injector, req *admissionv1.AdmissionRequest) corev1.Pod {
	t.Helper()
	resp := i.Admit(context.Background(), req)
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("%s: not injected: %+v", req.Object.Raw, resp.Result)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("decode patch %s: %v", resp.Patch, err)
	}
	patched, err := patch.Apply(req.Object.Raw)
	if err != nil {
		t.Fatalf("apply patch %s: %v", resp.Patch, err)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(patched, &pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestInjectEqualsStrategicMerge holds the pod webhook's JSON patch to the
// strategic merge of the template that the workload initializer applies:
// for every kind of pod and template, applying the patch as the API server
// does gives the same pod.
func TestInjectEqualsStrategicMerge(t *testing.T) {
	example := injector(t)
	noVolumes := injectorWith(t, "containers:\n- name: envoy\n  image: envoy\n")
	twoContainers := injectorWith(t, `containers:
- name: envoy
  image: envoy
  args: ["--mode", "serve"]
- name: envoy-init
  image: envoy-init
volumes:
- name: envoy-conf
  configMap: {name: envoy}
- name: envoy-run
  emptyDir: {}
`)
	namespaceOptIn := *twoContainers
	namespaceOptIn.NamespaceOptIn = true

	plain := bigPod(1)
	withVolumes := bigPod(1)
	withVolumes.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
	withVolumes.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	unannotated := bigPod(1)
	unannotated.Annotations = nil
	// Invalid, but the API server asks its webhooks before it validates.
	noContainers := bigPod(1)
	noContainers.Spec.Containers = []corev1.Container{}

	for _, tc := range []struct {
		name     string
		injector *Injector
		pod      *corev1.Pod
	}{
		{"64KB pod", example, bigPod(64 << 10)},
		{"example template", example, plain},
		{"template without volumes", noVolumes, plain},
		{"pod with volumes and init containers", twoContainers, withVolumes},
		{"pod without annotations", &namespaceOptIn, unannotated},
		{"pod without containers", example, noContainers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := review(tc.pod)
			got := admitAndApply(t, tc.injector, req)

			tmpl, _, err := tc.injector.Templates.Find("ns")
			if err != nil {
				t.Fatal(err)
			}
			smp, err := tmpl.Patch(&tc.pod.Spec)
			if err != nil {
				t.Fatal(err)
			}
			merged, err := envoy.Merge(req.Object.Raw, corev1.Pod{}, smp)
			if err != nil {
				t.Fatal(err)
			}

			var want corev1.Pod
			if err := json.Unmarshal(merged, &want); err != nil {
				t.Fatal(err)
			}
			if !apiequality.Semantic.DeepEqual(got, want) {
				t.Errorf("the JSON patch and the strategic merge differ:\n%s", cmp.Diff(want, got))
			}
			if n := len(got.Spec.Containers) - len(tc.pod.Spec.Containers); n != len(tmpl.Containers) {
				t.Errorf("%d containers added, want %d", n, len(tmpl.Containers))
			}
		})
	}
}

// TestInjectIntoNullAndEmpty injects into pods as the API server may send
// them, with null or empty annotations, containers and volumes (which the
// strategic merge partly refuses), and checks the patched pod.
func TestInjectIntoNullAndEmpty(t *testing.T) {
	i := injector(t)
	i.NamespaceOptIn = true
	for _, raw := range []string{
		`{"metadata":{"name":"p","namespace":"ns","annotations":null},"spec":{"containers":[{"name":"app","image":"busybox"}],"volumes":null}}`,
		`{"metadata":{"name":"p","namespace":"ns","annotations":{}},"spec":{"containers":[{"name":"app","image":"busybox"}],"volumes":[]}}`,
		`{"metadata":{"name":"p","namespace":"ns"},"spec":{"containers":null}}`,
		`{"metadata":{"name":"p","namespace":"ns","annotations":{"a~b/c":"x"}},"spec":{"containers":[{"name":"app","image":"busybox"}]}}`,
	} {
		req := &admissionv1.AdmissionRequest{UID: "u", Kind: podKind, Operation: admissionv1.Create, Namespace: "ns", Object: runtime.RawExtension{Raw: []byte(raw)}}
		got := admitAndApply(t, i, req)
		var before corev1.Pod
		if err := json.Unmarshal([]byte(raw), &before); err != nil {
			t.Fatal(err)
		}
		containers := len(got.Spec.Containers)
		if containers != len(before.Spec.Containers)+1 || got.Spec.Containers[containers-1].Name != "envoy" {
			t.Errorf("%s: containers after injection: %+v", raw, got.Spec.Containers)
		}
		if volumes := len(got.Spec.Volumes); volumes != len(before.Spec.Volumes)+1 || got.Spec.Volumes[volumes-1].Name != "envoy-conf" {
			t.Errorf("%s: volumes after injection: %+v", raw, got.Spec.Volumes)
		}
		if got.Annotations[envoy.Injected] == "" {
			t.Errorf("%s: no %s annotation after injection: %v", raw, envoy.Injected, got.Annotations)
		}
		for k, v := range before.Annotations {
			if got.Annotations[k] != v {
				t.Errorf("%s: annotation %s = %q after injection, want %q", raw, k, got.Annotations[k], v)
			}
		}
	}
}

// BenchmarkInject64KBPod measures Admit of a 64 KB pod and reports the p99
// besides the mean, since the target is a p99.
func BenchmarkInject64KBPod(b *testing.B) {
	i := injector(b)
	req := review(bigPod(64 << 10))
	b.SetBytes(int64(len(req.Object.Raw)))
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

// A template volume that the pod already has is a conflict, never a merge
// into the pod's own volume.
func TestVolumeNameConflictIsRejected(t *testing.T) {
	pod := bigPod(1)
	pod.Spec.Volumes = []corev1.Volume{{Name: "envoy-conf", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	resp := injector(t).Admit(context.Background(), review(pod))
	if resp.Allowed || resp.Result.Code != 409 {
		t.Fatalf("got allowed=%v %+v, want a 409", resp.Allowed, resp.Result)
	}
}

var podKind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

// A request for another kind is refused, not misread as a Pod.
func TestRefusesOtherKinds(t *testing.T) {
	i := &Injector{}
	req := &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"},
		Operation: admissionv1.Create, Namespace: "ns", Object: runtime.RawExtension{Raw: []byte(`{"apiVersion":"apps/v1","kind":"Deployment"}`)}}
	if resp := i.Admit(context.Background(), req); resp.Allowed || resp.Result.Code != 400 || !strings.Contains(resp.Result.Message, "apps/v1, Kind=Deployment") {
		t.Errorf("a Deployment: %+v", resp.Result)
	}
}

// A namespace's template that the template policy refuses: the pod is
// admitted without the sidecar, its skip annotation and warning name the
// ConfigMap and the field, and a Warning Event goes to the ConfigMap; with
// --allow-privileged-templates the same template is injected.
func TestPrivilegedNamespaceTemplateIsSkipped(t *testing.T) {
	i := injectorWith(t, "containers:\n- name: envoy\n  image: envoy\n  securityContext: {privileged: true}\n")
	i.Templates.OperatorNamespace = "netop-system"
	pod := bigPod(1)
	resp := i.Admit(context.Background(), review(pod))
	if !resp.Allowed {
		t.Fatalf("refused: %+v", resp.Result)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(pod)
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := json.Unmarshal(patched, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Containers) != len(pod.Spec.Containers) {
		t.Errorf("containers %d, want the pod's %d", len(got.Spec.Containers), len(pod.Spec.Containers))
	}
	const want = `ConfigMap ns/envoy-initializer key "config": containers[0].securityContext.privileged: true`
	if reason := got.Annotations[envoy.Skipped]; !strings.Contains(reason, want) {
		t.Errorf("skip annotation %q, want it to say %q", reason, want)
	}
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], want) {
		t.Errorf("warnings %q", resp.Warnings)
	}
	select {
	case e := <-i.Recorder.(*record.FakeRecorder).Events:
		if !strings.HasPrefix(e, "Warning "+envoy.ReasonInvalidTemplate) || !strings.Contains(e, want) {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no Event")
	}

	i.Templates.AllowPrivileged = true
	if got := admitAndApply(t, i, review(pod)); got.Spec.Containers[len(got.Spec.Containers)-1].Name != "envoy" {
		t.Errorf("--allow-privileged-templates: not injected: %v", got.Spec.Containers)
	}
}

// A sidecar whose port the application already uses is not injected: one of
// the two containers could never bind it. The pod is admitted as written
// and says why, naming both containers and the port.
func TestPortClashIsSkipped(t *testing.T) {
	i := injectorWith(t, "containers:\n- name: envoy\n  image: envoy\n  ports: [{containerPort: 80}]\n")
	for _, tc := range []struct {
		ports []corev1.ContainerPort
		skip  string
	}{
		{[]corev1.ContainerPort{{ContainerPort: 80}}, `port 80/TCP of container "envoy" from ns/envoy-initializer is also the port of the pod's container "app"; no sidecar`},
		{[]corev1.ContainerPort{{ContainerPort: 80, Protocol: corev1.ProtocolUDP}}, ""},
		{[]corev1.ContainerPort{{ContainerPort: 8080}}, ""},
	} {
		pod := bigPod(1)
		pod.Spec.Containers[0].Name = "app"
		pod.Spec.Containers[0].Ports = tc.ports
		got := admitAndApply(t, i, review(pod))
		if reason := got.Annotations[envoy.Skipped]; reason != tc.skip {
			t.Errorf("ports %v: skip annotation %q, want %q", tc.ports, reason, tc.skip)
		}
		if injected := len(got.Spec.Containers) > len(pod.Spec.Containers); injected != (tc.skip == "") {
			t.Errorf("ports %v: injected = %v", tc.ports, injected)
		}
	}
}
