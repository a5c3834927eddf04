package install

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/ssa"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// The service account of the manifests, and its namespace.
const (
	operatorNamespace = "netop-system"
	serviceAccount    = "system:serviceaccount:" + operatorNamespace + ":netop"
)

var serviceAccountGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + operatorNamespace, "system:authenticated"}

var (
	applyOnce sync.Once
	applyErr  error
)

// applyManifests applies every object of `netop manifests`, in its order,
// as `kubectl apply --server-side` does, once per test binary.
func applyManifests(t *testing.T, env *testenv.Env) {
	t.Helper()
	applyOnce.Do(func() { applyErr = apply(context.Background(), env) })
	if applyErr != nil {
		t.Fatalf("applying `netop manifests`: %v", applyErr)
	}
}

func apply(ctx context.Context, env *testenv.Env) error {
	return testenv.ApplyManifests(ctx, env.Config, config.All(config.Options{}))
}

// asServiceAccount is env's configuration impersonating netop's service
// account.
func asServiceAccount(env *testenv.Env) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: serviceAccount, Groups: serviceAccountGroups}
	return cfg
}

// Issue 12: "the ClusterRole reads, creates and updates Secrets in every
// namespace, rewrites any admission webhook configuration and patches any
// Deployment." What netop's service account may do, as the API server's
// authorizer answers.
func TestManifestsRBACIsLeastPrivilege(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	const (
		vwc = "validatingwebhookconfigurations"
		mwc = "mutatingwebhookconfigurations"
		reg = "admissionregistration.k8s.io"
	)
	wantAccess(t, env, serviceAccount, []access{
		// The serving certificate, in netop's namespace only.
		{true, "get", "", "secrets", operatorNamespace, "netop-webhook-cert"},
		{true, "update", "", "secrets", operatorNamespace, "netop-webhook-cert"},
		{true, "create", "", "secrets", operatorNamespace, ""},
		{false, "get", "", "secrets", operatorNamespace, "another"},
		{false, "list", "", "secrets", operatorNamespace, ""},
		{false, "get", "", "secrets", "default", "netop-webhook-cert"},
		{false, "create", "", "secrets", "default", ""},
		{false, "list", "", "secrets", "", ""},
		// Its own webhook configurations, by name.
		{true, "get", reg, vwc, "", "netop"},
		{true, "create", reg, vwc, "", "netop"}, // a server-side apply creating it
		{true, "patch", reg, vwc, "", "netop"},
		{true, "delete", reg, mwc, "", "netop"},
		{false, "patch", reg, vwc, "", "another"},
		{false, "patch", reg, mwc, "", "another"},
		{false, "delete", reg, vwc, "", "another"},
		{false, "create", reg, mwc, "", ""},
		{false, "list", reg, vwc, "", ""},
		// The Network CRD's conversion webhook, and no other CRD.
		{true, "patch", "apiextensions.k8s.io", "customresourcedefinitions", "", "networks.samplecrd.k8s.io"},
		{false, "patch", "apiextensions.k8s.io", "customresourcedefinitions", "", "ats.cnat.programming-kubernetes.info"},
		{false, "update", "apiextensions.k8s.io", "customresourcedefinitions", "", "networks.samplecrd.k8s.io"},
		{false, "delete", "apiextensions.k8s.io", "customresourcedefinitions", "", "networks.samplecrd.k8s.io"},
		// Envoy templates by name, in any namespace.
		{true, "get", "", "configmaps", "default", "envoy-initializer"},
		{true, "list", "", "configmaps", "", "envoy-initializer"}, // the informer's metadata.name field selector
		{false, "get", "", "configmaps", "default", "another"},
		{false, "list", "", "configmaps", "", ""},
		// Deployments: patched where the initializer decides, so still
		// cluster-wide.
		{true, "patch", "apps", "deployments", "default", "web"},
		{true, "watch", "apps", "statefulsets", "", ""},
		{true, "patch", "apps", "daemonsets", "default", "web"},
		{true, "patch", "apps", "replicasets", "default", "web"},
		{true, "patch", "batch", "cronjobs", "default", "web"},
		// Jobs: their pod template never changes, so never patched.
		{false, "patch", "batch", "jobs", "default", "web"},
		{true, "patch", "samplecrd.k8s.io", "networks", "default", "n"},
		{true, "create", "samplecrd.k8s.io", "networks", "default", ""}, // a Deployment's own
		{false, "delete", "samplecrd.k8s.io", "networks", "default", "n"},
		// Pods: read everywhere, their allocations written, made for Ats
		// (as the Job controller makes them for Jobs); never changed
		// otherwise or deleted (the garbage collector removes an At's).
		{true, "watch", "", "pods", "", ""},
		{true, "patch", "", "pods", "default", "p"},
		{true, "create", "", "pods", "default", ""},
		{false, "update", "", "pods", "default", "p"},
		{false, "delete", "", "pods", "default", "p"},
		// Ats: read, their status written, never changed or deleted.
		{true, "watch", "cnat.programming-kubernetes.info", "ats", "", ""},
		{true, "update", "cnat.programming-kubernetes.info", "ats/status", "default", "a"},
		{false, "update", "cnat.programming-kubernetes.info", "ats", "default", "a"},
		{false, "delete", "cnat.programming-kubernetes.info", "ats", "default", "a"},
		// Blocking owner references: an At's pod, a Deployment's Network.
		{true, "update", "cnat.programming-kubernetes.info", "ats/finalizers", "default", "a"},
		{true, "update", "apps", "deployments/finalizers", "default", "d"},
		// The leader election Lease, in netop's namespace only.
		{true, "update", "coordination.k8s.io", "leases", operatorNamespace, "netop"},
		{true, "create", "coordination.k8s.io", "leases", operatorNamespace, ""},
		{false, "update", "coordination.k8s.io", "leases", operatorNamespace, "another"},
		{false, "create", "coordination.k8s.io", "leases", "default", ""},
		// Multus's NetworkAttachmentDefinitions: kept, never deleted (the
		// garbage collector does).
		{true, "patch", "k8s.cni.cncf.io", "network-attachment-definitions", "default", "n"},
		{true, "watch", "k8s.cni.cncf.io", "network-attachment-definitions", "", ""},
		{false, "delete", "k8s.cni.cncf.io", "network-attachment-definitions", "default", "n"},
		// The agents' reports: read, never written.
		{true, "watch", "netop.dev", "networknodes", "", ""},
		{false, "update", "netop.dev", "networknodes/status", "", "n"},
	})
}

