package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// fixture is the Network controller on the generated fake clientset and
// the in-memory backend, with its cache filled by hand: sync runs with no
// API server, no kernel and no root.
type fixture struct {
	t          testing.TB
	client     *fake.Clientset
	backend    *backendtest.Backend
	recorder   *record.FakeRecorder
	controller *Controller
}

func newFixture(t testing.TB, networks ...*samplecrdv2.Network) *fixture {
	t.Helper()
	return newFixtureWith(t, Options{Workers: 1, Resync: time.Hour}, networks...)
}

// newFixtureWith is newFixture with the controller's options.
func newFixtureWith(t testing.TB, opts Options, networks ...*samplecrdv2.Network) *fixture {
	t.Helper()
	objects := make([]runtime.Object, 0, len(networks))
	for _, n := range networks {
		objects = append(objects, n)
	}
	f := &fixture{
		t:        t,
		client:   fake.NewSimpleClientset(objects...),
		backend:  backendtest.New(),
		recorder: record.NewFakeRecorder(100),
	}
	informer := informers.NewSharedInformerFactory(f.client, 0).Samplecrd().V2().Networks()
	var err error
	f.controller, err = New(context.Background(), f.client, informer.Informer(), f.backend, f.recorder, metrics.New(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range networks {
		if err := informer.Informer().GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
		f.controller.record(n)
	}
	f.client.ClearActions()
	return f
}

// network is a Network as the API server stores it after admission: UID,
// generation 1, the finalizer, no status yet.
func network(name, cidr, gateway string) *samplecrdv2.Network {
	return &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("0badc0de-0000-4000-8000-" + name),
			Generation: 1, ResourceVersion: "5", Finalizers: []string{samplecrd.Finalizer}},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{cidr}, Gateways: []string{gateway}},
	}
}

// readyNetwork gives n the status the controller writes once the in-memory
// backend has its network.
func readyNetwork(n *samplecrdv2.Network) *samplecrdv2.Network {
	s := backendtest.Status(n.UID)
	n.Status = samplecrdv2.NetworkStatus{
		ObservedGeneration: n.Generation, CIDRs: n.Spec.CIDRs, Gateways: n.Spec.Gateways, Backend: backendStatus(&s),
		Conditions: []metav1.Condition{{Type: samplecrd.ConditionReady, Status: metav1.ConditionTrue, Reason: samplecrd.ReasonProvisioned,
			Message:            "linux network " + s.Interface + " has " + n.Spec.CIDRs[0] + " with gateway " + n.Spec.Gateways[0],
			ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(time.Now())}},
	}
	return n
}

// inBackend puts n's network, as its spec says, into the backend.
func (f *fixture) inBackend(n *samplecrdv2.Network) {
	f.backend.Put(backend.Observed{Owner: owner(n), Status: backendtest.Status(n.UID),
		Families: []backend.Family{{CIDR: netip.MustParsePrefix(n.Spec.CIDRs[0]), Gateway: netip.MustParseAddr(n.Spec.Gateways[0])}}})
}

func owner(n *samplecrdv2.Network) backend.Owner {
	return backend.Owner{Namespace: n.Namespace, Name: n.Name, UID: n.UID}
}

// actions lists the requests sync sent, as "verb resource[/subresource]".
func (f *fixture) actions() []string {
	var out []string
	for _, a := range f.client.Actions() {
		r := a.GetResource().Resource
		if a.GetSubresource() != "" {
			r += "/" + a.GetSubresource()
		}
		out = append(out, a.GetVerb()+" "+r)
	}
	return out
}

// events lists the Events recorded, as "Type Reason".
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			fields := strings.Fields(e)
			out = append(out, fields[0]+" "+fields[1])
		default:
			return out
		}
	}
}

// written is the Network of the last status write, or nil.
func (f *fixture) written() *samplecrdv2.Network {
	var n *samplecrdv2.Network
	for _, a := range f.client.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" {
			n = u.GetObject().(*samplecrdv2.Network)
		}
	}
	return n
}

// finalizerPatch is the body of the finalizer patch sent, or "".
func (f *fixture) finalizerPatch() string {
	for _, a := range f.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			return string(p.GetPatch())
		}
	}
	return ""
}

var errBackendDown = errors.New("injected: backend unreachable")

func deleting(n *samplecrdv2.Network) *samplecrdv2.Network {
	n.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	return n
}

