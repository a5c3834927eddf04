package patch

import "testing"

func TestJSONPointerEscape(t *testing.T) {
	for in, want := range map[string]string{
		"initializer.kubernetes.io/envoy-skipped": "initializer.kubernetes.io~1envoy-skipped",
		"a~b/c": "a~0b~1c",
		"~1":    "~01",
		"":      "",
	} {
		if got := jsonPointerEscape(in); got != want {
			t.Errorf("jsonPointerEscape(%q) = %q, want %q", in, got, want)
		}
	}
}
