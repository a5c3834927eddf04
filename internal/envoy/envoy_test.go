package envoy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
