package v1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A v1 client's selector annotation that does not parse strictly admits
// the Network's own namespace only, never every namespace: null and a
// misspelt field would otherwise read as the empty selector.
func TestTakeSelector(t *testing.T) {
	for value, wantEvery := range map[string]bool{
		`{}`:                           true,
		`{"matchLabels":{"team":"b"}}`: false,
		`null`:                         false,
		` null `:                       false,
		`{"matchLabel":{"team":"b"}}`:  false,
		`{broken`:                      false,
		`{} {}`:                        false,
	} {
		m := &metav1.ObjectMeta{Annotations: map[string]string{NamespaceSelectorAnnotation: value}}
		got := takeSelector(m)
		every := got != nil && len(got.MatchLabels) == 0 && len(got.MatchExpressions) == 0
		if every != wantEvery {
			t.Errorf("%s: selector %+v, selects every namespace: %v, want %v", value, got, every, wantEvery)
		}
		if _, left := m.Annotations[NamespaceSelectorAnnotation]; left {
			t.Errorf("%s: the annotation stayed", value)
		}
	}
}
