package cni

import (
	"os"
	"path/filepath"
	"testing"
)

func TestStore(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "records")}
	if rs, err := s.List(); err != nil || len(rs) != 0 {
		t.Fatalf("empty store: %v %v", rs, err)
	}
	r := Record{ContainerID: "abc123", Netns: "/var/run/netns/x", Pod: "default/p",
		Interfaces: []RecordedInterface{{Interface: "net1", Network: "default/n", Bridge: "br", HostVeth: HostVethName("abc123", "net1"), IPs: []string{"192.168.0.2/16"}}}}
	if err := s.Save(r); err != nil {
		t.Fatal(err)
	}
	r.Interfaces[0].IPs = []string{"192.168.0.3/16"}
	if err := s.Save(r); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Load("abc123")
	if err != nil || !ok || got.Interfaces[0].IPs[0] != "192.168.0.3/16" {
		t.Fatalf("load: %+v %v %v", got, ok, err)
	}
	if rs, err := s.List(); err != nil || len(rs) != 1 {
		t.Fatalf("list: %v %v", rs, err)
	}
	entries, _ := os.ReadDir(s.Dir)
	if len(entries) != 1 {
		t.Errorf("files left beside the record: %v", entries)
	}
	for range 2 {
		if err := s.Remove("abc123"); err != nil {
			t.Fatalf("remove: %v", err)
		}
	}
	if _, ok, err := s.Load("abc123"); ok || err != nil {
		t.Fatalf("after remove: %v %v", ok, err)
	}
	for _, bad := range []string{"", "../escape", "a/b", ".hidden"} {
		if err := s.Save(Record{ContainerID: bad}); err == nil {
			t.Errorf("container ID %q accepted", bad)
		}
	}
}
