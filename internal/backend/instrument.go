package backend

import (
	"context"
	"time"
)

// Operations an Observer is told of.
const (
	OperationEnsure = "ensure"
	OperationDelete = "delete"
	OperationList   = "list"
)

// Observer is told of every backend operation: its name (ensure, delete,
// list), how long it took and its error.
type Observer func(operation string, d time.Duration, err error)

// Instrument returns a Backend that reports every call of b to observe. The
// result is a DriftWatcher when b is one.
func Instrument(b Backend, observe Observer) Backend {
	i := instrumented{b: b, observe: observe}
	if w, ok := b.(DriftWatcher); ok {
		return instrumentedWatcher{instrumented: i, DriftWatcher: w}
	}
	return i
}

type instrumented struct {
	b       Backend
	observe Observer
}

type instrumentedWatcher struct {
	instrumented
	DriftWatcher
}

func (i instrumented) Type() Type { return i.b.Type() }

func (i instrumented) Ensure(ctx context.Context, want Network, recorded *Ref) (Result, error) {
	start := time.Now()
	res, err := i.b.Ensure(ctx, want, recorded)
	i.observe(OperationEnsure, time.Since(start), err)
	return res, err
}

func (i instrumented) Delete(ctx context.Context, owner Owner, recorded *Ref) error {
	start := time.Now()
	err := i.b.Delete(ctx, owner, recorded)
	i.observe(OperationDelete, time.Since(start), err)
	return err
}

// InUse is not observed: it is no operation on the backend network.
func (i instrumented) InUse(ctx context.Context, owner Owner) (bool, error) {
	return i.b.InUse(ctx, owner)
}

func (i instrumented) ListOwned(ctx context.Context) ([]Observed, error) {
	start := time.Now()
	owners, err := i.b.ListOwned(ctx)
	i.observe(OperationList, time.Since(start), err)
	return owners, err
}