func TestSync(t *testing.T) {
	networksResource := schema.GroupResource{Group: samplecrd.GroupName, Resource: "networks"}
	tests := []struct {
		name string
		// network is in the cache and the API; nil: none.
		network *samplecrdv2.Network
		// inBackend: its network exists, as its spec says.
		inBackend bool
		// failing makes these backend operations fail, with failErr
		// (default errBackendDown).
		failing []string
		failErr error
		// reactor scripts an API answer.
		reactor func(*fake.Clientset)
		// setup runs last before the sync.
		setup func(*fixture)

		wantActions []string
		wantEvents  []string
		// wantReady and wantReason are the Ready condition of the status
		// written; "" when none is.
		wantReady  metav1.ConditionStatus
		wantReason string
		// wantFinalizer: the finalizer patch adds (true) or removes it.
		wantFinalizerPatch string
		wantOutcome        string
		// wantInBackend: the network exists in the backend afterwards.
		wantInBackend bool
	}{{
		name:          "new Network: backend network created, status Ready",
		network:       network("n", "10.1.0.0/16", "10.1.0.1"),
		wantActions:   []string{"update networks/status"},
		wantEvents:    []string{"Normal " + ReasonCreated},
		wantReady:     metav1.ConditionTrue,
		wantReason:    samplecrd.ReasonProvisioned,
		wantOutcome:   metrics.ResultSuccess,
		wantInBackend: true,
	}, {
		name: "made while the webhook was away: finalizer patched first",
		network: func() *samplecrdv2.Network {
			n := network("n", "10.1.0.0/16", "10.1.0.1")
			n.Finalizers = nil
			return n
		}(),
		wantActions:        []string{"patch networks", "update networks/status"},
		wantEvents:         []string{"Normal " + ReasonCreated},
		wantReady:          metav1.ConditionTrue,
		wantReason:         samplecrd.ReasonProvisioned,
		wantFinalizerPatch: `{"metadata":{"finalizers":["samplecrd.k8s.io/network-cleanup"],"resourceVersion":"5"}}`,
		wantOutcome:        metrics.ResultSuccess,
		wantInBackend:      true,
	}, {
		name:          "converged: no request, no Event",
		network:       readyNetwork(network("n", "10.1.0.0/16", "10.1.0.1")),
		inBackend:     true,
		wantOutcome:   metrics.ResultSuccess,
		wantInBackend: true,
	}, {
		name:          "status says converged but the network is gone: recreated",
		network:       readyNetwork(network("n", "10.1.0.0/16", "10.1.0.1")),
		wantEvents:    []string{"Normal " + ReasonCreated},
		wantOutcome:   metrics.ResultSuccess,
		wantInBackend: true,
	}, {
		name: "spec changed: backend network updated, status follows",
		network: func() *samplecrdv2.Network {
			n := readyNetwork(network("n", "10.1.0.0/16", "10.1.0.1"))
			n.Spec.Gateways[0], n.Generation = "10.1.0.7", 2
			return n
		}(),
		setup: func(f *fixture) {
			f.inBackend(network("n", "10.1.0.0/16", "10.1.0.1"))
		},
		wantActions:   []string{"update networks/status"},
		wantEvents:    []string{"Normal " + ReasonUpdated},
		wantReady:     metav1.ConditionTrue,
		wantReason:    samplecrd.ReasonProvisioned,
		wantOutcome:   metrics.ResultSuccess,
		wantInBackend: true,
	}, {
		name:        "invalid spec: Invalid, not retried, backend untouched",
		network:     network("n", "10.1.0.0/16", "10.2.0.1"),
		wantActions: []string{"update networks/status"},
		wantEvents:  []string{"Warning " + samplecrd.ReasonInvalid},
		wantReady:   metav1.ConditionFalse,
		wantReason:  samplecrd.ReasonInvalid,
		wantOutcome: metrics.ResultSuccess,
	}, {
		name:        "backend failing: BackendError, retried",
		network:     network("n", "10.1.0.0/16", "10.1.0.1"),
		failing:     []string{backend.OperationEnsure},
		wantActions: []string{"update networks/status"},
		wantEvents:  []string{"Warning " + samplecrd.ReasonBackendError},
		wantReady:   metav1.ConditionFalse,
		wantReason:  samplecrd.ReasonBackendError,
		wantOutcome: metrics.ResultError,
	}, {
		name:        "backend refuses the spec (backend.ErrInvalid): Invalid, not retried",
		network:     network("n", "10.1.0.0/16", "10.1.0.1"),
		failing:     []string{backend.OperationEnsure},
		failErr:     fmt.Errorf("add address 10.1.0.1/16 to bridge netop0badc0de0: cannot assign requested address: %w", backend.ErrInvalid),
		wantActions: []string{"update networks/status"},
		wantEvents:  []string{"Warning " + samplecrd.ReasonInvalid},
		wantReady:   metav1.ConditionFalse,
		wantReason:  samplecrd.ReasonInvalid,
		wantOutcome: metrics.ResultSuccess,
	}, {
		name:    "status write conflicts: retried",
		network: network("n", "10.1.0.0/16", "10.1.0.1"),
		reactor: func(c *fake.Clientset) {
			c.PrependReactor("update", "networks", func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewConflict(networksResource, "n", errors.New("the object has been modified"))
			})
		},
		wantActions:   []string{"update networks/status"},
		wantEvents:    []string{"Normal " + ReasonCreated},
		wantReady:     metav1.ConditionTrue,
		wantReason:    samplecrd.ReasonProvisioned,
		wantOutcome:   metrics.ResultConflict,
		wantInBackend: true,
	}, {
		name:        "gone from the cache: nothing to do",
		wantOutcome: metrics.ResultSuccess,
	}, {
		name:               "deleted: backend network removed, then the finalizer",
		network:            deleting(readyNetwork(network("n", "10.1.0.0/16", "10.1.0.1"))),
		inBackend:          true,
		wantActions:        []string{"patch networks"},
		wantEvents:         []string{"Normal " + ReasonDeleted},
		wantFinalizerPatch: `{"metadata":{"finalizers":[],"resourceVersion":"5"}}`,
		wantOutcome:        metrics.ResultSuccess,
	}, {
		name:          "deleted, backend failing: finalizer kept, Deleting, retried",
		network:       deleting(readyNetwork(network("n", "10.1.0.0/16", "10.1.0.1"))),
		inBackend:     true,
		failing:       []string{backend.OperationDelete},
		wantActions:   []string{"update networks/status"},
		wantEvents:    []string{"Warning " + samplecrd.ReasonBackendError},
		wantReady:     metav1.ConditionFalse,
		wantReason:    samplecrd.ReasonDeleting,
		wantOutcome:   metrics.ResultError,
		wantInBackend: true,
	}, {
		name: "deleted and the finalizer already gone: nothing to do",
		network: func() *samplecrdv2.Network {
			n := deleting(readyNetwork(network("n", "10.1.0.0/16", "10.1.0.1")))
			n.Finalizers = []string{"someone-else"}
			return n
		}(),
		inBackend:     true,
		wantOutcome:   metrics.ResultSuccess,
		wantInBackend: true,
	}, {
		name: "finalizer patch finds the Network gone: not retried",
		network: func() *samplecrdv2.Network {
			n := network("n", "10.1.0.0/16", "10.1.0.1")
			n.Finalizers = nil
			return n
		}(),
		reactor: func(c *fake.Clientset) {
			c.PrependReactor("patch", "networks", func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewNotFound(networksResource, "n")
			})
		},
		wantActions:        []string{"patch networks"},
		wantFinalizerPatch: `{"metadata":{"finalizers":["samplecrd.k8s.io/network-cleanup"],"resourceVersion":"5"}}`,
		wantOutcome:        metrics.ResultNotFound,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var networks []*samplecrdv2.Network
			name := cache.NewObjectName("ns", "n")
			if tt.network != nil {
				networks = append(networks, tt.network)
			}
			f := newFixture(t, networks...)
			if tt.inBackend {
				f.inBackend(tt.network)
			}
			if len(tt.failing) > 0 {
				failErr := errBackendDown
				if tt.failErr != nil {
					failErr = tt.failErr
				}
				f.backend.Fail(failErr, tt.failing...)
			}
			if tt.reactor != nil {
				tt.reactor(f.client)
			}
			if tt.setup != nil {
				tt.setup(f)
			}

			err := f.controller.sync(context.Background(), name)

			if got := runner.Outcome(err, name); got != tt.wantOutcome {
				t.Errorf("outcome %s (%v), want %s", got, err, tt.wantOutcome)
			}
			if got := f.actions(); !slices.Equal(got, tt.wantActions) {
				t.Errorf("requests %q, want %q", got, tt.wantActions)
			}
			if got := f.events(); !slices.Equal(got, tt.wantEvents) {
				t.Errorf("Events %q, want %q", got, tt.wantEvents)
			}
			if got := f.finalizerPatch(); got != tt.wantFinalizerPatch {
				t.Errorf("finalizer patch %s, want %s", got, tt.wantFinalizerPatch)
			}
			written := f.written()
			switch {
			case tt.wantReason == "" && written != nil:
				t.Errorf("status written: %+v", written.Status)
			case tt.wantReason != "" && written == nil:
				t.Errorf("no status written, want Ready=%s %s", tt.wantReady, tt.wantReason)
			case written != nil:
				ready := meta.FindStatusCondition(written.Status.Conditions, samplecrd.ConditionReady)
				if ready == nil || ready.Status != tt.wantReady || ready.Reason != tt.wantReason || ready.ObservedGeneration != written.Generation {
					t.Errorf("Ready condition %+v, want %s %s at generation %d", ready, tt.wantReady, tt.wantReason, written.Generation)
				}
				if written.Status.ObservedGeneration != written.Generation {
					t.Errorf("observedGeneration %d, generation %d", written.Status.ObservedGeneration, written.Generation)
				}
				if tt.wantReady == metav1.ConditionTrue && (!backend.SameStatus(backendRef(written.Status.Backend), ptr.To(backendtest.Status(written.UID))) ||
					!slices.Equal(written.Status.CIDRs, written.Spec.CIDRs) || !slices.Equal(written.Status.Gateways, written.Spec.Gateways)) {
					t.Errorf("Ready status %+v does not name the backend network and its cidr and gateway", written.Status)
				}
			}
			if tt.network != nil {
				o, ok := f.backend.Networks()[tt.network.UID]
				if ok != tt.wantInBackend {
					t.Errorf("in backend: %v, want %v", ok, tt.wantInBackend)
				}
				if want := (backend.Network{Families: []backend.Family{{CIDR: netip.MustParsePrefix(tt.network.Spec.CIDRs[0]), Gateway: netip.MustParseAddr(tt.network.Spec.Gateways[0])}}}); ok && tt.network.DeletionTimestamp == nil && !o.Provides(want) {
					t.Errorf("backend network %+v, want the spec's %s %s", o.Families, tt.network.Spec.CIDRs[0], tt.network.Spec.Gateways[0])
				}
			}
		})
	}
}

