package cri

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// A runtime whose socket is not there is an error that says where, not
// "no sandbox": hot-plug reports it on the pod and retries.
func TestUnreachableRuntime(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "containerd.sock")
	r, err := Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = r.PodSandbox(ctx, "uid")
	if err == nil || errors.Is(err, ErrNoSandbox) || !strings.Contains(err.Error(), socket) {
		t.Errorf("PodSandbox through a missing socket: %v, want an error naming %s", err, socket)
	}
	if _, err := r.SandboxReady(ctx, "id"); err == nil {
		t.Error("SandboxReady through a missing socket: no error")
	}
}
