package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/envoy"
)

func injector(t testing.TB) *Injector {
	data, err := os.ReadFile("../../../examples/envoy-initializer.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := yaml.Unmarshal(data, cm); err != nil {
		t.Fatal(err)
	}
	cm.Namespace = "ns"
	cms := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := cms.Add(cm); err != nil {
		t.Fatal(err)
	}
	return &Injector{
		ConfigMaps: corelisters.NewConfigMapLister(cms),
		Recorder:   record.NewFakeRecorder(10),
	}
}

// bigPod is an annotated pod of about size bytes of JSON, the size at which
// an Istio version once needed 22 s to inject (istio PR #46809).
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
	return &admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw}}
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

func BenchmarkInject64KBPod(b *testing.B) {
	i := injector(b)
	req := review(bigPod(64 << 10))
	b.SetBytes(int64(len(req.Object.Raw)))
	b.ReportAllocs()
	for b.Loop() {
		if resp := i.Admit(context.Background(), req); resp.Patch == nil {
			b.Fatal("not injected")
		}
	}
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