// createdAt sets n's creationTimestamp to t0 plus age seconds.
func createdAt(n *samplecrdv2.Network, age int) *samplecrdv2.Network {
	n.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 22, 0, 0, age, 0, time.UTC))
	return n
}

// update replaces n in the fixture's cache, as an informer update would.
func (f *fixture) update(n *samplecrdv2.Network) {
	f.t.Helper()
	if err := f.controller.indexer.Update(n); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.client.Tracker().Get(schema.GroupVersionResource{Group: samplecrd.GroupName, Version: "v1", Resource: "networks"}, n.Namespace, n.Name); err == nil {
		if err := f.client.Tracker().Update(schema.GroupVersionResource{Group: samplecrd.GroupName, Version: "v1", Resource: "networks"}, n, n.Namespace); err != nil {
			f.t.Fatal(err)
		}
	}
	f.controller.contend(n)
}

// sync runs one sync of n and fails the test on an error.
func (f *fixture) sync(n *samplecrdv2.Network) {
	f.t.Helper()
	if err := f.controller.sync(context.Background(), cache.MetaObjectToName(n)); err != nil {
		f.t.Fatalf("sync %s: %v", n.Name, err)
	}
}

// lastReady is the Ready condition of the last status written for n.
func (f *fixture) lastReady(n *samplecrdv2.Network) *metav1.Condition {
	var last *samplecrdv2.Network
	for _, a := range f.client.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" {
			if w := u.GetObject().(*samplecrdv2.Network); w.Name == n.Name {
				last = w
			}
		}
	}
	if last == nil {
		return nil
	}
	return meta.FindStatusCondition(last.Status.Conditions, samplecrd.ConditionReady)
}

