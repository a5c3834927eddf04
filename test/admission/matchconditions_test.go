package admission

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

const (
	validateNetworks = "networks.validate.samplecrd.k8s.io"
	defaultNetworks  = "networks.default.samplecrd.k8s.io"
)

// webhookCalls returns how often the API server called each webhook, by
// webhook name and operation ("networks.default.samplecrd.k8s.io UPDATE"),
// from its own metrics: a call counts whatever the webhook answered.
func webhookCalls(ctx context.Context, t *testing.T, env *testenv.Env) map[string]float64 {
	t.Helper()
	raw, err := env.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("API server metrics: %v", err)
	}
	const metric = "apiserver_admission_webhook_admission_duration_seconds_count{"
	calls := map[string]float64{}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), metric)
		if !ok {
			continue
		}
		found = true
		labels, value, ok := strings.Cut(line, "} ")
		if !ok {
			t.Fatalf("metric line %q", sc.Text())
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", sc.Text(), err)
		}
		var name, operation string
		for l := range strings.SplitSeq(labels, ",") {
			k, val, _ := strings.Cut(l, "=")
			switch k {
			case "name":
				name = strings.Trim(val, `"`)
			case "operation":
				operation = strings.Trim(val, `"`)
			}
		}
		calls[name+" "+operation] += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("the API server has no metric %s…}", metric)
	}
	return calls
}

// Issue 12: "The defaulting webhook is also called on every update,
// including finalizer removal." The Network webhooks are called on create
// and on updates that change the spec, never on metadata-only updates:
// finalizers added and removed, labels. The API server's own metrics count
// the calls.
func TestNetworkWebhooksSeeOnlySpecChanges(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	nets := env.Netop.SamplecrdV1().Networks(ns)
	calls := func() map[string]float64 { return webhookCalls(ctx, t, env) }
	check := func(step string, before map[string]float64, want map[string]float64) map[string]float64 {
		t.Helper()
		after := calls()
		for _, name := range []string{validateNetworks, defaultNetworks} {
			for _, op := range []string{"CREATE", "UPDATE"} {
				key := name + " " + op
				if got := after[key] - before[key]; got != want[key] {
					t.Errorf("%s: %s called %v times on %s, want %v", step, name, got, op, want[key])
				}
			}
		}
		return after
	}
	patch := func(step, body string) {
		t.Helper()
		if _, err := nets.Patch(ctx, "watched", types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}

	before := calls()
	if _, err := nets.Create(ctx, network("watched", "10.208.0.0/16", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before = check("create", before, map[string]float64{validateNetworks + " CREATE": 1, defaultNetworks + " CREATE": 1})

	hold := fmt.Sprintf(`{"metadata":{"finalizers":[%q,"example.com/hold"]}}`, samplecrd.Finalizer)
	patch("add a finalizer", hold)
	patch("add a label", `{"metadata":{"labels":{"team":"a"}}}`)
	patch("remove a finalizer", fmt.Sprintf(`{"metadata":{"finalizers":[%q]}}`, samplecrd.Finalizer))
	before = check("metadata-only updates", before, nil)

	patch("change the gateway", `{"spec":{"gateway":"10.208.0.2"}}`)
	before = check("a spec update", before, map[string]float64{validateNetworks + " UPDATE": 1, defaultNetworks + " UPDATE": 1})

	// Deletion: the controller removes its finalizer, an update of
	// metadata only.
	if err := nets.Delete(ctx, "watched", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		_, err := nets.Get(ctx, "watched", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("still there: %v", err)
	})
	check("finalizer removal by the controller", before, nil)
}
