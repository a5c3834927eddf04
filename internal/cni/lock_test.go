package cni

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A container's lock is held by one at a time, across removals of its
// file, and leaves no file once the container has no record.
func TestContainerLock(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "records")}
	lockFile := filepath.Join(s.Dir, "c1.lock")
	first, err := s.Lock("c1")
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan *ContainerLock)
	go func() {
		l, err := s.Lock("c1")
		if err != nil {
			t.Error(err)
		}
		second <- l
	}()
	// The second waits for as long as the first holds: given a quarter
	// of a second, it would have taken an unheld lock many times over.
	select {
	case <-second:
		t.Fatal("a second holder took the container's lock while the first held it")
	case <-time.After(250 * time.Millisecond):
	}
	// No record: the first removes the file the second waits on, which
	// then takes the lock on a new one.
	if err := first.Unlock(); err != nil {
		t.Fatal(err)
	}
	var l *ContainerLock
	select {
	case l = <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("the second holder did not get the lock once the first released it")
	}
	if l == nil {
		t.FailNow()
	}
	held, err := l.file.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if now, err := os.Stat(lockFile); err != nil || !os.SameFile(held, now) {
		t.Fatalf("the second holder locks a file that is not the container's lock file (%v)", err)
	}

	// With a record, the lock file stays; without, it goes.
	if err := s.Save(Record{ContainerID: "c1", Interfaces: []RecordedInterface{{Interface: "net1"}}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lockFile); err != nil {
		t.Fatalf("the lock file of a recorded container: %v", err)
	}
	l, err = s.Lock("c1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("c1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lockFile); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the lock file outlived the container's record: %v", err)
	}
	if _, err := s.Lock("../c1"); err == nil {
		t.Error("locked an invalid container ID")
	}
}
