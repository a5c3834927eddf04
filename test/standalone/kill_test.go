package standalone

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netop-dev/netop/internal/backend/linux"
	neutronbackend "github.com/netop-dev/netop/internal/backend/neutron"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/neutrontest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// kill ends the process at once, as a crash or the OOM killer would.
func (s *standalone) kill(t *testing.T) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
}

// SIGKILL in the middle of creating and of deleting many Networks, then a
// restart on the same data directory: the bridges end up exactly the
// Networks that exist, none leaked and none missing. make test-faults runs
// it bigger (NETOP_FAULT_NETWORKS, NETOP_FAULT_ROUNDS).
func TestSIGKILLDuringCreateAndDeleteLeavesNoLeak(t *testing.T) {
	nettest.RequireRoot(t)
	networks, rounds := envInt(t, "NETOP_FAULT_NETWORKS", 60), envInt(t, "NETOP_FAULT_ROUNDS", 1)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("%d rounds of %d Networks, random seed %d", rounds, networks, seed)
	netns := nettest.NetnsName("netop-k-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(netns) })
	dataDir := t.TempDir()
	args := []string{"--data-dir", dataDir, "--netns", netns, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0"}

	sa := startStandaloneWith(t, args...)
	for round := range rounds {
		nets := client(t, sa.kubeconfig).SamplecrdV1().Networks("default")

		// Create in parallel and kill once a random share is Ready.
		var wg sync.WaitGroup
		var created sync.Map
		for i := range networks {
			wg.Go(func() {
				g := round*networks + i
				name := fmt.Sprintf("r%d-n%03d", round, i)
				_, err := nets.Create(context.Background(), &samplecrdv1.Network{
					ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec:       samplecrdv1.NetworkSpec{CIDR: fmt.Sprintf("10.%d.%d.0/24", 100+g/250, g%250)},
				}, metav1.CreateOptions{})
				if err == nil {
					created.Store(name, true)
				}
			})
		}
		killAt := networks/5 + rng.IntN(networks*3/5+1)
		waitReadyCount(t, nets, fmt.Sprintf("r%d-", round), killAt)
		sa.kill(t)
		wg.Wait()
		t.Logf("round %d: killed with %d+ Ready during creation; %d creates went through", round, killAt, count(&created))

		sa = startStandaloneWith(t, args...)
		nets = client(t, sa.kubeconfig).SamplecrdV1().Networks("default")
		converged(t, nets, netns)

		// Delete half and kill after a random delay while the finalizers
		// are being processed.
		list, err := nets.List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		deleting := 0
		for i, n := range list.Items {
			if i%2 == 0 {
				deleting++
				wg.Go(func() { _ = nets.Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
			}
		}
		wg.Wait()
		delay := time.Duration(rng.IntN(300)) * time.Millisecond
		time.Sleep(delay) // where the kill lands, not synchronisation
		sa.kill(t)
		t.Logf("round %d: killed %v into the deletion of %d of %d Networks", round, delay, deleting, len(list.Items))

		sa = startStandaloneWith(t, args...)
		converged(t, client(t, sa.kubeconfig).SamplecrdV1().Networks("default"), netns)
	}
	sa.stop(t)
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

func count(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

type networkLister interface {
	List(ctx context.Context, opts metav1.ListOptions) (*samplecrdv1.NetworkList, error)
}

func waitReadyCount(t *testing.T, nets networkLister, prefix string, want int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := nets.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, n := range list.Items {
			if n.Status.Backend != nil && strings.HasPrefix(n.Name, prefix) {
				ready++
			}
		}
		return ready >= want, nil
	})
	if err != nil {
		t.Fatalf("fewer than %d Networks provisioned within 60s", want)
	}
}

// converged waits until every Network is Ready and the bridges are exactly
// theirs.
func converged(t *testing.T, nets networkLister, netns string) {
	t.Helper()
	lb, err := linux.New(context.Background(), linux.Config{Netns: netns})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	var networks, bridges int
	testenv.Eventually(t, 90*time.Second, func(ctx context.Context) (bool, string) {
		var ok bool
		networks, bridges, ok = testenv.BackendMatches(ctx, func(ctx context.Context) (*samplecrdv1.NetworkList, error) {
			return nets.List(ctx, metav1.ListOptions{})
		}, lb)
		return ok, fmt.Sprintf("%d Networks, %d bridges", networks, bridges)
	})
	t.Logf("converged: %d Networks, %d bridges, none leaked or missing", networks, bridges)
}

// SIGKILL with the Neutron backend, and Neutron itself going down in the
// middle: after both are back, Neutron holds exactly one network per
// Network, none leaked, none missing, none duplicated.
func TestSIGKILLWithNeutronOutage(t *testing.T) {
	neutrontest.Require(t)
	srv, err := neutrontest.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	networks := envInt(t, "NETOP_FAULT_NETWORKS", 30)
	project := fmt.Sprintf("kill%d", time.Now().UnixNano())
	be, err := neutronbackend.New(context.Background(), neutronbackend.Config{Endpoint: srv.URL, ProjectID: project})
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--data-dir", t.TempDir(), "--backend", "neutron", "--neutron-endpoint", srv.URL, "--neutron-project", project,
		"--resync", "2s", "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0"}
	sa := startStandaloneWith(t, args...)
	nets := client(t, sa.kubeconfig).SamplecrdV1().Networks("default")
	var wg sync.WaitGroup
	for i := range networks {
		wg.Go(func() {
			_, _ = nets.Create(context.Background(), &samplecrdv1.Network{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%03d", i)},
				Spec:       samplecrdv1.NetworkSpec{CIDR: fmt.Sprintf("10.%d.%d.0/24", 120+i/250, i%250)},
			}, metav1.CreateOptions{})
		})
	}
	waitReadyCount(t, nets, "n", networks/3)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	sa.kill(t)
	t.Logf("Neutron stopped with %d+ of %d Networks Ready, then netop killed", networks/3, networks)

	sa = startStandaloneWith(t, args...)
	nets = client(t, sa.kubeconfig).SamplecrdV1().Networks("default")
	// Delete a third while Neutron is still down, then bring it back.
	list, err := nets.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range list.Items {
		if i%3 == 0 {
			_ = nets.Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		}
	}
	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	var left, owned int
	testenv.Eventually(t, 3*time.Minute, func(ctx context.Context) (bool, string) {
		var ok bool
		left, owned, ok = testenv.BackendMatches(ctx, func(ctx context.Context) (*samplecrdv1.NetworkList, error) {
			return nets.List(ctx, metav1.ListOptions{})
		}, be)
		return ok, fmt.Sprintf("%d Networks, %d Neutron networks", left, owned)
	})
	t.Logf("converged after the outage and the kill: %d Networks, %d Neutron networks, none leaked, missing or duplicated", left, owned)
	sa.stop(t)
}
