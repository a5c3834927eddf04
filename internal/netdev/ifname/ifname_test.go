package ifname

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestBridge(t *testing.T) {
	tests := map[types.UID]string{
		"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0": "netop0f1e2d3c4b",
		"0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0": "netop0f1e2d3c4b",
		"01234567-89ab-cdef-0123-456789abcdef": "netop0123456789",
		"":                                     "netop",
		"../../x":                              "netop",
	}
	for uid, want := range tests {
		if got := Bridge(uid); got != want {
			t.Errorf("Bridge(%q) = %q, want %q", uid, got, want)
		}
		if len(Bridge(uid)) > Size {
			t.Errorf("Bridge(%q) is longer than IFNAMSIZ", uid)
		}
	}
}

func TestHostVeth(t *testing.T) {
	a, b := HostVeth("c0ffee", "net1"), HostVeth("c0ffee", "net2")
	if a == b {
		t.Errorf("HostVeth gives %q to two interfaces of one container", a)
	}
	if a != HostVeth("c0ffee", "net1") {
		t.Errorf("HostVeth is not the same on ADD and DEL")
	}
	long := HostVeth(string(make([]byte, 128)), "net1")
	if len(a) > Size || len(long) > Size {
		t.Errorf("HostVeth names %q, %q are longer than IFNAMSIZ", a, long)
	}
}

func TestIsHostVeth(t *testing.T) {
	if name := HostVeth("0123abcd", "net1"); !IsHostVeth(name) {
		t.Errorf("IsHostVeth(%q) = false for a name HostVeth made", name)
	}
	for _, name := range []string{"", "nv", "eth0", "nv0123456789ABC", "nv0123456789ab", "nv0123456789abcd", "xv0123456789abc", "nv0123456789ab-"} {
		if IsHostVeth(name) {
			t.Errorf("IsHostVeth(%q) = true", name)
		}
	}
}
