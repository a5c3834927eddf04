package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

func network(name, cidr, gateway string) *samplecrdv1.Network {
	return &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       samplecrdv1.NetworkSpec{CIDR: cidr, Gateway: gateway},
	}
}

// Every bad Network is refused with a message that names the field and the
// reason, whether the schema or the webhook catches it.
func TestBadNetworksAreRejectedNamingTheField(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for i, tc := range []struct {
		cidr, gateway string
		field, reason string
	}{
		{"", "", "spec.cidr", "at least 1 chars"},
		{"10.0.0.0", "", "spec.cidr", "must be an IP prefix"},
		{"10.0.0.0/33", "", "spec.cidr", "must be an IP prefix"},
		{"300.0.0.0/8", "", "spec.cidr", "must be an IP prefix"},
		{"fd00::/129", "", "spec.cidr", "must be an IP prefix"},
		{"x", "", "spec.cidr", "must be an IP prefix"},
		{"10.0.0.0/8/8", "", "spec.cidr", "must be an IP prefix"},
		{" 10.0.0.0/8", "", "spec.cidr", "must be an IP prefix"},
		{"10.0.0.0/8 ", "", "spec.cidr", "must be an IP prefix"},
		{strings.Repeat("1", 50), "", "spec.cidr", "may not be more than 49"},
		{"::ffff:10.0.0.0/104", "", "spec.cidr", "must be an IP prefix"},
		{"10.0.0.0/8", "nope", "spec.gateway", "must be an IP address"},
		{"10.0.0.0/8", "10.0.0", "spec.gateway", "must be an IP address"},
		{"10.0.0.0/8", "10.1.2.3.4", "spec.gateway", "must be an IP address"},
		{"10.0.0.0/8", " 10.0.0.1", "spec.gateway", "must be an IP address"},
		{"10.0.0.0/8", "11.0.0.1", "spec.gateway", "inside spec.cidr"},
		{"192.168.0.0/16", "192.169.0.1", "spec.gateway", "inside spec.cidr"},
		{"10.0.0.4/30", "10.0.0.8", "spec.gateway", "inside spec.cidr"},
		{"10.0.0.4/31", "", "spec.cidr", "must leave room for a gateway and at least one host address: use a prefix of /30 or shorter"},
		{"10.0.0.4/32", "", "spec.cidr", "use a prefix of /30 or shorter"},
		{"fd00::/127", "", "spec.cidr", "use a prefix of /126 or shorter"},
		{"10.0.0.0/8", "fd00::1", "spec.gateway", "inside spec.cidr"},
		{"fd00::/64", "10.0.0.1", "spec.gateway", "inside spec.cidr"},
		{"10.0.0.0/8", "10.0.0.0", "spec.gateway", "network address"},
		{"10.0.0.0/8", "10.255.255.255", "spec.gateway", "broadcast address"},
		{"fd00::/64", "fd00::", "spec.gateway", "network address"},
		{"10.0.0.0/8", "fe80::1%eth0", "spec.gateway", "must be an IP address"},
		// Special-purpose prefixes, from the issue. The schema's CEL rules
		// run before the validating webhook and refuse the worst (/0,
		// loopback, multicast); the webhook's message names the purpose
		// of the others.
		{"0.0.0.0/0", "", "spec.cidr", "must not be a /0 prefix"},
		{"127.0.0.0/8", "", "spec.cidr", "must not be in or contain a loopback range"},
		{"169.254.0.0/16", "", "spec.cidr", "is in 169.254.0.0/16, reserved for link-local addresses, the cloud metadata service 169.254.169.254 among them"},
		{"224.0.0.0/4", "", "spec.cidr", "must not be in or contain a multicast range"},
		{"240.0.0.0/4", "", "spec.cidr", "is in 240.0.0.0/4, reserved for future use"},
		{"255.255.255.255/32", "", "spec.cidr", "is in 255.255.255.255/32, reserved for the limited broadcast address"},
		{"0.0.0.0/8", "", "spec.cidr", "is in 0.0.0.0/8, reserved for this-network addresses"},
		{"128.0.0.0/1", "", "spec.cidr", "must not be in or contain a multicast range"},
		{"::/0", "", "spec.cidr", "must not be a /0 prefix"},
		{"ff00::/8", "", "spec.cidr", "must not be in or contain a multicast range"},
		{"::1/128", "", "spec.cidr", "must not be in or contain a loopback range"},
		{"192.0.0.0/16", "", "spec.cidr", "contains 192.0.0.0/24, reserved for IETF protocol assignments"},
		{"fe80::/64", "", "spec.cidr", "is in fe80::/10, reserved for link-local addresses"},
		{"64:ff9b::/96", "", "spec.cidr", "reserved for IPv4/IPv6 translation"},
		{"fd00::/64", "::1", "spec.gateway", "inside spec.cidr"},
		{"fd00::/64", "ff02::1", "spec.gateway", "inside spec.cidr"},
		{"fd00::/64", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "spec.gateway", "inside spec.cidr"},
	} {
		t.Run(fmt.Sprintf("%d:%s/%s", i, tc.cidr, tc.gateway), func(t *testing.T) {
			_, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network(fmt.Sprintf("bad-%d", i), tc.cidr, tc.gateway), metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("cidr %q gateway %q was accepted", tc.cidr, tc.gateway)
			}
			if !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %q does not name %s and %q", err, tc.field, tc.reason)
			}
		})
	}
}

