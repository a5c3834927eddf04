package metrics

import "testing"

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/apis/samplecrd.k8s.io/v1/namespaces/ns/networks/n/status": "networks/status",
		"/apis/samplecrd.k8s.io/v1/namespaces/ns/networks/n":        "networks",
		"/apis/samplecrd.k8s.io/v1/namespaces/ns/networks":          "networks",
		"/api/v1/namespaces/ns/events":                              "events",
		"/api/v1/namespaces/ns":                                     "namespaces",
		"/api/v1/namespaces":                                        "namespaces",
		"/apis/apps/v1/namespaces/ns/deployments/d/scale":           "deployments/scale",
		"/healthz": "other",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", path, got, want)
		}
	}
}
