// Package rungroup runs the parts of a process together: the first to
// fail stops the others, and its error, named, is the group's; one that
// returns without error stops them too, since each runs until the process
// stops (the node agent's ends when its node is removed).
package rungroup

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// Group is the parts run together.
type Group struct {
	g      *errgroup.Group
	ctx    context.Context
	cancel context.CancelFunc
}

// New returns a group and the context its parts run in, done once one of
// them returned or ctx is.
func New(ctx context.Context) (*Group, context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	g, ctx := errgroup.WithContext(ctx)
	return &Group{g: g, ctx: ctx, cancel: cancel}, ctx
}

// Run runs the part f, named name in its error.
func (g *Group) Run(name string, f func(context.Context) error) {
	g.g.Go(func() error {
		defer g.cancel()
		if err := f(g.ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// Go runs f beside the parts: its return stops nothing.
func (g *Group) Go(f func(context.Context)) {
	g.g.Go(func() error { f(g.ctx); return nil })
}

// Wait waits for every part, and returns the first error.
func (g *Group) Wait() error {
	defer g.cancel()
	return g.g.Wait()
}
