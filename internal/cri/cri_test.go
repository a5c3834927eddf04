package cri

import (
	"strings"
	"testing"
)

// containerd's verbose sandbox status, trimmed to what matters.
func TestNetnsOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		info map[string]string
		want string
		err  string
	}{
		{"containerd", map[string]string{"info": `{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/run/netns/cni-1"},{"type":"ipc"}]}}}`}, "/run/netns/cni-1", ""},
		{"host network", map[string]string{"info": `{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network"}]}}}`}, "", "hostNetwork"},
		{"no network namespace", map[string]string{"info": `{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"}]}}}`}, "", "names no network namespace"},
		{"no info", map[string]string{}, "", "no info"},
		{"not JSON", map[string]string{"info": "{"}, "", "reading the runtime's verbose status"},
	} {
		got, err := netnsOf(tc.info)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %q, %v; want %q, error containing %q", tc.name, got, err, tc.want, tc.err)
		}
	}
}
