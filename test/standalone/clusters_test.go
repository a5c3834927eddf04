package standalone

import (
	"context"
	"fmt"
	"maps"
	"os"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	neutronbackend "github.com/netop-dev/netop/internal/backend/neutron"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/neutrontest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// sideBySide is how long two clusters run next to each other.
func sideBySide(t *testing.T) time.Duration {
	if s := os.Getenv("NETOP_SIDE_BY_SIDE_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(n) * time.Second
	}
	return time.Minute
}

// Two clusters (two standalones, each its own API server) whose netops
// share one network namespace, or one Neutron project, for a minute with a
// resync every second: neither sweeps nor repairs the other's networks.
// Each backend network keeps its identity (ifindex, Neutron ID) the whole
// time: a deletion and re-creation would change it.
func TestTwoClustersShareABackend(t *testing.T) {
	nettest.RequireRoot(t)
	t.Run("linux", func(t *testing.T) {
		t.Parallel()
		shared := nettest.NetnsName("netop-c-")
		t.Cleanup(func() { _ = nettest.DeleteNetns(shared) })
		identities := func(t *testing.T, list *samplecrdv1.NetworkList) map[types.UID]string {
			return bridgeIndexes(t, shared, list)
		}
		twoClusters(t, identities, "--netns", shared)
	})
	t.Run("neutron", func(t *testing.T) {
		t.Parallel()
		neutrontest.Require(t)
		srv, err := neutrontest.Start(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		project := fmt.Sprintf("shared%d", time.Now().UnixNano())
		be, err := neutronbackend.New(context.Background(), neutronbackend.Config{Endpoint: srv.URL, ProjectID: project})
		if err != nil {
			t.Fatal(err)
		}
		identities := func(t *testing.T, _ *samplecrdv1.NetworkList) map[types.UID]string {
			owned, err := be.ListOwned(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			out := map[types.UID]string{}
			for _, o := range owned {
				out[o.UID] = o.Status.NetworkID
			}
			return out
		}
		twoClusters(t, identities, "--backend", "neutron", "--neutron-endpoint", srv.URL, "--neutron-project", project)
	})
}

func twoClusters(t *testing.T, identities func(*testing.T, *samplecrdv1.NetworkList) map[types.UID]string, backendArgs ...string) {
	const perCluster = 10
	var clients []versioned.Interface
	for c := range 2 {
		args := append([]string{"--data-dir", t.TempDir(), "--resync", "1s", "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0"}, backendArgs...)
		sa := startStandaloneWith(t, args...)
		t.Cleanup(func() { sa.stop(t) })
		client := client(t, sa.kubeconfig)
		clients = append(clients, client)
		for i := range perCluster {
			// Disjoint cidrs: what is shared is the backend, not the
			// address space.
			if _, err := client.SamplecrdV1().Networks("default").Create(context.Background(), &samplecrdv1.Network{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%02d", i)},
				Spec:       samplecrdv1.NetworkSpec{CIDR: fmt.Sprintf("10.%d.%d.0/24", 150+c, i)},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	snapshot := func() map[types.UID]string {
		all := &samplecrdv1.NetworkList{}
		for _, client := range clients {
			var list *samplecrdv1.NetworkList
			testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
				var err error
				if list, err = client.SamplecrdV1().Networks("default").List(ctx, metav1.ListOptions{}); err != nil {
					return false, err.Error()
				}
				for _, n := range list.Items {
					if !meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady) {
						return false, fmt.Sprintf("%s is not Ready", n.Name)
					}
				}
				return len(list.Items) == perCluster, fmt.Sprintf("%d Networks", len(list.Items))
			})
			all.Items = append(all.Items, list.Items...)
		}
		ids := identities(t, all)
		out := map[types.UID]string{}
		for _, n := range all.Items {
			id, ok := ids[n.UID]
			if !ok {
				t.Fatalf("%s (UID %s) has no backend network", n.Name, n.UID)
			}
			out[n.UID] = id
		}
		return out
	}
	before := snapshot()
	deadline := time.Now().Add(sideBySide(t))
	for time.Now().Before(deadline) {
		// Checked every few seconds, so that churn shows even if the
		// networks happen to be back at the end.
		if now := snapshot(); !maps.Equal(now, before) {
			t.Fatalf("backend networks were deleted and recreated while two clusters shared the backend:\nbefore %v\nnow    %v", before, now)
		}
		time.Sleep(3 * time.Second) // the pace of the checks, not synchronisation
	}
	t.Logf("%d backend networks of two clusters kept their identity for %v", len(before), sideBySide(t))
}

// bridgeIndexes maps each Network to the ifindex of its bridge.
func bridgeIndexes(t *testing.T, netnsName string, list *samplecrdv1.NetworkList) map[types.UID]string {
	t.Helper()
	handle := nettest.Handle(t, netnsName)
	out := map[types.UID]string{}
	for _, n := range list.Items {
		if n.Status.Backend == nil {
			continue
		}
		if link, err := handle.LinkByName(n.Status.Backend.Interface); err == nil {
			out[n.UID] = strconv.Itoa(link.Attrs().Index)
		}
	}
	return out
}