// The agents' service account reads Networks, Nodes, and what network
// policies need (the policies, pods and namespaces) and writes its node's
// report; it writes no Network, no pod, no Node, no policy and no Secret.
func TestAgentRBACIsLeastPrivilege(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	wantAccess(t, env, agentServiceAccount, []access{
		{true, "watch", "samplecrd.k8s.io", "networks", "", ""},
		{false, "patch", "samplecrd.k8s.io", "networks", "default", "n"},
		{false, "update", "samplecrd.k8s.io", "networks/status", "default", "n"},
		{true, "create", "netop.dev", "networknodes", "", ""},
		{true, "update", "netop.dev", "networknodes/status", "", "node-a"},
		{false, "delete", "netop.dev", "networknodes", "", "node-a"},
		{true, "watch", "", "nodes", "", ""},
		{false, "patch", "", "nodes", "", "node-a"},
		{true, "get", "", "namespaces", "", "kube-system"},
		{true, "watch", "", "namespaces", "", ""},
		{false, "patch", "", "namespaces", "", "default"},
		{true, "list", "", "pods", "", ""},
		{false, "patch", "", "pods", "default", "p"},
		{true, "watch", "k8s.cni.cncf.io", "multi-networkpolicies", "", ""},
		{false, "patch", "k8s.cni.cncf.io", "multi-networkpolicies", "default", "p"},
		{false, "get", "", "secrets", operatorNamespace, "netop-webhook-cert"},
		{false, "update", "coordination.k8s.io", "leases", operatorNamespace, "netop"},
		// No tokens: the CNI plugin holds no credentials.
		{false, "create", "", "serviceaccounts/token", operatorNamespace, "netop-cni"},
		{false, "create", "", "serviceaccounts/token", operatorNamespace, "netop-agent"},
		{false, "create", "", "serviceaccounts/token", operatorNamespace, "netop"},
	})
}

// access is one SubjectAccessReview and its expected answer.
type access struct {
	allowed                                bool
	verb, group, resource, namespace, name string
}

// wantAccess asks the API server's authorizer about each case for user.
func wantAccess(t *testing.T, env *testenv.Env, user string, cases []access) {
	t.Helper()
	for _, tc := range cases {
		resource, subresource, _ := strings.Cut(tc.resource, "/")
		sar, err := env.Kube.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: serviceAccountGroups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: tc.verb, Group: tc.group, Resource: resource, Subresource: subresource, Namespace: tc.namespace, Name: tc.name,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tc.allowed {
			t.Errorf("%s: %s %s %q in namespace %q: allowed = %v, want %v (%s)", user, tc.verb, tc.resource, tc.name, tc.namespace,
				sar.Status.Allowed, tc.allowed, sar.Status.Reason)
		}
	}
}

// webhooksRegistered reports whether both of netop's webhook
// configurations exist.
func webhooksRegistered(ctx context.Context, env *testenv.Env) (bool, string) {
	_, verr := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	_, merr := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	return verr == nil && merr == nil, fmt.Sprintf("validating: %v, mutating: %v", verr, merr)
}

