package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// The tutorial's v1 Network applies unchanged and reads back as v2 through
// the conversion webhook that netop registered on the CRD: spec, defaulted
// gateway and status alike. A v2 Network reads back as v1.
func TestSeedNetworkReadsAsV2(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	seed := &samplecrdv1.Network{}
	readExample(t, "network.yaml", seed)
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), seed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := env.WaitReady(t, ns, seed.Name, metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)

	v2, err := env.Netop.SamplecrdV2().Networks(ns).Get(t.Context(), seed.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the seed's Network as v2: %v", err)
	}
	if v2.APIVersion != "" && v2.APIVersion != samplecrdv2.SchemeGroupVersion.String() {
		t.Errorf("apiVersion %q", v2.APIVersion)
	}
	if !slices.Equal(v2.Spec.CIDRs, []string{"192.168.0.0/16"}) || !slices.Equal(v2.Spec.Gateways, []string{"192.168.0.1"}) {
		t.Errorf("v2 spec = %+v, want cidrs [192.168.0.0/16], gateways [192.168.0.1]", v2.Spec)
	}
	if !slices.Equal(v2.Status.CIDRs, []string{ready.Status.CIDR}) || !slices.Equal(v2.Status.Gateways, []string{ready.Status.Gateway}) ||
		v2.Status.Backend == nil || v2.Status.Backend.Interface != ready.Status.Backend.Interface || len(v2.Status.Conditions) != len(ready.Status.Conditions) {
		t.Errorf("v2 status = %+v, want v1's %+v per family", v2.Status, ready.Status)
	}
	if _, ok := v2.Annotations[samplecrdv1.SpecFamiliesAnnotation]; ok {
		t.Errorf("v2 carries v1's families annotation: %v", v2.Annotations)
	}

	created, err := env.Netop.SamplecrdV2().Networks(ns).Create(t.Context(), &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Name: "v2-single"},
		Spec:       samplecrdv2.NetworkSpec{CIDRs: []string{"10.121.0.0/24"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a v2 Network: %v", err)
	}
	if !slices.Equal(created.Spec.Gateways, []string{"10.121.0.1"}) {
		t.Errorf("v2 create: gateways %v, want the default [10.121.0.1]", created.Spec.Gateways)
	}
	v1 := env.WaitReady(t, ns, "v2-single", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	if v1.Spec.CIDR != "10.121.0.0/24" || v1.Spec.Gateway != "10.121.0.1" || len(v1.Annotations) != 0 {
		t.Errorf("the v2 Network read as v1: spec %+v, annotations %v", v1.Spec, v1.Annotations)
	}
	// The webhook answers with the metadata the API server takes from it
	// (name, namespace, UID, labels, annotations); the rest is the stored
	// object's.
	stored, err := env.Netop.SamplecrdV2().Networks(ns).Get(t.Context(), "v2-single", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v1.ResourceVersion != stored.ResourceVersion || !v1.CreationTimestamp.Equal(&stored.CreationTimestamp) || v1.Generation != stored.Generation ||
		!slices.Equal(v1.Finalizers, stored.Finalizers) || len(v1.ManagedFields) == 0 || len(v1.ManagedFields) != len(stored.ManagedFields) {
		t.Errorf("metadata read as v1 %+v, want the stored object's %+v", v1.ObjectMeta, stored.ObjectMeta)
	}
}

// A dual-stack v2 Network: its gateways defaulted at admission, built as
// one bridge with both gateways, Ready with both families in status; a v1
// client sees the first family and its update keeps the second; a second
// family overlapping another Network is refused, naming the item.
func TestDualStackNetwork(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	networks := env.Netop.SamplecrdV2().Networks(ns)
	created, err := networks.Create(t.Context(), &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec:       samplecrdv2.NetworkSpec{CIDRs: []string{"10.122.0.0/24", "fd00:122::/64"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("dual-stack create: %v", err)
	}
	if !slices.Equal(created.Spec.Gateways, []string{"10.122.0.1", "fd00:122::1"}) {
		t.Errorf("gateways defaulted to %v, want [10.122.0.1 fd00:122::1]", created.Spec.Gateways)
	}
	env.WaitReady(t, ns, "dual", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	dual, err := networks.Get(t.Context(), "dual", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dual.Status.CIDRs, []string{"10.122.0.0/24", "fd00:122::/64"}) || !slices.Equal(dual.Status.Gateways, []string{"10.122.0.1", "fd00:122::1"}) || dual.Status.Backend == nil {
		t.Fatalf("status %+v, want both families", dual.Status)
	}
	if got := bridgeAddresses(t, dual.Status.Backend.Interface); !slices.Equal(got, []string{"10.122.0.1/24", "fd00:122::1/64"}) {
		t.Errorf("bridge %s carries %v, want both gateways", dual.Status.Backend.Interface, got)
	}

	// A v1 client: the first family, and an update that keeps the second.
	v1 := env.Netop.SamplecrdV1().Networks(ns)
	old, err := v1.Get(t.Context(), "dual", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if old.Spec.CIDR != "10.122.0.0/24" || old.Status.CIDR != "10.122.0.0/24" {
		t.Errorf("read as v1: spec %+v, status cidr %s", old.Spec, old.Status.CIDR)
	}
	old.Spec.Gateway = "10.122.0.9"
	if _, err := v1.Update(t.Context(), old, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("v1 update: %v", err)
	}
	env.WaitReady(t, ns, "dual", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	dual, err = networks.Get(t.Context(), "dual", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dual.Spec.CIDRs, []string{"10.122.0.0/24", "fd00:122::/64"}) || !slices.Equal(dual.Spec.Gateways, []string{"10.122.0.9", "fd00:122::1"}) {
		t.Errorf("after a v1 update: spec %+v, want the IPv6 half kept and the new IPv4 gateway", dual.Spec)
	}
	if got := bridgeAddresses(t, dual.Status.Backend.Interface); !slices.Equal(got, []string{"10.122.0.9/24", "fd00:122::1/64"}) {
		t.Errorf("after a v1 update the bridge carries %v", got)
	}

	_, err = networks.Create(t.Context(), &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Name: "overlapping"},
		Spec:       samplecrdv2.NetworkSpec{CIDRs: []string{"10.123.0.0/24", "fd00:122::/80"}},
	}, metav1.CreateOptions{})
	if want := "spec.cidrs[1]: Invalid value: \"fd00:122::/80\": overlaps Network " + ns + "/dual"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a second family overlapping another Network: %v, want refused with %q", err, want)
	}
	// Admission takes v2 as v2: a v2 client's Network of one family is
	// refused naming its item, not v1's spec.cidr.
	_, err = networks.Create(t.Context(), &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Name: "overlapping"},
		Spec:       samplecrdv2.NetworkSpec{CIDRs: []string{"10.122.0.128/25"}},
	}, metav1.CreateOptions{})
	if want := "spec.cidrs[0]: Invalid value: \"10.122.0.128/25\": overlaps Network " + ns + "/dual"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a v2 Network overlapping another: %v, want refused with %q", err, want)
	}
	// The IPv6 cidr moves alone: its defaulted gateway moves with it.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := networks.Get(t.Context(), "dual", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.CIDRs[1] = "fd00:123::/64"
		_, err = networks.Update(t.Context(), cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("moving the IPv6 cidr: %v", err)
	}
	if dual, err = networks.Get(t.Context(), "dual", metav1.GetOptions{}); err != nil || !slices.Equal(dual.Spec.Gateways, []string{"10.122.0.9", "fd00:123::1"}) {
		t.Errorf("after moving the IPv6 cidr: gateways %v (%v), want the IPv6 one moved with it", dual.Spec.Gateways, err)
	}
}

// bridgeAddresses lists the addresses of the bridge name in the operator's
// network namespace, link-local ones aside, sorted.
func bridgeAddresses(t *testing.T, name string) []string {
	t.Helper()
	handle := nettest.Handle(t, operatorNetns)
	link, err := handle.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := handle.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			out = append(out, a.IPNet.String())
		}
	}
	slices.Sort(out)
	return out
}

