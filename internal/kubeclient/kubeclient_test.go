package kubeclient

import (
	"testing"

	"k8s.io/client-go/rest"
)

func TestConfig(t *testing.T) {
	in := &rest.Config{Host: "https://example", ContentConfig: rest.ContentConfig{ContentType: JSON}}
	for contentType, accept := range map[string]string{
		Protobuf: "application/vnd.kubernetes.protobuf,application/json",
		JSON:     "application/json",
	} {
		got := Config(in, contentType)
		if got.ContentType != contentType || got.AcceptContentTypes != accept {
			t.Errorf("Config(%s): content type %q, accept %q; want %q, %q", contentType, got.ContentType, got.AcceptContentTypes, contentType, accept)
		}
	}
	if in.ContentType != JSON || in.AcceptContentTypes != "" {
		t.Errorf("Config changed its input: %+v", in.ContentConfig)
	}
	if _, err := New(in, "application/yaml"); err == nil {
		t.Error("New accepted application/yaml")
	}
}