// Of two overlapping Networks the older one is built and the younger one
// reports Overlap with no backend network, whichever is synced first; when
// the older one goes, the younger one is built.
func TestSyncOverlap(t *testing.T) {
	t.Run("younger one synced first", func(t *testing.T) {
		older := createdAt(network("older", "10.0.0.0/16", "10.0.0.1"), 0)
		younger := createdAt(network("younger", "10.0.1.0/24", "10.0.1.1"), 1)
		f := newFixture(t, older, younger)

		f.sync(younger)
		if _, ok := f.backend.Networks()[younger.UID]; ok {
			t.Fatal("the younger Network was built")
		}
		if f.backend.Calls(backend.OperationEnsure) != 0 {
			t.Error("the losing Network reached the backend's Ensure")
		}
		ready := f.lastReady(younger)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != samplecrd.ReasonOverlap || !strings.Contains(ready.Message, "ns/older (10.0.0.0/16)") {
			t.Fatalf("younger's Ready condition %+v, want False Overlap naming ns/older", ready)
		}
		if got := f.events(); !slices.Equal(got, []string{"Warning " + samplecrd.ReasonOverlap}) {
			t.Errorf("Events %q, want one Warning Overlap", got)
		}
		f.sync(older)
		if _, ok := f.backend.Networks()[older.UID]; !ok {
			t.Fatal("the older Network was not built")
		}

		// The older one is deleted: its finalizer removes its network and
		// the younger one is enqueued and built.
		f.update(deleting(older.DeepCopy()))
		f.sync(older)
		if _, ok := f.backend.Networks()[older.UID]; ok {
			t.Fatal("the deleted Network's backend network is still there")
		}
		if f.controller.Len() == 0 {
			t.Error("the younger Network was not enqueued when the older one went")
		}
		f.sync(younger)
		if _, ok := f.backend.Networks()[younger.UID]; !ok {
			t.Fatal("the younger Network was not built once the older one went")
		}
		if ready := f.lastReady(younger); ready == nil || ready.Status != metav1.ConditionTrue {
			t.Errorf("younger's Ready condition %+v, want True", ready)
		}
	})

	t.Run("older one arrives after the younger one was built", func(t *testing.T) {
		// Created in the same second: the smaller UID (older's) wins.
		younger := readyNetwork(createdAt(network("younger", "10.0.1.0/24", "10.0.1.1"), 5))
		older := createdAt(network("older", "10.0.0.0/16", "10.0.0.1"), 5)
		f := newFixture(t, younger, older)
		f.inBackend(younger)

		// older wins, but waits: younger's network is still there.
		f.sync(older)
		if f.backend.Calls(backend.OperationEnsure) != 0 {
			t.Fatal("the older Network was built while the younger one's network existed")
		}
		if f.controller.Len() == 0 {
			t.Fatal("the younger Network was not enqueued to give its network up")
		}
		f.sync(younger)
		if _, ok := f.backend.Networks()[younger.UID]; ok {
			t.Fatal("the younger Network kept its backend network")
		}
		if ready := f.lastReady(younger); ready == nil || ready.Reason != samplecrd.ReasonOverlap {
			t.Fatalf("younger's Ready condition %+v, want Overlap", ready)
		}
		f.sync(older)
		if _, ok := f.backend.Networks()[older.UID]; !ok {
			t.Fatal("the older Network was not built once the younger one gave its network up")
		}
	})

	t.Run("the resync finds a loser's network", func(t *testing.T) {
		older := readyNetwork(createdAt(network("older", "10.0.0.0/16", "10.0.0.1"), 0))
		younger := createdAt(network("younger", "10.0.1.0/24", "10.0.1.1"), 1)
		f := newFixture(t, older, younger)
		f.inBackend(older)
		// A crash left younger's network without a status.
		f.inBackend(younger)
		f.controller.resync(context.Background())
		if f.controller.Len() != 1 {
			t.Fatalf("%d Networks requeued, want 1 (younger)", f.controller.Len())
		}
		f.sync(younger)
		if _, ok := f.backend.Networks()[younger.UID]; ok {
			t.Fatal("the loser's network found by the resync was not removed")
		}
	})
}

