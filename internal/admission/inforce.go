package admission

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/networks"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// inForceProbe tells when the API server calls the admission webhooks that
// were just registered: the API server takes a new webhook configuration
// up a moment after it is written, later still on a busy machine, and
// until then admits what the webhooks would refuse. The probe is a dry-run
// create of a Network that only netop's validation refuses (its gateway is
// its network address), sent until the validating webhook refuses it and,
// where the API server calls this very server (Options.Local), the
// mutating webhook saw it too. The API server takes up each configuration
// whole, so one webhook of it answering shows all of its webhooks in
// force, with the CA and address they were registered with. The probe is
// a v1 Network, stored as v2: its refusal shows the conversion webhook in
// force too (the API server takes the CRD's new conversion up a moment
// after it is written, like the webhook configurations).
type inForceProbe struct {
	client versioned.Interface
	// namespace is one the webhooks do not skip; name is this server's
	// own, so that only its probes count.
	namespace, name string
	// validating names the webhook that must refuse the probe.
	validating string
	// local: the API server calls this server directly. Otherwise it
	// calls a Service, which routes to this replica only once it is ready:
	// a failed call then shows the configuration in force too (its
	// failurePolicy refuses), and the mutating webhook cannot be seen.
	local bool
	// mutatingSeen is set once a mutating webhook got the probe.
	mutatingSeen atomic.Bool
}

// probeCIDR is the probe Network's cidr (TEST-NET-1); its gateway is its
// network address, which netop refuses and the schema lets through.
const probeCIDR, probeGateway = "192.0.2.0/24", "192.0.2.0"

func newInForceProbe(client versioned.Interface, set webhook.Set, operatorNamespace string, local bool) (*inForceProbe, error) {
	p := &inForceProbe{client: client, namespace: "default", local: local}
	if operatorNamespace == p.namespace {
		p.namespace = metav1.NamespacePublic // made by the API server, like default
	}
	p.name = "netop-admission-probe-" + strings.ToLower(rand.Text()[:10])
	for _, w := range set.Webhooks {
		if w.Path == networks.PathValidate {
			p.validating = w.Name
		}
	}
	if p.validating == "" {
		return nil, errors.New("no Network validation webhook to probe admission with")
	}
	return p, nil
}

// observe wraps the handler of w: a probe that reaches a mutating webhook
// is recorded.
func (p *inForceProbe) observe(w webhook.Webhook) webhook.Handler {
	if !w.Mutating {
		return w.Handler
	}
	return webhook.HandlerFunc(func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		if req.DryRun != nil && *req.DryRun && req.Namespace == p.namespace && req.Name == p.name {
			p.mutatingSeen.Store(true)
		}
		return w.Handler.Admit(ctx, req)
	})
}

// check says why the webhooks are not in force yet, or nil.
func (p *inForceProbe) check(ctx context.Context) error {
	_, err := p.client.SamplecrdV1().Networks(p.namespace).Create(ctx, &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Name: p.name},
		Spec:       samplecrdv1.NetworkSpec{CIDR: probeCIDR, Gateway: probeGateway},
	}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return errors.New("the API server does not call the validating webhook yet")
	case strings.Contains(err.Error(), fmt.Sprintf("admission webhook %q denied the request", p.validating)):
	case !p.local && strings.Contains(err.Error(), fmt.Sprintf("failed calling webhook %q", p.validating)):
	default:
		return fmt.Errorf("probing the admission webhooks: %w", err)
	}
	if p.local && !p.mutatingSeen.Load() {
		return errors.New("the API server does not call the mutating webhook yet")
	}
	return nil
}

// wait probes until the webhooks are in force or ctx ends; it reports
// whether they are.
func (p *inForceProbe) wait(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	started, logged := time.Now(), time.Now()
	var last error
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		last = p.check(ctx)
		if last != nil && time.Since(logged) > 10*time.Second {
			logged = time.Now()
			logger.Info("Admission webhooks not in force yet", "reason", last.Error(), "after", time.Since(started).Round(time.Second))
		}
		return last == nil, nil
	})
	if err != nil {
		if last != nil {
			logger.V(2).Info("Stopped before the admission webhooks were in force", "last", last.Error())
		}
		return false
	}
	logger.Info("Admission webhooks in force: the API server calls them", "after", time.Since(started).Round(time.Millisecond))
	return true
}
