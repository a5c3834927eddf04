package networks

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// The index follows the informer: a create is found, a changed cidr moves,
// a Network being deleted or deleted no longer blocks its cidr, and a
// Network never overlaps itself.
func TestCIDRsFollowInformer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a", UID: "ua"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.0.0.0/16"}}}
	client := fake.NewSimpleClientset(a)
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Samplecrd().V2().Networks().Informer()
	cidrs := NewCIDRs()
	if err := cidrs.Watch(informer); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitFor(ctx, "", cidrs.HasSyncedChecker()) {
		t.Fatal("not synced")
	}
	overlapping := func(cidr, namespace, name string) string {
		e, ok, err := cidrs.Overlapping(ctx, netip.MustParsePrefix(cidr), namespace, name)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ""
		}
		return e.Namespace + "/" + e.Name
	}
	// eventually polls until the informer's handlers have seen a change.
	eventually := func(what, cidr, namespace, name, want string) {
		t.Helper()
		var got string
		if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			got = overlapping(cidr, namespace, name)
			return got == want, nil
		}); err != nil {
			t.Fatalf("%s: %s overlaps %q, want %q", what, cidr, got, want)
		}
	}
	eventually("from the initial list, a subnet", "10.0.5.0/24", "y", "b", "x/a")
	eventually("a supernet", "10.0.0.0/8", "y", "b", "x/a")
	eventually("itself", "10.0.0.0/16", "x", "a", "")
	eventually("disjoint", "10.1.0.0/16", "y", "b", "")

	a.Spec.CIDRs = []string{"10.1.0.0/16"}
	if _, err := client.SamplecrdV2().Networks("x").Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("moved to", "10.1.0.0/16", "y", "b", "x/a")
	eventually("moved from", "10.0.0.0/16", "y", "b", "")

	a.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if _, err := client.SamplecrdV2().Networks("x").Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("being deleted", "10.1.0.0/16", "y", "b", "")

	c := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "z", Name: "c", UID: "uc"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"fd00::/64"}}}
	if _, err := client.SamplecrdV2().Networks("z").Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("created", "fd00::/48", "y", "b", "z/c")
	if err := client.SamplecrdV2().Networks("z").Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("deleted", "fd00::/48", "y", "b", "")
}

// Of two overlapping Networks created back to back, the second is refused
// although the informer has delivered neither: the first, admitted here,
// is read back from the API server. One admitted but not written (still
// being created, or refused after admission) refuses nothing, nor does a
// dry run. Once the informer delivers them, none is kept apart.
func TestOverlapReadsItsOwnWrites(t *testing.T) {
	a := admissionWith(t)
	stored := map[string]*samplecrdv2.Network{}
	reads := 0
	a.CIDRs.Live = func(_ context.Context, namespace, name string) (*samplecrdv2.Network, error) {
		reads++
		if n, ok := stored[namespace+"/"+name]; ok {
			return n, nil
		}
		return nil, apierrors.NewNotFound(samplecrdv2.Resource("networks"), name)
	}
	create := func(name, cidr string, dryRun bool) (*admissionv1.AdmissionResponse, *samplecrdv2.Network) {
		// The API server sets the UID and generation before the
		// validating webhooks see the Network.
		n := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Generation: 1},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{cidr}}}
		req := requestV2(admissionv1.Create, n)
		req.DryRun = &dryRun
		return a.Validate(t.Context(), req), n
	}
	const rounds = 100
	for i := range rounds {
		first, second := fmt.Sprintf("10.%d.%d.0/24", i/250, i%250), fmt.Sprintf("10.%d.%d.128/25", i/250, i%250)
		if resp, _ := create("dry-run", first, true); !resp.Allowed {
			t.Fatalf("dry run of %s refused: %v", first, resp.Result)
		}
		resp, n := create(fmt.Sprintf("a%d", i), first, false)
		if !resp.Allowed {
			t.Fatalf("%s refused: %v", first, resp.Result)
		}
		// Not written yet: both are being created at once, for the
		// controller to settle.
		if resp, _ := create("b", second, true); !resp.Allowed {
			t.Fatalf("%s refused beside %s, which is not written yet: %v", second, first, resp.Result)
		}
		stored[n.Namespace+"/"+n.Name] = n // its create returned
		resp, _ = create("b", second, false)
		if want := fmt.Sprintf("overlaps Network ns/a%d", i); resp.Allowed || !strings.Contains(resp.Result.Message, want) {
			t.Fatalf("%s right after %s: allowed=%v %v, want refused: %s", second, first, resp.Allowed, resp.Result, want)
		}
	}
	// One read each time b overlapped an admitted Network; none for the
	// others.
	if reads != 2*rounds {
		t.Errorf("%d reads from the API server, want %d", reads, 2*rounds)
	}
	for _, n := range stored {
		a.CIDRs.Set(n)
	}
	if len(a.CIDRs.admitted) != 0 {
		t.Errorf("%d admitted Networks kept after the informer delivered them all", len(a.CIDRs.admitted))
	}
}
