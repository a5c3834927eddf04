package workload

import (
	"cmp"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/sidecar/envoy"
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
	namespaces, configMaps := factory.Core().V1().Namespaces(), factory.Core().V1().ConfigMaps()
	o.OperatorNamespace, o.Workers = operatorNamespace, 1
	var err error
	f.controller, err = New(context.Background(), Kinds(f.client, factory), namespaces, configMaps, f.recorder, metrics.New(), o)
	if err != nil {
		t.Fatal(err)
	}
	hasNamespaces := slices.ContainsFunc(objects, func(obj runtime.Object) bool { _, ok := obj.(*corev1.Namespace); return ok })
	for _, obj := range objects {
		if m, err := meta.Accessor(obj); err == nil && !hasNamespaces && obj.GetObjectKind() != nil && isWorkload(obj) {
			err = namespaces.Informer().GetIndexer().Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.GetNamespace()}})
			if err != nil {
				t.Fatal(err)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment, *appsv1.StatefulSet, *appsv1.DaemonSet, *appsv1.ReplicaSet, *batchv1.CronJob:
			err = f.kind(t, o).kind.informer.GetIndexer().Add(o)
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

func isWorkload(obj runtime.Object) bool {
	switch obj.(type) {
	case *appsv1.Deployment, *appsv1.StatefulSet, *appsv1.DaemonSet, *appsv1.ReplicaSet, *batchv1.CronJob:
		return true
	}
	return false
}

// kind is the controller of obj's kind.
func (f *fixture) kind(t *testing.T, obj runtime.Object) *kindController {
	t.Helper()
	for _, k := range f.controller.kinds {
		if reflect.TypeOf(k.kind.newObject()) == reflect.TypeOf(obj) {
			return k
		}
	}
	t.Fatalf("no controller for %T", obj)
	return nil
}

// asKind is the workload of kind with d's metadata and pod template: the
// cases are written once, for Deployments, and run for every kind.
func asKind(d *appsv1.Deployment, kind string) runtime.Object {
	switch kind {
	case "StatefulSet":
		return &appsv1.StatefulSet{ObjectMeta: d.ObjectMeta, Spec: appsv1.StatefulSetSpec{Template: d.Spec.Template}}
	case "DaemonSet":
		return &appsv1.DaemonSet{ObjectMeta: d.ObjectMeta, Spec: appsv1.DaemonSetSpec{Template: d.Spec.Template}}
	case "ReplicaSet":
		return &appsv1.ReplicaSet{ObjectMeta: d.ObjectMeta, Spec: appsv1.ReplicaSetSpec{Template: d.Spec.Template}}
	case "CronJob":
		return &batchv1.CronJob{ObjectMeta: d.ObjectMeta, Spec: batchv1.CronJobSpec{
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: d.Spec.Template}}}}
	}
	return d
}

