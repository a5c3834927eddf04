package rungroup

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A part that fails stops the others, and the group's error names it; one
// that returns stops them too; Go's return stops nothing.
func TestGroup(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		ret  error
	}{{"fails", boom}, {"returns", nil}} {
		g, _ := New(context.Background())
		g.Go(func(context.Context) {})
		g.Run("waiter", func(ctx context.Context) error { <-ctx.Done(); return nil })
		g.Run("part", func(context.Context) error { return tc.ret })
		err := g.Wait()
		if tc.ret == nil && err != nil || tc.ret != nil && (!errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "part: ")) {
			t.Errorf("%s: Wait = %v", tc.name, err)
		}
	}
}
