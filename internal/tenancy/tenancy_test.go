package tenancy

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

func TestAdmits(t *testing.T) {
	network := func(selector *metav1.LabelSelector) *samplecrdv2.Network {
		return &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "neta"},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.71.0.0/24"}, NamespaceSelector: selector}}
	}
	prod := &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
	for _, tc := range []struct {
		name      string
		selector  *metav1.LabelSelector
		namespace string
		labels    map[string]string
		refused   string // "" admitted
	}{
		{name: "own namespace, no selector", namespace: "tenant-a"},
		{name: "own namespace, a selector that does not select it", selector: prod, namespace: "tenant-a"},
		{name: "other namespace, no selector", namespace: "tenant-b",
			refused: "pods of namespace tenant-b may not join Network tenant-a/neta: the Network admits pods of its own namespace only"},
		{name: "other namespace, empty selector", selector: &metav1.LabelSelector{}, namespace: "tenant-b"},
		{name: "other namespace selected", selector: prod, namespace: "tenant-b", labels: map[string]string{"env": "prod"}},
		{name: "other namespace not selected", selector: prod, namespace: "tenant-b", labels: map[string]string{"env": "dev"},
			refused: "its spec.namespaceSelector (env=prod) does not select the namespace"},
		{name: "invalid selector", namespace: "tenant-b",
			selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: "Near"}}},
			refused:  "its spec.namespaceSelector is invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Admits(network(tc.selector), tc.namespace, tc.labels)
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var notAdmitted *NotAdmittedError
			if !errors.As(err, &notAdmitted) || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("got %v, want a refusal containing %q", err, tc.refused)
			}
		})
	}
}
