package envoy

import (
	"cmp"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

func configMap(config string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: "ns"},
		Data:       map[string]string{ConfigKey: config},
	}
}

// TestParseRejects checks that each broken template is refused with an
// error naming the ConfigMap and the field.
func TestParseRejects(t *testing.T) {
	for _, tc := range []struct {
		name, config, want string
	}{
		{"no containers", "volumes: []\n", "containers: at least one container is required"},
		{"unknown key", "containers:\n- name: envoy\n  image: envoy\nsidecars: []\n", `unknown field "sidecars"`},
		{"container without name", "containers:\n- image: envoy\n", "containers[0].name: required"},
		{"container name not a DNS label", "containers:\n- name: Envoy_1\n  image: envoy\n", `containers[0].name: "Envoy_1"`},
		{"container twice", "containers:\n- name: envoy\n  image: a\n- name: envoy\n  image: b\n", `containers[1].name: "envoy" appears twice`},
		{"container without image", "containers:\n- name: envoy\n", "containers[0].image: required"},
		{"volume without name", "containers:\n- name: envoy\n  image: envoy\nvolumes:\n- emptyDir: {}\n", "volumes[0].name: required"},
		{"volume twice", "containers:\n- name: envoy\n  image: envoy\nvolumes:\n- name: v\n  emptyDir: {}\n- name: v\n  emptyDir: {}\n", `volumes[1].name: "v" appears twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(configMap(tc.config))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tc.config)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "ns/"+ConfigMapName) {
				t.Errorf("Parse error %q, want it to name ns/%s and say %q", err, ConfigMapName, tc.want)
			}
		})
	}
}

func TestParseAcceptsTheTutorialTemplate(t *testing.T) {
	tmpl, err := Parse(configMap("containers:\n- name: envoy\n  image: lyft/envoy\nvolumes:\n- name: envoy-conf\n  configMap: {name: envoy}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Source != "ns/"+ConfigMapName || tmpl.Hash == "" {
		t.Errorf("Source %q, Hash %q", tmpl.Source, tmpl.Hash)
	}
	want := map[string]string{Injected: tmpl.Hash, InjectedContainers: "envoy", InjectedVolumes: "envoy-conf"}
	for k, v := range want {
		if got := tmpl.Annotations()[k]; got != v {
			t.Errorf("annotation %s = %q, want %q", k, got, v)
		}
	}
}

// lister holds the ConfigMaps given.
func lister(t *testing.T, cms ...*corev1.ConfigMap) corelisters.ConfigMapLister {
	t.Helper()
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, cm := range cms {
		if err := indexer.Add(cm); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewConfigMapLister(indexer)
}

func templateIn(namespace, config string) *corev1.ConfigMap {
	cm := configMap(config)
	cm.Namespace = namespace
	return cm
}

// privilegedTemplates are templates that the template policy refuses in a
// workload's namespace, each with the field its refusal must name.
var privilegedTemplates = []struct {
	name, config, field string
}{
	{"privileged", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {privileged: true}\n",
		"containers[0].securityContext.privileged: true"},
	{"added capability", "containers:\n- name: envoy\n  image: envoy\n- name: init\n  image: init\n  securityContext: {capabilities: {add: [NET_ADMIN]}}\n",
		"containers[1].securityContext.capabilities.add: [NET_ADMIN]"},
	{"hostPath", "containers:\n- name: envoy\n  image: envoy\nvolumes:\n- name: conf\n  emptyDir: {}\n- name: root\n  hostPath: {path: /}\n",
		`volumes[1].hostPath: "/"`},
	{"hostPort", "containers:\n- name: envoy\n  image: envoy\n  ports:\n  - containerPort: 80\n  - containerPort: 15000\n    hostPort: 15000\n",
		"containers[0].ports[1].hostPort: 15000"},
	{"hostProcess", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {windowsOptions: {hostProcess: true}}\n",
		"containers[0].securityContext.windowsOptions.hostProcess: true"},
	{"unmasked /proc", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {procMount: Unmasked}\n",
		"containers[0].securityContext.procMount: Unmasked"},
	{"no seccomp", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {seccompProfile: {type: Unconfined}}\n",
		"containers[0].securityContext.seccompProfile.type: Unconfined"},
	{"no AppArmor", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {appArmorProfile: {type: Unconfined}}\n",
		"containers[0].securityContext.appArmorProfile.type: Unconfined"},
	{"SELinux type", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {seLinuxOptions: {type: spc_t}}\n",
		`containers[0].securityContext.seLinuxOptions.type: "spc_t"`},
	{"SELinux user", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {seLinuxOptions: {user: system_u}}\n",
		`containers[0].securityContext.seLinuxOptions: user "system_u"`},
}

// TestPolicyRefusesNamespaceTemplates: each privileged field in a
// namespace's template is refused with a *PolicyError that names the
// ConfigMap, the key, the field, and how an administrator allows it.
func TestPolicyRefusesNamespaceTemplates(t *testing.T) {
	for _, tc := range privilegedTemplates {
		t.Run(tc.name, func(t *testing.T) {
			cm := templateIn("team-a", tc.config)
			tmpl, got, err := Finder{ConfigMaps: lister(t, cm), OperatorNamespace: "netop-system"}.Find("team-a")
			var policy *PolicyError
			if !errors.As(err, &policy) {
				t.Fatalf("Find: template %v, error %v; want a *PolicyError", tmpl, err)
			}
			if tmpl != nil || got != cm {
				t.Errorf("Find returned template %v and ConfigMap %v, want none and the refused ConfigMap", tmpl, got)
			}
			for _, want := range []string{`ConfigMap team-a/envoy-initializer key "config": `, tc.field,
				"netop-system/envoy-initializer", PrivilegedNamespaces, "--allow-privileged-templates"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestPolicyNamesEveryField: one error lists all refused fields.
func TestPolicyNamesEveryField(t *testing.T) {
	cm := templateIn("team-a", "containers:\n- name: envoy\n  image: envoy\n  securityContext: {privileged: true, capabilities: {add: [SYS_ADMIN]}}\nvolumes:\n- name: root\n  hostPath: {path: /}\n")
	_, _, err := Finder{ConfigMaps: lister(t, cm)}.Find("team-a")
	var policy *PolicyError
	if !errors.As(err, &policy) || len(policy.Fields) != 3 {
		t.Fatalf("Find: %v, want a *PolicyError with 3 fields", err)
	}
	t.Log(err)
}

// TestPolicyAllows: what the policy lets through, and who lifts it.
func TestPolicyAllows(t *testing.T) {
	privileged := "containers:\n- name: envoy\n  image: envoy\n  securityContext: {privileged: true}\nvolumes:\n- name: root\n  hostPath: {path: /}\n"
	operatorTemplate := func(annotation string) *corev1.ConfigMap {
		cm := templateIn("netop-system", "containers:\n- name: envoy\n  image: envoy\n")
		if annotation != "" {
			cm.Annotations = map[string]string{PrivilegedNamespaces: annotation}
		}
		return cm
	}
	for _, tc := range []struct {
		name      string
		finder    Finder
		objects   []*corev1.ConfigMap
		namespace string // of the workload; "" is team-a
		// want is the Source of the template found; "" a *PolicyError.
		want string
	}{
		{name: "a baseline template: root, privilege escalation, dropped capabilities, ordinary ports and volumes",
			objects: []*corev1.ConfigMap{templateIn("team-a", `containers:
- name: envoy
  image: envoy
  ports: [{containerPort: 80}]
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: true
    procMount: Default
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
    seLinuxOptions: {type: container_t, level: "s0:c1,c2"}
volumes:
- name: conf
  configMap: {name: envoy}
- name: run
  emptyDir: {}
`)},
			want: "team-a/envoy-initializer"},
		{name: "the operator namespace's template is trusted",
			objects: []*corev1.ConfigMap{templateIn("netop-system", privileged)},
			want:    "netop-system/envoy-initializer"},
		{name: "the operator namespace's own workloads use it as it is",
			objects:   []*corev1.ConfigMap{templateIn("netop-system", privileged)},
			namespace: "netop-system",
			want:      "netop-system/envoy-initializer"},
		{name: "--allow-privileged-templates",
			objects: []*corev1.ConfigMap{templateIn("team-a", privileged)},
			finder:  Finder{AllowPrivileged: true},
			want:    "team-a/envoy-initializer"},
		{name: "annotation lists the namespace",
			objects: []*corev1.ConfigMap{templateIn("team-a", privileged), operatorTemplate("team-b, team-a")},
			want:    "team-a/envoy-initializer"},
		{name: "annotation *",
			objects: []*corev1.ConfigMap{templateIn("team-a", privileged), operatorTemplate("*")},
			want:    "team-a/envoy-initializer"},
		{name: "annotation lists other namespaces",
			objects: []*corev1.ConfigMap{templateIn("team-a", privileged), operatorTemplate("team-b,team-a-x")}},
		{name: "operator template without the annotation",
			objects: []*corev1.ConfigMap{templateIn("team-a", privileged), operatorTemplate("")}},
		{name: "the annotation on the namespace's own template counts for nothing",
			objects: []*corev1.ConfigMap{func() *corev1.ConfigMap {
				cm := templateIn("team-a", privileged)
				cm.Annotations = map[string]string{PrivilegedNamespaces: "*"}
				return cm
			}()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.finder
			f.ConfigMaps, f.OperatorNamespace = lister(t, tc.objects...), "netop-system"
			namespace := cmp.Or(tc.namespace, "team-a")
			tmpl, _, err := f.Find(namespace)
			switch {
			case tc.want == "":
				var policy *PolicyError
				if !errors.As(err, &policy) {
					t.Fatalf("Find: %v, %v; want a *PolicyError", tmpl, err)
				}
			case err != nil:
				t.Fatalf("Find: %v", err)
			case tmpl == nil || tmpl.Source != tc.want:
				t.Fatalf("Find: %+v, want the template of %s", tmpl, tc.want)
			}
		})
	}
}

// TestBrokenTemplateIsNoPolicyError: a template that does not parse is the
// parse error, whatever it holds.
func TestBrokenTemplateIsNoPolicyError(t *testing.T) {
	cm := templateIn("team-a", "containers:\n- name: envoy\n  securityContext: {privileged: true}\n")
	_, _, err := Finder{ConfigMaps: lister(t, cm)}.Find("team-a")
	var policy *PolicyError
	if err == nil || errors.As(err, &policy) || !strings.Contains(err.Error(), "containers[0].image: required") {
		t.Fatalf("Find: %v, want the parse error", err)
	}
}

// Ports shared in the pod's one network namespace clash; so does a host
// port used twice; other protocols and other ports do not.
func TestPortClash(t *testing.T) {
	tmpl := &Template{Source: "ns/envoy-initializer", Containers: []corev1.Container{{Name: "envoy",
		Ports: []corev1.ContainerPort{{ContainerPort: 15001}, {ContainerPort: 9901, HostPort: 9901}}}}}
	for _, tc := range []struct {
		ports []corev1.ContainerPort
		want  string
	}{
		{nil, ""},
		{[]corev1.ContainerPort{{ContainerPort: 8080}}, ""},
		{[]corev1.ContainerPort{{ContainerPort: 15001, Protocol: corev1.ProtocolUDP}}, ""},
		{[]corev1.ContainerPort{{ContainerPort: 15001, Protocol: corev1.ProtocolTCP}}, `port 15001/TCP of container "envoy" from ns/envoy-initializer is also the port of the pod's container "app"`},
		{[]corev1.ContainerPort{{ContainerPort: 8443, HostPort: 9901}}, `host port 9901/TCP of container "envoy"`},
	} {
		got := tmpl.PortClash(&corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Ports: tc.ports}}})
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("ports %v: %q, want %q", tc.ports, got, tc.want)
		}
	}
}
