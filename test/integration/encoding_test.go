package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	networkcontroller "github.com/netop-dev/netop/internal/controller/network"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// The operator reads and writes built-in resources (the pods it lists and
// watches, the Events it writes) in protobuf, and Networks in JSON, which
// is all a custom resource has; --kube-api-content-type=application/json
// turns protobuf off. The bytes are counted by encoding in
// netop_api_bytes_total.
func TestBuiltinResourcesSpeakProtobuf(t *testing.T) {
	env := testenv.Get(t)
	for i, contentType := range []string{kubeclient.Protobuf, kubeclient.JSON} {
		t.Run(contentType, func(t *testing.T) {
			ns := env.Namespace(t)
			opts := operator.NewOptions()
			opts.Metrics.Addr, opts.Webhooks.Addr, opts.Workloads.Enabled = "0", "0", false
			opts.Client.ContentType = contentType
			op, stop := testenv.StartOperator(t, env.Config, opts, backendtest.New())
			defer stop()

			name := fmt.Sprintf("encoded-%d", i)
			if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network(name, fmt.Sprintf("10.%d.0.0/24", 90+i), ""),
				metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			env.WaitReady(t, ns, name, metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
			testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
				events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
					"involvedObject.name": name, "reason": networkcontroller.ReasonCreated}.String()})
				if err != nil {
					return false, err.Error()
				}
				return len(events.Items) == 1, fmt.Sprintf("%d Created Events", len(events.Items))
			})

			bytes := func(direction, encoding string) float64 {
				return testutil.ToFloat64(op.Metrics().APIBytes.WithLabelValues(direction, encoding))
			}
			if got := bytes("received", "json"); got == 0 {
				t.Errorf("no JSON received: the Networks are JSON")
			}
			sentProtobuf, receivedProtobuf := bytes("sent", "protobuf"), bytes("received", "protobuf")
			if contentType == kubeclient.Protobuf {
				// The pod list and the Event's create.
				if sentProtobuf == 0 || receivedProtobuf == 0 {
					t.Errorf("protobuf bytes sent %v, received %v: want both above 0", sentProtobuf, receivedProtobuf)
				}
			} else if sentProtobuf != 0 || receivedProtobuf != 0 {
				t.Errorf("with %s, protobuf bytes sent %v, received %v: want 0", contentType, sentProtobuf, receivedProtobuf)
			}
		})
	}
}
