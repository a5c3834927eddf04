package standalone

import (
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// The moment netop-standalone prints its kubeconfig line, on a busy
// machine, admission is in force as a script that applies manifests then
// relies on it: a Network whose gateway is its network address is refused
// by the webhook, and of two overlapping Networks created back to back (as
// one kubectl apply does) the second is refused. Each round starts a
// standalone on a new data directory, where no webhook configuration of an
// earlier start exists.
func TestReadyMeansAdmissionInForce(t *testing.T) {
	nettest.RequireRoot(t)
	rounds, pairs := envInt(t, "NETOP_READY_ROUNDS", 5), envInt(t, "NETOP_READY_PAIRS", 10)
	testenv.BurnCPU(t)
	for round := range rounds {
		sa := startStandalone(t, t.TempDir())
		nets := versioned.NewForConfigOrDie(restConfig(t, sa.kubeconfig)).SamplecrdV1().Networks("default")
		ctx := t.Context()
		create := func(name, cidr, gateway string) error {
			_, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: samplecrdv1.NetworkSpec{CIDR: cidr, Gateway: gateway}}, metav1.CreateOptions{})
			return err
		}
		// refusedByWebhook says why err is not netop's refusal, or "".
		refusedByWebhook := func(err error) string {
			switch {
			case err == nil:
				return "admitted"
			case !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "admission webhook"):
				return fmt.Sprintf("not refused by netop's webhook: %v", err)
			}
			return ""
		}
		if why := refusedByWebhook(create("bad", "10.11.0.0/24", "10.11.0.0")); why != "" {
			t.Errorf("round %d: a Network whose gateway is its network address, applied at once: %s", round, why)
		}
		for i := range pairs {
			first := fmt.Sprintf("10.12.%d.0/24", i)
			if err := create(fmt.Sprintf("first-%d", i), first, ""); err != nil {
				t.Errorf("round %d: Network %s: %v", round, first, err)
				continue
			}
			second := fmt.Sprintf("10.12.%d.128/25", i)
			if why := refusedByWebhook(create(fmt.Sprintf("second-%d", i), second, "")); why != "" {
				t.Errorf("round %d: %s right after %s, which it overlaps: %s", round, second, first, why)
			}
		}
		sa.stop(t)
		if t.Failed() {
			return
		}
	}
}