// A cidr that overlaps a Network in another namespace is refused with the
// name of that Network, on create and on update.
func TestOverlapAcrossNamespaces(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns1, ns2 := env.Namespace(t), env.Namespace(t)
	if _, err := env.Netop.SamplecrdV1().Networks(ns1).Create(t.Context(), network("first", "10.100.0.0/16", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("spec.cidr: Invalid value: \"10.100.5.0/24\": overlaps Network %s/first (10.100.0.0/16)", ns1)
	// The webhook reads an informer cache: poll (dry-run) until it has the
	// first Network.
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		_, err := env.Netop.SamplecrdV1().Networks(ns2).Create(ctx, network("second", "10.100.5.0/24", ""),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), want), fmt.Sprintf("got %v, want %q", err, want)
	})

	if _, err := env.Netop.SamplecrdV1().Networks(ns2).Create(t.Context(), network("second", "10.101.0.0/16", ""), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a Network that overlaps nothing: %v", err)
	}
	// The controller writes status meanwhile: retry on conflicts.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		second, err := env.Netop.SamplecrdV1().Networks(ns2).Get(t.Context(), "second", metav1.GetOptions{})
		if err != nil {
			return err
		}
		second.Spec.CIDR, second.Spec.Gateway = "10.100.5.0/24", ""
		_, err = env.Netop.SamplecrdV1().Networks(ns2).Update(t.Context(), second, metav1.UpdateOptions{})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("update to an overlapping cidr: got %v, want %q", err, want)
	}
}

// The gateway defaults to the first usable address, and the controller's
// finalizer is there from creation on.
func TestDefaultingAndFinalizerAtAdmission(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, tc := range []struct{ cidr, gateway string }{
		{"10.102.0.0/16", "10.102.0.1"},
		{"fd00:102::/64", "fd00:102::1"},
		{"10.202.1.4/30", "10.202.1.5"},
	} {
		n, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network("d-"+strings.NewReplacer(".", "-", ":", "-", "/", "-").Replace(tc.cidr), tc.cidr, ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Spec.Gateway != tc.gateway {
			t.Errorf("%s: gateway defaulted to %q, want %q", tc.cidr, n.Spec.Gateway, tc.gateway)
		}
		if strings.Join(n.Finalizers, ",") != samplecrd.Finalizer {
			t.Errorf("%s: finalizers at creation = %v", tc.cidr, n.Finalizers)
		}
	}
}

type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

// warningClient is a client of env that collects the API server's
// warnings in w.
func warningClient(env *testenv.Env) (client versioned.Interface, w *warnings) {
	w = &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = w
	return versioned.NewForConfigOrDie(cfg), w
}

// The tutorial's non-canonical cidr is accepted with a warning that names
// the canonical network; kubectl prints it.
func TestNonCanonicalCIDRWarns(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, w := warningClient(env)
	n, err := client.SamplecrdV1().Networks(ns).Create(t.Context(), network("tutorial", "10.103.1.0/16", "10.103.1.1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := `spec.cidr "10.103.1.0/16" has host bits set: it means the network 10.103.0.0/16`
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) != 1 || w.seen[0] != want {
		t.Fatalf("warnings = %q, want [%q]", w.seen, want)
	}
	if n.Spec.CIDR != "10.103.1.0/16" {
		t.Fatalf("the spec was changed to %q; it must stay as written", n.Spec.CIDR)
	}
}

// Non-canonical IPv6 gets the warning that Kubernetes gives for its own
// fields, and is stored as written.
func TestNonCanonicalIPv6Warns(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, w := warningClient(env)
	n, err := client.SamplecrdV1().Networks(ns).Create(t.Context(), network("upper", "FD00:105::/64", "fd00:105:0::1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`spec.cidr: IPv6 CIDR value "FD00:105::/64" should be in RFC 5952 canonical format ("fd00:105::/64")`,
		`spec.gateway: IPv6 address "fd00:105:0::1" should be in RFC 5952 canonical format ("fd00:105::1")`,
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.Equal(w.seen, want) {
		t.Fatalf("warnings = %q, want %q", w.seen, want)
	}
	if n.Spec.CIDR != "FD00:105::/64" {
		t.Fatalf("the spec was changed to %q; it must stay as written", n.Spec.CIDR)
	}
}

// Deleting a Network whose spec the webhook would now refuse still works:
// removing the finalizer is an update that must pass.
func TestFinalizerRemovalIsNeverBlocked(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	n, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network("doomed", "10.104.0.0/16", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Netop.SamplecrdV1().Networks(ns).Delete(t.Context(), n.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, string) {
		_, err := env.Netop.SamplecrdV1().Networks(ns).Get(ctx, n.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("still there: %v", err)
	})
}
