package admission

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// istioModule is the Istio whose injection test inputs the corpus test
// reads: fetched through the Go module proxy at test time, never copied
// into this repository.
const istioModule = "istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad"

// istioInputs returns the input manifests of Istio's injection tests
// (pkg/kube/inject/testdata/inject), by file name.
func istioInputs(t *testing.T) map[string][]byte {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "mod", "download", "-json", istioModule)
	cmd.Dir = t.TempDir() // outside netop's module: Istio stays out of go.mod
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s (the Go module proxy must be reachable): %v: %s", istioModule, err, out)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("go mod download %s: %v", istioModule, err)
	}
	dir := filepath.Join(mod.Dir, "pkg", "kube", "inject", "testdata", "inject")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no inputs in %s: %v", dir, err)
	}
	inputs := map[string][]byte{}
	for _, f := range files {
		// Mesh, values and operator configurations are not inputs.
		if base := filepath.Base(f); strings.Contains(base, ".iop.") || strings.Contains(base, ".mesh.") || strings.Contains(base, ".values.") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inputs[filepath.Base(f)] = data
	}
	return inputs
}

// workloadsIn decodes the workloads of the kinds netop injects into from a
// multi-document manifest (Lists included); everything else (Pods,
// Services, OpenShift's DeploymentConfigs, versions the API server no
// longer serves) is not a workload input here.
func workloadsIn(data []byte) []runtime.Object {
	var out []runtime.Object
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if err != nil {
			return out
		}
		obj, _, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			continue
		}
		if list, ok := obj.(*corev1.List); ok {
			for _, item := range list.Items {
				if o, _, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(item.Raw, nil, nil); err == nil {
					out = appendWorkload(out, o)
				}
			}
			continue
		}
		out = appendWorkload(out, obj)
	}
}

func appendWorkload(out []runtime.Object, obj runtime.Object) []runtime.Object {
	switch obj.(type) {
	case *appsv1.Deployment, *appsv1.StatefulSet, *appsv1.DaemonSet, *appsv1.ReplicaSet, *batchv1.Job, *batchv1.CronJob:
		return append(out, obj)
	}
	return out
}

// Issue 13's corpus: every workload among Istio's injection test inputs,
// opted in, is admitted (unless the API server refuses it without netop
// too), comes out either injected or skipped with the reason on it
// (hostNetwork ones skipped for that), and makes its first pods, which
// carry the sidecar exactly when the workload does. A DaemonSet makes no
// pod on an API server without nodes; its template is checked alone.
func TestIstioInjectionInputs(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	inputs := istioInputs(t)
	var mu sync.Mutex
	outcomes := map[string]int{}
	count := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		outcomes[what]++
	}
	t.Run("inputs", func(t *testing.T) {
		for _, file := range slices.Sorted(maps.Keys(inputs)) {
			objs := workloadsIn(inputs[file])
			if len(objs) == 0 {
				continue
			}
			t.Run(file, func(t *testing.T) {
				t.Parallel()
				ns := env.Namespace(t)
				createTemplate(t, env, ns)
				waitTemplateSeen(t, env, ns)
				kinds := workloadKinds(env, ns)
				for _, obj := range objs {
					k := kinds[slices.IndexFunc(kinds, func(k workloadKind) bool { return k.name == kindName(obj) })]
					m, _ := meta.Accessor(obj)
					m.SetNamespace(ns)
					annotations := map[string]string{envoy.OptIn: "true"}
					maps.Copy(annotations, m.GetAnnotations())
					annotations[envoy.OptIn] = "true"
					m.SetAnnotations(annotations)
					oneReplica(obj)
					name := fmt.Sprintf("%s %s/%s", k.name, file, m.GetName())
					// Its pods need their ServiceAccount, as they would in
					// the user's cluster.
					if sa := k.template(obj).Spec.ServiceAccountName; sa != "" && sa != "default" {
						_, err := env.Kube.CoreV1().ServiceAccounts(ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
						if err != nil && !apierrors.IsAlreadyExists(err) {
							t.Fatal(err)
						}
					}
					created, err := k.create(t.Context(), obj)
					if err != nil {
						// Refused by the API server on its own (as the
						// input stands), or because of netop?
						plain := obj.DeepCopyObject()
						pm, _ := meta.Accessor(plain)
						a := pm.GetAnnotations()
						delete(a, envoy.OptIn)
						pm.SetAnnotations(a)
						if _, plainErr := k.create(t.Context(), plain); plainErr != nil {
							count("invalid input")
							t.Logf("%s: refused without netop too: %v", name, plainErr)
							continue
						}
						t.Errorf("%s: refused only when opted in: %v", name, err)
						continue
					}
					cm, _ := meta.Accessor(created)
					tmpl := k.template(created)
					injected := slices.ContainsFunc(tmpl.Spec.Containers, func(c corev1.Container) bool { return c.Name == "envoy" })
					skipped := cm.GetAnnotations()[envoy.Skipped]
					switch {
					case injected && tmpl.Annotations[envoy.Injected] == "":
						t.Errorf("%s: has a container envoy but no injection record", name)
					case injected:
						count(k.name + " injected")
					case skipped == "":
						t.Errorf("%s: neither injected nor skipped with a reason", name)
					default:
						count(k.name + " skipped: " + reasonClass(skipped))
					}
					if tmpl.Spec.HostNetwork && (injected || !strings.Contains(skipped, "hostNetwork")) {
						t.Errorf("%s: hostNetwork, injected %v, skip reason %q", name, injected, skipped)
					}
					want := strings.Join(names(&corev1.Pod{Spec: tmpl.Spec}), " ")
					waitPodsCarry(t, env, ns, k, created, want)
				}
			})
		}
	})
	t.Logf("outcomes: %v", outcomes)
	var total int
	for what, n := range outcomes {
		if strings.Contains(what, "injected") {
			total += n
		}
	}
	if total == 0 {
		t.Error("no input was injected: the corpus did not exercise injection")
	}
}

// reasonClass groups skip reasons for the summary.
func reasonClass(reason string) string {
	for _, class := range []string{"hostNetwork", "host port", "port", "already has a container", "already has a volume"} {
		if strings.Contains(reason, class) {
			return class
		}
	}
	return reason
}

func kindName(obj runtime.Object) string {
	switch obj.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *appsv1.StatefulSet:
		return "StatefulSet"
	case *appsv1.DaemonSet:
		return "DaemonSet"
	case *appsv1.ReplicaSet:
		return "ReplicaSet"
	case *batchv1.Job:
		return "Job"
	case *batchv1.CronJob:
		return "CronJob"
	}
	return ""
}

// oneReplica keeps the corpus's load down: one pod per workload.
func oneReplica(obj runtime.Object) {
	one := ptrTo[int32](1)
	switch o := obj.(type) {
	case *appsv1.Deployment:
		o.Spec.Replicas = one
	case *appsv1.StatefulSet:
		o.Spec.Replicas = one
	case *appsv1.ReplicaSet:
		o.Spec.Replicas = one
	}
}
