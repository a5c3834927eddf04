// Package backendtest is a scriptable backend for tests of what sits on a
// backend (the Network controller, the operator, fault tests). By itself
// it keeps networks in memory and behaves like a real backend: Ensure
// creates or updates, Delete removes, ListOwned lists, and Drift plays a
// change made behind netop's back. Wrapped around a real backend it passes
// calls through. Either way a test can make calls fail or slow, and count
// what was asked.
package backendtest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/backend"
)

// Backend is a backend.Backend and a backend.DriftWatcher for tests. The
// zero value is not usable; use New or Wrap.
type Backend struct {
	inner backend.Backend

	mu       sync.Mutex
	networks map[types.UID]backend.Observed
	fail     map[string]error
	latency  time.Duration
	calls    map[string]int
	ensured  map[types.UID]bool
	inUse    map[types.UID]bool
	changes  int
	watchers map[int]func(backend.Owner)
	nextID   int
}

// New returns an empty in-memory backend that says it is a linux one.
func New() *Backend {
	return &Backend{
		networks: map[types.UID]backend.Observed{},
		fail:     map[string]error{},
		calls:    map[string]int{},
		ensured:  map[types.UID]bool{},
		inUse:    map[types.UID]bool{},
	}
}

// Wrap returns a backend that passes every call to inner, unless a test
// made it fail. It watches drift through inner when inner can.
func Wrap(inner backend.Backend) *Backend {
	b := New()
	b.inner = inner
	return b
}

// Fail makes the operations named (backend.OperationEnsure, ...; none: all)
// fail with err, until Fail is called again with a nil err.
func (b *Backend) Fail(err error, operations ...string) {
	if len(operations) == 0 {
		operations = []string{backend.OperationEnsure, backend.OperationDelete, backend.OperationList}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, op := range operations {
		if err == nil {
			delete(b.fail, op)
		} else {
			b.fail[op] = err
		}
	}
}

// SetLatency makes every call take d first (or until its context ends).
func (b *Backend) SetLatency(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.latency = d
}

// Calls is how many times the operation was called, failed calls included.
func (b *Backend) Calls(operation string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[operation]
}

// EnsuredUIDs lists the owners Ensure was called for.
func (b *Backend) EnsuredUIDs() []types.UID {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Collect(maps.Keys(b.ensured))
}

// ResetCounts sets every count back to zero.
func (b *Backend) ResetCounts() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.calls)
	clear(b.ensured)
	b.changes = 0
}

// Changes is how many networks were created, updated or deleted.
func (b *Backend) Changes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changes
}

// Put adds or replaces a network of the in-memory backend, as if it had
// been there before (an orphan, a network changed by hand). Put, Networks
// and Drift script the in-memory backend: a wrapped backend is
// scripted through itself.
func (b *Backend) Put(o backend.Observed) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.networks[o.UID] = o
}

// Networks lists the in-memory backend's networks, by UID.
func (b *Backend) Networks() map[types.UID]backend.Observed {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.networks)
}

// Drift tells the drift watchers that owner's network changed.
func (b *Backend) Drift(owner backend.Owner) {
	b.mu.Lock()
	watchers := slices.Collect(maps.Values(b.watchers))
	b.mu.Unlock()
	for _, w := range watchers {
		w(owner)
	}
}

// Status is what the in-memory backend records for a Network of uid.
func Status(uid types.UID) backend.Ref {
	id := strings.ReplaceAll(string(uid), "-", "")
	return backend.Ref{Type: backend.TypeLinux, Interface: "netop" + id[:min(10, len(id))]}
}

// begin counts a call, waits the latency and returns the scripted error.
func (b *Backend) begin(ctx context.Context, operation string, uid types.UID) error {
	b.mu.Lock()
	b.calls[operation]++
	if operation == backend.OperationEnsure {
		b.ensured[uid] = true
	}
	latency, err := b.latency, b.fail[operation]
	b.mu.Unlock()
	if latency > 0 {
		select {
		case <-time.After(latency):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// Type implements backend.Backend.
func (b *Backend) Type() backend.Type {
	if b.inner != nil {
		return b.inner.Type()
	}
	return backend.TypeLinux
}

// Ensure implements backend.Backend.
func (b *Backend) Ensure(ctx context.Context, want backend.Network, recorded *backend.Ref) (backend.Result, error) {
	if err := b.begin(ctx, backend.OperationEnsure, want.UID); err != nil {
		return backend.Result{}, err
	}
	var res backend.Result
	if b.inner != nil {
		var err error
		if res, err = b.inner.Ensure(ctx, want, recorded); err != nil {
			return res, err
		}
	} else {
		if err := want.Validate(); err != nil {
			return backend.Result{}, err
		}
		b.mu.Lock()
		have, ok := b.networks[want.UID]
		switch {
		case !ok:
			res.Action = backend.ActionCreated
		case !have.Provides(want):
			res.Action = backend.ActionUpdated
		}
		res.Status = Status(want.UID)
		b.networks[want.UID] = backend.Observed{Owner: want.Owner, Status: res.Status, Families: want.Families}
		b.mu.Unlock()
	}
	if res.Action != backend.ActionNone {
		b.mu.Lock()
		b.changes++
		b.mu.Unlock()
	}
	return res, nil
}

// Delete implements backend.Backend.
func (b *Backend) Delete(ctx context.Context, owner backend.Owner, recorded *backend.Ref) error {
	if err := b.begin(ctx, backend.OperationDelete, owner.UID); err != nil {
		return err
	}
	if b.inner != nil {
		if err := b.inner.Delete(ctx, owner, recorded); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.networks, owner.UID)
	b.changes++
	return nil
}

// InUse implements backend.Backend: through the wrapped backend, else as
// SetInUse said.
func (b *Backend) InUse(ctx context.Context, owner backend.Owner) (bool, error) {
	if b.inner != nil {
		return b.inner.InUse(ctx, owner)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inUse[owner.UID], nil
}

// SetInUse says whether something on the node is attached to the network
// of uid.
func (b *Backend) SetInUse(uid types.UID, inUse bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inUse[uid] = inUse
}

// ListOwned implements backend.Backend.
func (b *Backend) ListOwned(ctx context.Context) ([]backend.Observed, error) {
	if err := b.begin(ctx, backend.OperationList, ""); err != nil {
		return nil, err
	}
	if b.inner != nil {
		return b.inner.ListOwned(ctx)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Collect(maps.Values(b.networks)), nil
}

// WatchDrift implements backend.DriftWatcher: through the wrapped backend
// when it watches, else by Drift.
func (b *Backend) WatchDrift(ctx context.Context, changed func(backend.Owner)) error {
	if w, ok := b.inner.(backend.DriftWatcher); ok {
		return w.WatchDrift(ctx, changed)
	}
	b.mu.Lock()
	if b.watchers == nil {
		b.watchers = map[int]func(backend.Owner){}
	}
	id := b.nextID
	b.nextID++
	b.watchers[id] = changed
	b.mu.Unlock()
	<-ctx.Done()
	b.mu.Lock()
	delete(b.watchers, id)
	b.mu.Unlock()
	return fmt.Errorf("drift watch: %w", ctx.Err())
}