var kindNames = []string{"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "CronJob"}

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

func apply[T runtime.Object](t *testing.T, obj T, patch []byte) T {
	t.Helper()
	original, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	out := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(T)
	merged, err := strategicpatch.StrategicMergePatch(original, patch, out)
	if err != nil {
		t.Fatalf("applying %s: %v", patch, err)
	}
	if err := json.Unmarshal(merged, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func containers(spec *corev1.PodSpec) []string {
	var names []string
	for _, c := range spec.Containers {
		names = append(names, c.Name)
	}
	return names
}

func TestSync(t *testing.T) {
	tests := []struct {
		name    string
		objects func(t *testing.T) []runtime.Object
		// reactor is given the resource of the kind under test.
		reactor func(c *fake.Clientset, resource string)
		// namespace of the Deployment web; "" is ns.
		namespace string
		options   Options
		// wantContainers is the pod template after the patch; nil: no patch.
		wantContainers []string
		wantEvents     []string
		// wantInEvents must be in every Event's message.
		wantInEvents []string
		// wantSkipped must be in the skip annotation after the patch.
		wantSkipped string
		wantOutcome string
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
		name: "the workload has a container of the template's name: skipped, the reason on the workload",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Spec.Template.Spec.Containers[0].Name = "envoy"
			return []runtime.Object{d, template("ns", sidecar)}
		},
		wantContainers: []string{"envoy"},
		wantEvents:     []string{"Warning " + ReasonSkipped},
		wantSkipped:    `already has a container "envoy"`,
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "hostNetwork: skipped with a Warning and the reason on the workload, the pod template untouched (the sidecar's ports would be the node's)",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Spec.Template.Spec.HostNetwork = true
			return []runtime.Object{d, template("ns", sidecar)}
		},
		wantContainers: []string{"app"},
		wantEvents:     []string{"Warning " + ReasonSkipped},
		wantInEvents:   []string{"hostNetwork"},
		wantSkipped:    "hostNetwork",
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "skipped before for the same reason: no patch, no Event (workloads are synced on every status update)",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Spec.Template.Spec.HostNetwork = true
			d.Annotations[envoy.Skipped] = envoy.HostNetworkSkip
			return []runtime.Object{d, template("ns", sidecar)}
		},
		wantOutcome: metrics.ResultSuccess,
	}, {
		name: "skipped before, injectable now: injected, the skip reason gone",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Annotations[envoy.Skipped] = envoy.HostNetworkSkip
			return []runtime.Object{d, template("ns", sidecar)}
		},
		wantContainers: []string{"app", "envoy"},
		wantEvents:     []string{"Normal " + ReasonInjected},
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "made by a controller (a Deployment's ReplicaSet, say): left alone, its template is its owner's",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "owner", UID: "u", Controller: ptr.To(true)}}
			return []runtime.Object{d, template("ns", sidecar)}
		},
		wantOutcome: metrics.ResultSuccess,
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
		wantSkipped:    "hostNetwork",
		wantOutcome:    metrics.ResultSuccess,
	}, {
		name: "the sidecar's port is the application's: skipped with a Warning naming both containers and the port",
		objects: func(*testing.T) []runtime.Object {
			d := deployment(true)
			d.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80}}
			return []runtime.Object{d, template("ns", strings.Replace(sidecar, "    image: lyft", "    ports: [{containerPort: 80}]\n    image: lyft", 1))}
		},
		wantContainers: []string{"app"},
		wantEvents:     []string{"Warning " + ReasonSkipped},
		wantInEvents:   []string{`port 80/TCP of container "envoy"`, `the pod's container "app"`},
		wantSkipped:    `port 80/TCP of container "envoy"`,
		wantOutcome:    metrics.ResultSuccess,
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
		reactor: func(c *fake.Clientset, resource string) {
			c.PrependReactor("patch", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewNotFound(appsv1.Resource(resource), "web")
			})
		},
		wantContainers: []string{"app", "envoy"},
		wantOutcome:    metrics.ResultNotFound,
	}, {
		name:    "patch fails: retried",
		objects: func(*testing.T) []runtime.Object { return []runtime.Object{deployment(true), template("ns", sidecar)} },
		reactor: func(c *fake.Clientset, resource string) {
			c.PrependReactor("patch", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewServiceUnavailable("injected")
			})
		},
		wantContainers: []string{"app", "envoy"},
		wantOutcome:    metrics.ResultError,
	}}
	for _, tt := range tests {
		for _, kind := range kindNames {
			t.Run(kind+"/"+tt.name, func(t *testing.T) {
				objects := tt.objects(t)
				objects[0] = asKind(objects[0].(*appsv1.Deployment), kind)
				f := newFixture(t, tt.options, objects...)
				k := f.kind(t, objects[0])
				if tt.reactor != nil {
					tt.reactor(f.client, strings.ToLower(kind)+"s")
				}

				name := cache.NewObjectName(cmp.Or(tt.namespace, "ns"), "web")
				err := k.sync(context.Background(), name)

				if got := runner.Outcome(err, name); got != tt.wantOutcome {
					t.Errorf("outcome %s (%v), want %s", got, err, tt.wantOutcome)
				}
				var patched runtime.Object
				for _, a := range f.client.Actions() {
					p, ok := a.(k8stesting.PatchAction)
					if !ok || a.GetResource().Resource != strings.ToLower(kind)+"s" {
						t.Errorf("unexpected request %s %s", a.GetVerb(), a.GetResource().Resource)
						continue
					}
					if patched != nil {
						t.Errorf("a second patch: %s", p.GetPatch())
					}
					patched = apply(t, objects[0], p.GetPatch())
				}
				switch {
				case tt.wantContainers == nil && patched != nil:
					t.Errorf("patched to %q, want no patch", containers(&k.kind.template(patched).Spec))
				case tt.wantContainers != nil && patched == nil:
					t.Errorf("no patch, want containers %q", tt.wantContainers)
				case patched != nil:
					podTemplate := k.kind.template(patched)
					if got := containers(&podTemplate.Spec); !slices.Equal(got, tt.wantContainers) {
						t.Errorf("containers %q, want %q", got, tt.wantContainers)
					}
					wantRecord := tt.wantSkipped == "" && !slices.Equal(tt.wantContainers, []string{"app"})
					if wantRecord != (podTemplate.Annotations[envoy.Injected] != "") {
						t.Errorf("injection record %q after the patch", podTemplate.Annotations[envoy.Injected])
					}
					m, _ := meta.Accessor(patched)
					if got := m.GetAnnotations()[envoy.Skipped]; !strings.Contains(got, tt.wantSkipped) || (got == "") != (tt.wantSkipped == "") {
						t.Errorf("skip annotation %q, want one saying %q", got, tt.wantSkipped)
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
}

// Workloads of kube-system and of the operator's namespace, and those a
// controller made, are not even queued; a namespace that loses its opt-out
// label has its workloads queued again.
func TestQueued(t *testing.T) {
	f := newFixture(t, Options{}, deployment(true), optedOutNamespace("ns"))
	k := f.kind(t, deployment(true))
	for _, namespace := range []string{metav1.NamespaceSystem, operatorNamespace} {
		k.enqueue(inNamespace(deployment(true), namespace))
	}
	owned := deployment(true)
	owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Owner", Name: "o", UID: "u", Controller: ptr.To(true)}}
	k.enqueue(owned)
	if n := f.controller.Len(); n != 0 {
		t.Fatalf("%d queued, want none", n)
	}
	f.controller.enqueueNamespace("ns")
	if n := f.controller.Len(); n != 1 {
		t.Fatalf("%d queued, want ns/web", n)
	}
}
