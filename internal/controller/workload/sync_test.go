package workload

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/envoy"
	"github.com/netop-dev/netop/internal/metrics"
)

const operatorNamespace = "netop-system"

// fixture is the workload controller on the fake clientset, its caches
// filled by hand: no API server needed.
type fixture struct {
	client     *fake.Clientset
	recorder   *record.FakeRecorder
	controller *Controller
}

func newFixture(t *testing.T, objects ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{client: fake.NewClientset(objects...), recorder: record.NewFakeRecorder(100)}
	factory := kubeinformers.NewSharedInformerFactory(f.client, 0)
	deployments, configMaps := factory.Apps().V1().Deployments(), factory.Core().V1().ConfigMaps()
	var err error
	f.controller, err = New(context.Background(), f.client, deployments, configMaps, f.recorder, metrics.New(), operatorNamespace, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objects {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			err = deployments.Informer().GetIndexer().Add(o)
		case *corev1.ConfigMap:
			err = configMaps.Informer().GetIndexer().Add(o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	f.client.ClearActions()
	return f
}

const sidecar = `containers:
  - name: envoy
    image: lyft/envoy:845747144ad5fa7a4c0d2ac8bd1d8d8bf7ac2a50
volumes:
  - name: envoy-conf
    configMap:
      name: envoy
`

func template(namespace, config string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: envoy.ConfigMapName},
		Data:       map[string]string{envoy.ConfigKey: config},
	}
}

func deployment(optIn bool) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: "3"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
		}},
	}
	if optIn {
		d.Annotations = map[string]string{envoy.OptIn: "true"}
	}
	return d
}

// injected is d with cm's template injected, as an earlier sync left it.
func injected(t *testing.T, d *appsv1.Deployment, cm *corev1.ConfigMap) *appsv1.Deployment {
	t.Helper()
	tmpl, err := envoy.Parse(cm)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := tmpl.Patch(&d.Spec.Template.Spec, "spec", "template")
	if err != nil {
		t.Fatal(err)
	}
	return apply(t, d, patch)
}