// Two syncs on the same stale cache, as a drift echo makes them, write the
// status once: the second would only earn a conflict.
func TestSyncOnAStaleCacheWritesOnce(t *testing.T) {
	n := network("n", "10.1.0.0/16", "10.1.0.1")
	f := newFixture(t, n)
	name := cache.MetaObjectToName(n)
	for range 2 {
		if err := f.controller.sync(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := f.actions(), []string{"update networks/status"}; !slices.Equal(got, want) {
		t.Errorf("requests %q, want %q", got, want)
	}
	if got := f.events(); !slices.Equal(got, []string{"Normal " + ReasonCreated}) {
		t.Errorf("Events %q", got)
	}
}

// The resync sweeps what no Network claims and requeues the Networks whose
// backend network differs, at the cost of one backend list.
func TestResync(t *testing.T) {
	ok := readyNetwork(network("ok", "10.1.0.0/16", "10.1.0.1"))
	missing := readyNetwork(network("missing", "10.2.0.0/16", "10.2.0.1"))
	changed := readyNetwork(network("changed", "10.3.0.0/16", "10.3.0.1"))
	invalid := network("invalid", "10.4.0.0/16", "10.5.0.1")
	f := newFixture(t, ok, missing, changed, invalid)
	f.inBackend(ok)
	f.inBackend(changed)
	f.backend.Put(backend.Observed{Owner: owner(changed), Status: backendtest.Status(changed.UID),
		Families: []backend.Family{{CIDR: netip.MustParsePrefix("10.3.0.0/16"), Gateway: netip.MustParseAddr("10.3.0.9")}}})
	orphan := network("orphan", "10.9.0.0/16", "10.9.0.1")
	f.inBackend(orphan)

	f.controller.resync(context.Background())

	if _, ok := f.backend.Networks()[orphan.UID]; ok {
		t.Error("the orphan was not swept")
	}
	if got := f.backend.Calls(backend.OperationList); got != 1 {
		t.Errorf("%d backend lists, want 1", got)
	}
	// The orphan's owner was looked up live before it was deleted.
	if got, want := f.actions(), []string{"get networks", "list networks"}; !slices.Equal(got, want) {
		t.Errorf("requests %q, want %q", got, want)
	}
	if got := f.controller.Len(); got != 2 {
		t.Errorf("%d Networks requeued, want 2 (missing, changed)", got)
	}
	observed := map[types.UID]backend.Observed{}
	for uid, o := range f.backend.Networks() {
		observed[uid] = o
	}
	for n, want := range map[*samplecrdv2.Network]bool{ok: true, missing: false, changed: false, invalid: true} {
		if got := f.controller.inSync(n, observed); got != want {
			t.Errorf("inSync(%s) = %v, want %v", n.Name, got, want)
		}
	}
}

// A change behind netop's back, reported by the backend's drift watch,
// requeues the Network that owns it, and only that one.
func TestDriftWatchRequeuesTheOwner(t *testing.T) {
	n := readyNetwork(network("n", "10.1.0.0/16", "10.1.0.1"))
	stranger := network("stranger", "10.9.0.0/16", "10.9.0.1") // owned by no Network in the cache
	f := newFixture(t, n)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.controller.watchDrift(ctx, f.backend) }()
	// Drift reaches the watch once it is registered: report until it is.
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		f.backend.Drift(owner(stranger))
		f.backend.Drift(owner(n))
		return f.controller.Len() > 0, nil
	})
	if err != nil {
		t.Fatal("a drift of n's network did not requeue it")
	}
	if got := f.controller.Len(); got != 1 {
		t.Errorf("%d Networks requeued, want 1 (n; the stranger has no Network)", got)
	}
	cancel()
	<-done
}

// Options.AllowReservedPrefixes (--allow-reserved-prefixes) decides whether
// a reserved range is built or reported Invalid.
func TestSyncReservedPrefixes(t *testing.T) {
	for _, allow := range []bool{false, true} {
		n := network("n", "169.254.0.0/16", "169.254.0.1")
		client := fake.NewSimpleClientset(n)
		informer := informers.NewSharedInformerFactory(client, 0).Samplecrd().V2().Networks()
		be := backendtest.New()
		c, err := New(context.Background(), client, informer.Informer(), be, record.NewFakeRecorder(100), metrics.New(),
			Options{Workers: 1, Resync: time.Hour, AllowReservedPrefixes: allow})
		if err != nil {
			t.Fatal(err)
		}
		if err := informer.Informer().GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
		if err := c.sync(context.Background(), cache.MetaObjectToName(n)); err != nil {
			t.Fatalf("allow=%v: sync: %v", allow, err)
		}
		if _, built := be.Networks()[n.UID]; built != allow {
			t.Errorf("allow=%v: built %v", allow, built)
		}
	}
}
