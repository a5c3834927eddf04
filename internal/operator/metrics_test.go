package operator

import (
	"context"
	"errors"
	"testing"

	"github.com/netop-dev/netop/internal/component"
)

// /readyz is ready once the caches are synced and every component says it
// is ready, and names the reason of the first that is not.
func TestReadyzAsksComponents(t *testing.T) {
	waiting := &readiness{err: errors.New("the CNI plugin is not installed yet")}
	op := &Operator{shared: shared{Context: &component.Context{Synced: make(chan struct{})}, opts: &Options{}}, built: []builtComponent{{name: "node agent", runnable: waiting}}}
	if _, err := op.readyz(); err == nil {
		t.Error("readyz before the caches synced: ready")
	}
	close(op.Synced)
	if _, err := op.readyz(); !errors.Is(err, waiting.err) {
		t.Errorf("readyz with a component not ready: %v, want %v", err, waiting.err)
	}
	waiting.err = nil
	if _, err := op.readyz(); err != nil {
		t.Errorf("readyz with every component ready: %v", err)
	}
}

type readiness struct{ err error }

func (*readiness) Run(context.Context) error { return nil }
func (r *readiness) Ready() error            { return r.err }