// With the conversion webhook unreachable, reading or writing Networks in
// v1, which needs it, fails with an error that says so; v2, the storage
// version and the one netop reads, still reads; and nothing is lost: once
// the webhook is back, v1 reads what was there, and a v1 create refused
// meanwhile left nothing behind.
func TestConversionWebhookDownIsAClearError(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	crds := apiextensionsclient.NewForConfigOrDie(env.Config).ApiextensionsV1().CustomResourceDefinitions()
	crd, err := crds.Get(t.Context(), admission.NetworkCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conv := crd.Spec.Conversion
	if conv == nil || conv.Strategy != apiextensionsv1.WebhookConverter || conv.Webhook == nil || conv.Webhook.ClientConfig == nil ||
		conv.Webhook.ClientConfig.URL == nil || *conv.Webhook.ClientConfig.URL != "https://"+webhookAddr+admission.PathConvert || len(conv.Webhook.ClientConfig.CABundle) == 0 {
		t.Fatalf("the CRD's conversion is %+v, want the operator's webhook at %s with its CA", conv, webhookAddr)
	}
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network("kept", "10.123.0.0/24", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.WaitReady(t, ns, "kept", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "https://" + l.Addr().String() + admission.PathConvert
	_ = l.Close()
	setURL := func(url string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"spec": map[string]any{"conversion": map[string]any{"webhook": map[string]any{"clientConfig": map[string]any{"url": url}}}}})
		// Not t.Context(): the cleanup restores it too, after the test.
		if _, err := crds.Patch(context.Background(), admission.NetworkCRD, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setURL(dead)
	t.Cleanup(func() { setURL(*conv.Webhook.ClientConfig.URL) })

	// The API server picks the CRD change up asynchronously: poll until a
	// v1 read fails.
	var v1Err error
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, v1Err = env.Netop.SamplecrdV1().Networks(ns).Get(ctx, "kept", metav1.GetOptions{})
		return v1Err != nil, "v1 reads still work with the conversion webhook down"
	})
	if !strings.Contains(v1Err.Error(), "conversion webhook") {
		t.Errorf("v1 read with the webhook down: %q, want an error naming the conversion webhook", v1Err)
	}
	kept, err := env.Netop.SamplecrdV2().Networks(ns).Get(t.Context(), "kept", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("v2, the storage version, must not need the webhook: %v", err)
	}
	if !slices.Equal(kept.Spec.CIDRs, []string{"10.123.0.0/24"}) || !slices.Equal(kept.Status.CIDRs, []string{"10.123.0.0/24"}) {
		t.Errorf("v2 read with the webhook down: spec %+v status cidrs %v", kept.Spec, kept.Status.CIDRs)
	}
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network("refused", "10.124.0.0/24", ""), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "conversion webhook") {
		t.Errorf("v1 create with the webhook down: %v, want an error naming the conversion webhook", err)
	}

	setURL(*conv.Webhook.ClientConfig.URL)
	var v1 *samplecrdv1.Network
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		v1, err = env.Netop.SamplecrdV1().Networks(ns).Get(ctx, "kept", metav1.GetOptions{})
		return err == nil, fmt.Sprintf("v1 reads after the outage: %v", err)
	})
	if v1.Spec.CIDR != "10.123.0.0/24" || v1.Status.CIDR != "10.123.0.0/24" {
		t.Errorf("after the outage v1 reads spec %+v, status cidr %s", v1.Spec, v1.Status.CIDR)
	}
	if _, err := env.Netop.SamplecrdV2().Networks(ns).Get(t.Context(), "refused", metav1.GetOptions{}); err == nil {
		t.Error("the v1 create refused during the outage exists")
	}
}

