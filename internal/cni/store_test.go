package cni

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/netop-dev/netop/internal/netdev/ifname"
)

func TestStore(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "records")}
	if rs, bad, err := s.List(); err != nil || len(rs) != 0 || len(bad) != 0 {
		t.Fatalf("empty store: %v %v %v", rs, bad, err)
	}
	r := Record{ContainerID: "abc123", Netns: "/var/run/netns/x", Pod: "default/p",
		Interfaces: []RecordedInterface{{Interface: "net1", Network: "default/n", Bridge: "br", HostVeth: ifname.HostVeth("abc123", "net1"), IPs: []string{"192.168.0.2/16"}}}}
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
	if rs, bad, err := s.List(); err != nil || len(rs) != 1 || len(bad) != 0 {
		t.Fatalf("list: %v %v %v", rs, bad, err)
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
	for _, bad := range []string{"", "../escape", "a/b", ".hidden", "-flag", "a\x00b", "é", strings.Repeat("a", 129)} {
		if err := s.Save(Record{ContainerID: bad}); err == nil {
			t.Errorf("container ID %q accepted", bad)
		}
	}
	for _, good := range []string{"a", "Z9_.-x", strings.Repeat("f", 128)} {
		if err := s.Save(Record{ContainerID: good}); err != nil {
			t.Errorf("container ID %q refused: %v", good, err)
		}
	}
}

// A record that is not one (another version's, edited by hand) is listed
// apart, so that no caller takes its container for holding nothing, and
// does not stop the listing of the others; a file not named as records are
// is passed over.
func TestListUnreadable(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	if err := s.Save(Record{ContainerID: "good", Interfaces: []RecordedInterface{{Interface: "net1"}}}); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"bad.json": "{not json", "foo bar.json": "{}", ".json": "{}", "notes.txt": "x"} {
		if err := os.WriteFile(filepath.Join(s.Dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	records, unreadable, err := s.List()
	if err != nil || len(records) != 1 || records[0].ContainerID != "good" || !slices.Equal(unreadable, []string{"bad"}) {
		t.Fatalf("List: records %+v, unreadable %v, %v; want good, and bad unreadable", records, unreadable, err)
	}
	if _, ok, err := s.Load("bad"); ok || !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "record of bad") {
		t.Errorf("Load of an unreadable record: %v %v, want ErrUnreadable naming it", ok, err)
	}
}

// Forget returns the store's errors rather than dropping them: a record
// it cannot rewrite or remove is one DEL or GC must try again.
func TestForgetReturnsStoreErrors(t *testing.T) {
	record := Record{ContainerID: "c-forget", Netns: "/run/netns/x", Pod: "ns1/pod1", Interfaces: []RecordedInterface{
		{Config: "netop-test", Interface: "net1", Network: "ns1/a"}, {Config: "netop-test", Interface: "net2", Network: "ns1/b"},
	}}
	// A file where the records' directory should be.
	broken := Store{Dir: filepath.Join(t.TempDir(), "records")}
	if err := os.WriteFile(broken.Dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := broken.Forget(record, []string{"net1"}); err == nil || !strings.Contains(err.Error(), "c-forget") || !strings.Contains(err.Error(), "net1") {
		t.Errorf("forgetting one of two, records unwritable: %v", err)
	}
	if err := broken.Forget(record, []string{"net1", "net2"}); err == nil || !strings.Contains(err.Error(), "removing the record of c-forget") {
		t.Errorf("forgetting all, records unwritable: %v", err)
	}

	store := Store{Dir: filepath.Join(t.TempDir(), "records")}
	if err := store.Save(record); err != nil {
		t.Fatal(err)
	}
	if err := store.Forget(record, []string{"net1"}); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := store.Load("c-forget"); err != nil || !ok || len(got.Interfaces) != 1 || got.Interfaces[0].Interface != "net2" {
		t.Errorf("after forgetting net1: %+v %v %v", got, ok, err)
	}
	if len(record.Interfaces) != 2 {
		t.Errorf("forget changed its caller's record: %+v", record.Interfaces)
	}
	if err := store.Forget(record, []string{"net1", "net2"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := store.Load("c-forget"); ok || err != nil {
		t.Errorf("record left after forgetting all: %v %v", ok, err)
	}
}
