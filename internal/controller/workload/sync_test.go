package workload

import (
	"cmp"
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

// newFixture caches the objects, and the namespaces of the Deployments
// among them unless objects has Namespaces.
func newFixture(t *testing.T, o Options, objects ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{client: fake.NewClientset(objects...), recorder: record.NewFakeRecorder(100)}
	factory := kubeinformers.NewSharedInformerFactory(f.client, 0)
	deployments, namespaces, configMaps := factory.Apps().V1().Deployments(), factory.Core().V1().Namespaces(), factory.Core().V1().ConfigMaps()
	o.OperatorNamespace, o.Workers = operatorNamespace, 1
	var err error
	f.controller, err = New(context.Background(), f.client, deployments, namespaces, configMaps, f.recorder, metrics.New(), o)
	if err != nil {
		t.Fatal(err)
	}
	hasNamespaces := slices.ContainsFunc(objects, func(obj runtime.Object) bool { _, ok := obj.(*corev1.Namespace); return ok })
	for _, obj := range objects {
		if d, ok := obj.(*appsv1.Deployment); ok && !hasNamespaces {
			err = namespaces.Informer().GetIndexer().Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: d.Namespace}})
		}
		if err != nil {
			t.Fatal(err)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			err = deployments.Informer().GetIndexer().Add(o)
		case *corev1.Namespace:
			err = namespaces.Informer().GetIndexer().Add(o)
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

// privilegedSidecar is what the template policy refuses in a namespace's
// template.
const privilegedSidecar = `containers:
  - name: envoy
    image: envoy
    securityContext:
      privileged: true
    volumeMounts:
      - name: host
        mountPath: /host
volumes:
  - name: host
    hostPath:
      path: /
`

func inNamespace(d *appsv1.Deployment, namespace string) *appsv1.Deployment {
	d.Namespace = namespace
	return d
}

func optedOutNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{envoy.NamespaceLabel: envoy.NamespaceLabelDisabled}}}
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
		// namespace of the Deployment web; "" is ns.
		namespace string
		options   Options
		// wantContainers is the pod template after the patch; nil: no patch.
		wantContainers []string
		wantEvents     []string
		// wantInEvents must be in every Event's message.
		wantInEvents []string
		wantOutcome  string
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
		name: "hostNetwork: skipped with a Warning, no patch (the sidecar's ports would be the node's)",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Spec.Template.Spec.HostNetwork = true
			return []runtime.Object{d, template("ns", sidecar)}
		},
		wantEvents:   []string{"Warning " + ReasonSkipped},
		wantInEvents: []string{"hostNetwork"},
		wantOutcome:  metrics.ResultSuccess,
	}, {
		name: "became hostNetwork after the injection: the sidecar is taken out",
		objects: func(t *testing.T) []runtime.Object {
			cm := template("ns", sidecar)
			d := injected(t, deployment(true), cm)
			d.Spec.Template.Spec.HostNetwork = true
			return []runtime.Object{d, cm}
		},
		wantContainers: []string{"app"},
		wantEvents:     []string{"Warning " + ReasonSkipped, "Normal " + ReasonRemoved},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "the sidecar's port is the application's: skipped with a Warning naming both containers and the port",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80}}
			return []runtime.Object{d, template("ns", strings.Replace(sidecar, "    image: lyft", "    ports: [{containerPort: 80}]\n    image: lyft", 1))}
		},
		wantEvents:   []string{"Warning " + ReasonSkipped},
		wantInEvents: []string{`port 80/TCP of container "envoy"`, `the pod's container "app"`},
		wantOutcome:  metrics.ResultSuccess,
	}, {
		name: "a namespace's template the policy refuses: Warnings naming the ConfigMap and the field, no patch",
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{deployment(true), template("ns", privilegedSidecar), template(operatorNamespace, sidecar)}
		},
		wantEvents:   []string{"Warning " + ReasonInvalidTemplate, "Warning " + ReasonInvalidTemplate},
		wantInEvents: []string{`ConfigMap ns/envoy-initializer key "config": `, "containers[0].securityContext.privileged: true", `volumes[0].hostPath: "/"`},
		wantOutcome:  metrics.ResultSuccess,
	}, {
		name: "a namespace's privileged template with --allow-privileged-templates: injected",
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{deployment(true), template("ns", privilegedSidecar)}
		},
		options:        Options{AllowPrivilegedTemplates: true},
		wantContainers: []string{"app", "envoy"},
		wantEvents:     []string{"Normal " + ReasonInjected},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "a namespace's privileged template that the operator's template allows: injected",
		objects: func(*testing.T) []runtime.Object {
			allowing := template(operatorNamespace, sidecar)
			allowing.Annotations = map[string]string{envoy.PrivilegedNamespaces: "other,ns"}
			return []runtime.Object{deployment(true), template("ns", privilegedSidecar), allowing}
		},
		wantContainers: []string{"app", "envoy"},
		wantEvents:     []string{"Normal " + ReasonInjected},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "the operator's privileged template: injected",
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{deployment(true), template(operatorNamespace, privilegedSidecar)}
		},
		wantContainers: []string{"app", "envoy"},
		wantEvents:     []string{"Normal " + ReasonInjected},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name:      "kube-system: left alone",
		namespace: metav1.NamespaceSystem,
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{inNamespace(deployment(true), metav1.NamespaceSystem), template(metav1.NamespaceSystem, sidecar), template(operatorNamespace, sidecar)}
		},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name:      "the operator's namespace: left alone",
		namespace: operatorNamespace,
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{inNamespace(deployment(true), operatorNamespace), template(operatorNamespace, sidecar)}
		},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "a namespace opted out: left alone",
		objects: func(*testing.T) []runtime.Object {
			return []runtime.Object{deployment(true), optedOutNamespace("ns"), template("ns", sidecar)}
		},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "a namespace opted out: an injected sidecar is not taken out either",
		objects: func(t *testing.T) []runtime.Object {
			cm := template("ns", sidecar)
			d := injected(t, deployment(true), cm)
			d.Annotations = nil
			return []runtime.Object{d, optedOutNamespace("ns"), cm}
		},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "a namespace opted in by label is initialized",
		objects: func(*testing.T) []runtime.Object {
			ns := optedOutNamespace("ns")
			ns.Labels[envoy.NamespaceLabel] = envoy.NamespaceLabelEnabled
			return []runtime.Object{deployment(true), ns, template("ns", sidecar)}
		},
		wantContainers: []string{"app", "envoy"},
		wantEvents:     []string{"Normal " + ReasonInjected},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "the namespace not cached yet: retried, not patched",
		objects: func(*testing.T) []runtime.Object {
			// A Namespace keeps newFixture from caching ns.
			return []runtime.Object{deployment(true), optedOutNamespace("other"), template("ns", sidecar)}
		},
		wantOutcome: metrics.ResultError,
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
			f := newFixture(t, tt.options, objects...)
			if tt.reactor != nil {
				tt.reactor(f.client)
			}

			name := cache.NewObjectName(cmp.Or(tt.namespace, "ns"), "web")
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
				event := <-f.recorder.Events
				fields := strings.Fields(event)
				events = append(events, fields[0]+" "+fields[1])
				for _, want := range tt.wantInEvents {
					if !strings.Contains(event, want) {
						t.Errorf("Event %q does not say %q", event, want)
					}
				}
			}
			if !slices.Equal(events, tt.wantEvents) {
				t.Errorf("Events %q, want %q", events, tt.wantEvents)
			}
		})
	}
}

// Deployments of kube-system and of the operator's namespace are not even
// queued; a namespace that loses its opt-out label has its Deployments
// queued again.
func TestQueued(t *testing.T) {
	f := newFixture(t, Options{}, deployment(true), optedOutNamespace("ns"))
	for _, namespace := range []string{metav1.NamespaceSystem, operatorNamespace} {
		f.controller.enqueueDeployment(inNamespace(deployment(true), namespace))
	}
	if n := f.controller.Len(); n != 0 {
		t.Fatalf("%d queued, want none", n)
	}
	f.controller.enqueueNamespace("ns")
	if n := f.controller.Len(); n != 1 {
		t.Fatalf("%d queued, want ns/web", n)
	}
}