// kubectl reads the group's preferred version, v2 now, through the
// conversion webhook: `kubectl get net` shows the families (as JSON
// lists, the API server's rendering of a list column), with the columns
// v1 had.
func TestKubectlGetNetworksShowsV2(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	group, err := env.Kube.Discovery().ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range group.Groups {
		if g.Name == samplecrd.GroupName && g.PreferredVersion.Version != "v2" {
			t.Errorf("preferred version of %s is %s, want v2", g.Name, g.PreferredVersion.Version)
		}
	}
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network("n", "10.125.0.0/24", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	columns, rows := env.Table(t, "/apis/samplecrd.k8s.io/v2/namespaces/"+ns+"/networks")
	if want := "NAME CIDRS GATEWAYS READY NODES ALLOCATED AGE"; columns != want {
		t.Errorf("columns = %q, want %q", columns, want)
	}
	if len(rows) != 1 || rows[0].Cells[1] != `["10.125.0.0/24"]` || rows[0].Cells[2] != `["10.125.0.1"]` {
		t.Errorf("rows = %+v", rows)
	}
}

// Installing the CRDs again, as every standalone start does, keeps the
// conversion webhook netop registered (its URL and CA) instead of the
// manifest's Service.
func TestReinstallingCRDsKeepsTheConversionWebhook(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	crds := apiextensionsclient.NewForConfigOrDie(env.Config).ApiextensionsV1().CustomResourceDefinitions()
	before, err := crds.Get(t.Context(), admission.NetworkCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := install.CRDs(t.Context(), env.Config); err != nil {
		t.Fatal(err)
	}
	after, err := crds.Get(t.Context(), admission.NetworkCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, a := before.Spec.Conversion.Webhook.ClientConfig, after.Spec.Conversion.Webhook.ClientConfig
	if a.URL == nil || *a.URL != *b.URL || a.Service != nil || string(a.CABundle) != string(b.CABundle) {
		t.Errorf("conversion webhook after reinstalling the CRDs: %+v, want %+v", a, b)
	}
	ns := env.Namespace(t)
	if _, err := env.Netop.SamplecrdV2().Networks(ns).List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Errorf("v2 list after reinstalling the CRDs: %v", err)
	}
}

// v2's schema refuses per cidr what v1's refuses in spec.cidr, and checks
// each gateway against the cidr of its index, naming the item.
func TestV2SchemaRefusesNamingTheItem(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for i, tc := range []struct {
		cidrs, gateways []string
		want            string
	}{
		{[]string{"x"}, nil, "spec.cidrs[0]: Invalid value: \"x\": must be an IP prefix in CIDR notation"},
		{[]string{"0.0.0.0/0"}, nil, "spec.cidrs[0]: Invalid value: \"0.0.0.0/0\": must not be a /0 prefix"},
		{[]string{"10.126.0.0/24", "::1/128"}, nil, "spec.cidrs[1]: Invalid value: \"::1/128\": must not be in or contain a loopback range"},
		{[]string{"10.126.0.0/24", "ff02::/16"}, nil, "spec.cidrs[1]: Invalid value: \"ff02::/16\": must not be in or contain a multicast range"},
		{[]string{"10.126.0.0/24", "10.127.0.0/24"}, nil, "spec.cidrs: Invalid value: must be of different families"},
		{[]string{"10.126.0.0/24"}, []string{"nope"}, "spec.gateways[0]: Invalid value: \"nope\": must be an IP address"},
		{[]string{"10.126.0.0/24"}, []string{"10.127.0.1"}, "spec.gateways: Invalid value: each must be an address inside the cidr of the same index"},
		{[]string{"10.126.0.0/24", "fd00:126::/64"}, []string{"", "fd00:127::1"}, "spec.gateways: Invalid value: each must be an address inside the cidr"},
		{[]string{"10.126.0.0/24"}, []string{"10.126.0.1", "fd00:126::1"}, "spec.gateways: Invalid value: must not have more entries than spec.cidrs"},
	} {
		_, err := env.Netop.SamplecrdV2().Networks(ns).Create(t.Context(), &samplecrdv2.Network{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bad-%d", i)},
			Spec:       samplecrdv2.NetworkSpec{CIDRs: tc.cidrs, Gateways: tc.gateways},
		}, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("cidrs %v gateways %v: %v, want refused with %q", tc.cidrs, tc.gateways, err, tc.want)
		}
	}
}
