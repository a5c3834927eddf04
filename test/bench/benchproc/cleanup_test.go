package benchproc

import (
	"slices"
	"testing"
)

func TestCleanupRunsLastFirstOnce(t *testing.T) {
	var ran []int
	var c Cleanup
	for i := range 3 {
		c.Add(func() { ran = append(ran, i) })
	}
	c.Run()
	c.Run()
	if want := []int{2, 1, 0}; !slices.Equal(ran, want) {
		t.Errorf("ran %v, want %v", ran, want)
	}
}
