// Package patch builds the JSON patch operations that admission handlers
// answer with: annotations set or removed, items appended to a list. It is
// a leaf, so that the handlers and what they inject share it.
package patch

import (
	"maps"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
)

// AnnotationOps appends the operations that set the annotations add on the
// object at prefix, which has the annotations have.
func AnnotationOps(ops []jsonpatch.Operation, prefix string, have, add map[string]string) []jsonpatch.Operation {
	if len(have) == 0 {
		// There may be no annotations object to add members to.
		return append(ops, jsonpatch.NewOperation("add", prefix+"/metadata/annotations", add))
	}
	for _, key := range slices.Sorted(maps.Keys(add)) {
		ops = append(ops, jsonpatch.NewOperation("add", prefix+"/metadata/annotations/"+jsonPointerEscape(key), add[key]))
	}
	return ops
}

// RemoveAnnotationOp is the operation that removes the annotation key from
// the object at prefix, which must have it.
func RemoveAnnotationOp(prefix, key string) jsonpatch.Operation {
	return jsonpatch.NewOperation("remove", prefix+"/metadata/annotations/"+jsonPointerEscape(key), nil)
}

// AppendItems appends the operations that add items after the have
// elements of the list at path.
func AppendItems[T any](ops []jsonpatch.Operation, path string, have int, items []T) []jsonpatch.Operation {
	switch {
	case len(items) == 0:
		return ops
	case have == 0:
		// There may be no list to append to.
		return append(ops, jsonpatch.NewOperation("add", path, items))
	}
	for _, item := range items {
		ops = append(ops, jsonpatch.NewOperation("add", path+"/-", item))
	}
	return ops
}

// jsonPointerEscape escapes a key as one token of a JSON pointer (RFC 6901).
func jsonPointerEscape(s string) string {
	out := make([]byte, 0, len(s)+2)
	for i := range len(s) {
		switch s[i] {
		case '~':
			out = append(out, '~', '0')
		case '/':
			out = append(out, '~', '1')
		default:
			out = append(out, s[i])
		}
	}
	return string(out)
}