func apply(t *testing.T, d *appsv1.Deployment, patch []byte) *appsv1.Deployment {
	t.Helper()
	original, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(original, patch, appsv1.Deployment{})
	if err != nil {
		t.Fatalf("applying %s: %v", patch, err)
	}
	out := &appsv1.Deployment{}
	if err := json.Unmarshal(merged, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func containers(d *appsv1.Deployment) []string {
	var names []string
	for _, c := range d.Spec.Template.Spec.Containers {
		names = append(names, c.Name)
	}
	return names
}

func TestSync(t *testing.T) {
	tests := []struct {
		name    string
		objects func(t *testing.T) []runtime.Object
		reactor func(*fake.Clientset)
		// wantContainers is the pod template after the patch; nil: no patch.
		wantContainers []string
		wantEvents     []string
		wantOutcome    string
	}{{
		name:           "opted in, template in its namespace: injected",
		objects:        func(*testing.T) []runtime.Object { return []runtime.Object{deployment(true), template("ns", sidecar)} },
		wantContainers: []string{"app", "envoy"},
		wantEvents:     []string{"Normal " + ReasonInjected},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "opted in, template in the operator's namespace: injected",
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{deployment(true), template(operatorNamespace, sidecar)}
		},
		wantContainers: []string{"app", "envoy"},
		wantEvents:     []string{"Normal " + ReasonInjected},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name:        "opted in, no template anywhere: left alone",
		objects:     func(*testing.T) []runtime.Object { return []runtime.Object{deployment(true)} },
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "not opted in: left alone",
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{deployment(false), template("ns", sidecar)}
		},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "already injected from the current template: no patch",
		objects: func(t *testing.T) []runtime.Object {
			cm := template("ns", sidecar)
			return []runtime.Object{injected(t, deployment(true), cm), cm}
		},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "template changed: re-injected",
		objects: func(t *testing.T) []runtime.Object {
			d := injected(t, deployment(true), template("ns", sidecar))
			return []runtime.Object{d, template("ns", strings.Replace(sidecar, "name: envoy\n", "name: proxy\n", 1))}
		},
		wantContainers: []string{"app", "proxy"},
		wantEvents:     []string{"Normal " + ReasonUpdated},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "opt-in removed: sidecar taken out",
		objects: func(t *testing.T) []runtime.Object {
			cm := template("ns", sidecar)
			d := injected(t, deployment(true), cm)
			d.Annotations = nil
			return []runtime.Object{d, cm}
		},
		wantContainers: []string{"app"},
		wantEvents:     []string{"Normal " + ReasonRemoved},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "broken template: Warnings on the Deployment and the ConfigMap, not retried",
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{deployment(true), template("ns", "containers: [{image: x}]")}
		},
		wantEvents:  []string{"Warning " + ReasonInvalidTemplate, "Warning " + ReasonInvalidTemplate},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "the workload has a container of the template's name: refused",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Spec.Template.Spec.Containers[0].Name = "envoy"
			return []runtime.Object{d, template("ns", sidecar)}
		},
		wantEvents:  []string{"Warning " + ReasonNameConflict},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name:    "patch finds the Deployment gone: not retried",
		objects: func(*testing.T) []runtime.Object { return []runtime.Object{deployment(true), template("ns", sidecar)} },
		reactor: func(c *fake.Clientset) {
			c.PrependReactor("patch", "deployments", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewNotFound(appsv1.Resource("deployments"), "web")
			})
		},
		wantContainers: []string{"app", "envoy"},
		wantOutcome:    metrics.ResultNotFound,
	}, {
		name:    "patch fails: retried",
		objects: func(*testing.T) []runtime.Object { return []runtime.Object{deployment(true), template("ns", sidecar)} },
		reactor: func(c *fake.Clientset) {
			c.PrependReactor("patch", "deployments", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewServiceUnavailable("injected")
			})
		},
		wantContainers: []string{"app", "envoy"},
		wantOutcome:    metrics.ResultError,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objects := tt.objects(t)
			f := newFixture(t, objects...)
			if tt.reactor != nil {
				tt.reactor(f.client)
			}

			name := cache.NewObjectName("ns", "web")
			err := f.controller.sync(context.Background(), name)

			if got := runner.Outcome(err, name); got != tt.wantOutcome {
				t.Errorf("outcome %s (%v), want %s", got, err, tt.wantOutcome)
			}
			var patched *appsv1.Deployment
			for _, a := range f.client.Actions() {
				p, ok := a.(k8stesting.PatchAction)
				if !ok {
					t.Errorf("unexpected request %s %s", a.GetVerb(), a.GetResource().Resource)
					continue
				}
				if patched != nil {
					t.Errorf("a second patch: %s", p.GetPatch())
				}
				patched = apply(t, objects[0].(*appsv1.Deployment), p.GetPatch())
			}
			switch {
			case tt.wantContainers == nil && patched != nil:
				t.Errorf("patched to %q, want no patch", containers(patched))
			case tt.wantContainers != nil && patched == nil:
				t.Errorf("no patch, want containers %q", tt.wantContainers)
			case patched != nil:
				if got := containers(patched); !slices.Equal(got, tt.wantContainers) {
					t.Errorf("containers %q, want %q", got, tt.wantContainers)
				}
				if removed := slices.Equal(tt.wantContainers, []string{"app"}); removed != (patched.Spec.Template.Annotations[envoy.Injected] == "") {
					t.Errorf("injection record %q after the patch", patched.Spec.Template.Annotations[envoy.Injected])
				}
			}
			var events []string
			for len(f.recorder.Events) > 0 {
				fields := strings.Fields(<-f.recorder.Events)
				events = append(events, fields[0]+" "+fields[1])
			}
			if !slices.Equal(events, tt.wantEvents) {
				t.Errorf("Events %q, want %q", events, tt.wantEvents)
			}
		})
	}
}
