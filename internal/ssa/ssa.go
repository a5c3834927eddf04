// Package ssa writes objects the one way netop writes whole objects it
// owns (CRDs, webhook configurations): a server-side apply under netop's
// field manager, forced, so that what netop declares wins and fields it
// stops declaring are removed (fields set by create or update are left
// to whoever edits them), with no
// read-modify-write race.
package ssa

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// FieldManager is the name netop's server-side applies are recorded under.
const FieldManager = "netop"

// Patcher is the Patch method that every typed client has.
type Patcher[T any] interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

// Apply applies obj, named name, through client. obj must carry its
// apiVersion and kind, as every apply body does.
func Apply[T any](ctx context.Context, client Patcher[T], name string, obj any) (T, error) {
	var zero T
	body, err := json.Marshal(obj)
	if err != nil {
		return zero, fmt.Errorf("encoding %s: %w", name, err)
	}
	force := true
	out, err := client.Patch(ctx, name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
	if err != nil {
		return zero, fmt.Errorf("applying %s: %w", name, err)
	}
	return out, nil
}