// The operator runs with the manifests' RBAC and nothing else: its
// webhooks are registered and answer, with the serving certificate in a
// Secret, and Networks become Ready. Then issue 12's "`--webhook-addr 0`
// leaves the webhook configurations registered, pointing at nothing: every
// Network create [...] is then refused": netop started with webhooks off
// removes them.
func TestOperatorAsServiceAccountAndWebhooksOff(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	ns := env.Namespace(t)
	nets := env.Netop.SamplecrdV1().Networks(ns)
	newNetwork := func(name, cidr, gateway string) *samplecrdv1.Network {
		return &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: samplecrdv1.NetworkSpec{CIDR: cidr, Gateway: gateway}}
	}
	cfg := asServiceAccount(env)
	// The operator's own client, impersonating: a request it is not
	// allowed would fail the test through the operator's errors.
	if _, err := versioned.NewForConfigOrDie(cfg).SamplecrdV1().Networks("").List(t.Context(), metav1.ListOptions{Limit: 1}); err != nil {
		t.Fatalf("impersonating %s: %v", serviceAccount, err)
	}

	opts := operator.NewOptions()
	opts.Metrics.Addr = "0"
	opts.Webhooks.Addr = "127.0.0.1:0"
	opts.Webhooks.Local = true
	opts.OperatorNamespace = operatorNamespace // the certificate in a Secret there
	op, stop := testenv.StartOperator(t, cfg, opts, backendtest.New())

	// In force, probed with the service account's rights: from then on a
	// Network only the webhook refuses (the gateway is the network
	// address) is refused at once.
	select {
	case <-op.AdmissionInForce():
	case <-time.After(60 * time.Second):
		t.Fatal("the admission webhooks are not in force within 60s")
	}
	_, err := nets.Create(t.Context(), newNetwork("probe", "10.120.0.0/24", "10.120.0.0"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "admission webhook") {
		t.Fatalf("dry-run create of a bad Network once admission is in force: %v", err)
	}
	if _, err := env.Kube.CoreV1().Secrets(operatorNamespace).Get(t.Context(), "netop-webhook-cert", metav1.GetOptions{}); err != nil {
		t.Errorf("the serving certificate's Secret: %v", err)
	}
	if _, err := nets.Create(t.Context(), newNetwork("first", "10.121.0.0/24", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.WaitReady(t, ns, "first", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 30*time.Second)

	// A stop leaves them registered (rolling updates), pointing at nothing
	// now: the validating webhook fails closed.
	stop()
	if ok, msg := webhooksRegistered(t.Context(), env); !ok {
		t.Fatalf("a stop with webhooks on removed the configurations: %s", msg)
	}
	if _, err := nets.Create(t.Context(), newNetwork("refused", "10.122.0.0/24", ""), metav1.CreateOptions{}); err == nil {
		t.Fatal("a Network was admitted with the webhook configurations pointing at a stopped server")
	}

	off := operator.NewOptions()
	off.Metrics.Addr = "0"
	off.Webhooks.Addr = "0"
	off.OperatorNamespace = operatorNamespace
	testenv.StartOperator(t, cfg, off, backendtest.New())
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, verr := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
		_, merr := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
		return apierrors.IsNotFound(verr) && apierrors.IsNotFound(merr), fmt.Sprintf("validating: %v, mutating: %v", verr, merr)
	})
	if _, err := nets.Create(t.Context(), newNetwork("admitted", "10.122.0.0/24", ""), metav1.CreateOptions{}); err != nil {
		t.Fatalf("with the webhooks off: %v", err)
	}
	env.WaitReady(t, ns, "admitted", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 30*time.Second)
}

// Only what netop registered is removed: a configuration of the same name
// that someone else made stays.
func TestUnregisterLeavesForeignConfigurations(t *testing.T) {
	env := testenv.Get(t)
	admissionregistration := env.Kube.AdmissionregistrationV1()
	const name = "netop-foreign-test"
	// Webhooks for a resource that does not exist: never called.
	nothing := webhook.Webhook{
		Name: "nothing.example.com", Path: "/nothing",
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"}},
		}},
	}
	mutatingNothing := nothing
	mutatingNothing.Mutating = true
	set := webhook.Set{Name: name, Webhooks: []webhook.Webhook{nothing, mutatingNothing}}
	validating, mutating := set.Configurations(webhook.Target{URL: "https://127.0.0.1:1"}, nil)
	// Someone else's validating configuration, and netop's mutating one.
	if _, err := admissionregistration.ValidatingWebhookConfigurations().Create(t.Context(), validating, metav1.CreateOptions{FieldManager: "someone-else"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admissionregistration.ValidatingWebhookConfigurations().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if _, err := admissionregistration.MutatingWebhookConfigurations().Create(t.Context(), mutating, metav1.CreateOptions{FieldManager: ssa.FieldManager}); err != nil {
		t.Fatal(err)
	}

	removed, kept, err := webhook.Unregister(t.Context(), env.Kube, name)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(removed, ",") != "MutatingWebhookConfiguration "+name || strings.Join(kept, ",") != "ValidatingWebhookConfiguration "+name {
		t.Errorf("removed %q, kept %q", removed, kept)
	}
	if _, err := admissionregistration.ValidatingWebhookConfigurations().Get(t.Context(), name, metav1.GetOptions{}); err != nil {
		t.Errorf("the foreign configuration: %v", err)
	}
	if _, err := admissionregistration.MutatingWebhookConfigurations().Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("netop's configuration: %v", err)
	}
	// Nothing left of netop's: no error, nothing removed.
	if removed, _, err := webhook.Unregister(t.Context(), env.Kube, name); err != nil || len(removed) > 0 {
		t.Errorf("again: removed %q, %v", removed, err)
	}
}
