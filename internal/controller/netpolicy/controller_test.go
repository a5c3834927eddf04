package netpolicy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/netselect"
)

// Policies are resolved again only for pod changes that can change what
// they come to: labels, the addresses a pod holds, and its end. Status
// churn (conditions, container states) costs nothing.
func TestPolicyRelevantChange(t *testing.T) {
	base := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"app": "db"},
		Annotations: map[string]string{netselect.AllocationsAnnotation: `[{"network":"ns/n","interface":"net1","ips":["10.0.0.2/24"]}]`}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, c := range []struct {
		name   string
		change func(*corev1.Pod)
		want   bool
	}{
		{"a condition", func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
		}, false},
		{"another annotation", func(p *corev1.Pod) { p.Annotations["note"] = "x" }, false},
		{"a label added", func(p *corev1.Pod) { p.Labels["tier"] = "back" }, true},
		{"a label changed", func(p *corev1.Pod) { p.Labels["app"] = "web" }, true},
		{"the labels removed", func(p *corev1.Pod) { p.Labels = nil }, true},
		{"its allocations", func(p *corev1.Pod) { p.Annotations[netselect.AllocationsAnnotation] = "[]" }, true},
		{"finished", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cur := base.DeepCopy()
			c.change(cur)
			if got := policyRelevantChange(base, cur); got != c.want {
				t.Errorf("policyRelevantChange = %v, want %v", got, c.want)
			}
		})
	}
}
