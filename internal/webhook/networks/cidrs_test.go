package networks

import (
	"context"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		e, ok := cidrs.Overlapping(netip.MustParsePrefix(cidr), namespace, name)
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
