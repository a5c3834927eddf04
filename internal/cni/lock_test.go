package cni

import (
	"path/filepath"
	"testing"
	"time"
)

// A container's lock is held by one at a time, and does not hold up
// another container's.
func TestContainerLock(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "records")}
	first, err := s.Lock("c1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Lock("c2")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Unlock(); err != nil {
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
	if err := first.Unlock(); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-second:
		if l != nil {
			if err := l.Unlock(); err != nil {
				t.Fatal(err)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second holder did not get the lock once the first released it")
	}
	if _, err := s.Lock("../c1"); err == nil {
		t.Error("locked an invalid container ID")
	}
}
