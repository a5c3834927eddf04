package eventsink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
)

// slowSink stores Events like the API server, taking latency per request,
// and fails as told.
type slowSink struct {
	latency time.Duration
	mu      sync.Mutex
	events  map[string]*corev1.Event
	calls   []string
	// fail, if set, is asked before each request.
	fail func(verb string, e *corev1.Event) error
}

func (s *slowSink) do(verb string, e *corev1.Event, apply func() error) (*corev1.Event, error) {
	time.Sleep(s.latency) // the API round trip being modelled, not synchronization
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, verb+" "+e.Name)
	if s.fail != nil {
		if err := s.fail(verb, e); err != nil {
			return nil, err
		}
	}
	return e, apply()
}

func (s *slowSink) Create(e *corev1.Event) (*corev1.Event, error) {
	return s.do("create", e, func() error {
		if _, ok := s.events[e.Name]; ok {
			return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "events"}, e.Name)
		}
		s.events[e.Name] = e.DeepCopy()
		return nil
	})
}

func (s *slowSink) Update(e *corev1.Event) (*corev1.Event, error) {
	return s.do("update", e, func() error { s.events[e.Name] = e.DeepCopy(); return nil })
}

func (s *slowSink) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	return s.do("patch", e, func() error {
		if _, ok := s.events[e.Name]; !ok {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "events"}, e.Name)
		}
		s.events[e.Name] = e.DeepCopy()
		return nil
	})
}

func (s *slowSink) stored() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.events)
}

type counts struct {
	mu      sync.Mutex
	written int
	dropped map[string]int
}

func (c *counts) options() Options {
	c.dropped = map[string]int{}
	return Options{
		Written: func() { c.mu.Lock(); c.written++; c.mu.Unlock() },
		Dropped: func(r string) { c.mu.Lock(); c.dropped[r]++; c.mu.Unlock() },
		Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 3},
	}
}

func (c *counts) get() (int, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := map[string]int{}
	for k, v := range c.dropped {
		d[k] = v
	}
	return c.written, d
}

func object(i int) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("o%d", i), UID: "u"}}
}

// A burst of Events from a recorder all arrive through the real broadcaster
// although each request takes a round trip: written by several writers, not
// dropped from the broadcaster's queues (1000 each) as when it writes them
// one at a time (with the API as the sink, about 2000 of the 3000 arrive).
func TestBurstArrives(t *testing.T) {
	const n = 3000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api := &slowSink{latency: 5 * time.Millisecond, events: map[string]*corev1.Event{}}
	var c counts
	sink := Start(ctx, api, c.options())
	defer sink.Stop()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(sink)
	recorder := broadcaster.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	for i := range n {
		recorder.Event(object(i), corev1.EventTypeNormal, "Created", "made")
		if i%10 == 9 {
			// Paced like many reconciles a second, slower than the
			// broadcaster hands Events on, faster than one writer.
			time.Sleep(time.Millisecond)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return api.stored() == n, nil
	}); err != nil {
		written, dropped := c.get()
		t.Fatalf("%d of %d Events stored (written %d, dropped %v)", api.stored(), n, written, dropped)
	}
	if written, dropped := c.get(); written != n || len(dropped) != 0 {
		t.Errorf("written %d, dropped %v; want %d and none", written, dropped, n)
	}
}

// A repeat of an Event patches it after its create, never before (the
// writes of one name go to one writer); a patch of an Event that is gone
// creates it whole.
func TestRepeatsInOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api := &slowSink{events: map[string]*corev1.Event{}}
	var c counts
	sink := Start(ctx, api, c.options())
	defer sink.Stop()
	for i := range 50 {
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("e%d", i)}, Count: 1}
		if _, err := sink.Create(e); err != nil {
			t.Fatal(err)
		}
		e.Count = 2
		if _, err := sink.Patch(e, []byte(`{"count":2}`)); err != nil {
			t.Fatal(err)
		}
	}
	gone := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone"}, Count: 7}
	if _, err := sink.Patch(gone, []byte(`{"count":7}`)); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		written, _ := c.get()
		return written == 101, nil
	}); err != nil {
		written, dropped := c.get()
		t.Fatalf("written %d, dropped %v; want 101", written, dropped)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	for i := range 50 {
		name := fmt.Sprintf("e%d", i)
		if got := api.events[name].Count; got != 2 {
			t.Errorf("%s: count %d, want 2", name, got)
		}
	}
	if got := api.events["gone"]; got == nil || got.Count != 7 {
		t.Errorf("patched Event that was not there: %v, want created with count 7", got)
	}
	for _, call := range api.calls {
		if call == "patch e0" {
			break
		}
		if call != "create e0" && call[len(call)-3:] == " e0" {
			t.Errorf("calls for e0 out of order: %v", api.calls)
		}
	}
}

// Every Event that is not written is counted, by why.
func TestDropsCounted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	unreachable := errors.New("connection refused")
	busy := 0
	api := &slowSink{events: map[string]*corev1.Event{}, fail: func(_ string, e *corev1.Event) error {
		switch e.Name {
		case "busy":
			// Come back later, twice: retried, then written.
			if busy++; busy <= 2 {
				return apierrors.NewServiceUnavailable("restarting")
			}
		case "invalid":
			return apierrors.NewBadRequest("bad")
		case "terminating":
			err := apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, e.Name, errors.New("namespace is terminating"))
			err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}
			return err
		case "unreachable":
			return unreachable
		}
		return nil
	}}
	var c counts
	sink := Start(ctx, api, c.options())
	defer sink.Stop()
	for _, name := range []string{"invalid", "terminating", "unreachable", "busy", "fine"} {
		if _, err := sink.Create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{DroppedRejected: 1, DroppedNamespaceTerminating: 1, DroppedRetriesExhausted: 1}
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		written, dropped := c.get()
		return written == 2 && fmt.Sprint(dropped) == fmt.Sprint(want), nil
	}); err != nil {
		written, dropped := c.get()
		t.Fatalf("written %d, dropped %v; want 2 and %v", written, dropped, want)
	}

	// A full queue drops and counts, without blocking the caller.
	block := make(chan struct{})
	blocked := &slowSink{events: map[string]*corev1.Event{}, fail: func(string, *corev1.Event) error { <-block; return nil }}
	var full counts
	o := full.options()
	o.Writers, o.QueueLength = 1, 2
	sink = Start(ctx, blocked, o)
	for i := range 10 {
		if _, err := sink.Create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	// One is being written, two are queued, the rest were dropped: 7, or 8
	// if the writer had not taken the first one yet.
	if _, dropped := full.get(); dropped[DroppedQueueFull] < 7 {
		t.Errorf("dropped %v, want at least 7 for %s", dropped, DroppedQueueFull)
	}
	close(block)
	sink.Stop()
}

// Stop writes what was queued before it, and counts what comes after.
func TestStopFlushes(t *testing.T) {
	block := make(chan struct{})
	api := &slowSink{events: map[string]*corev1.Event{}, fail: func(string, *corev1.Event) error { <-block; return nil }}
	var c counts
	o := c.options()
	o.Writers = 1
	sink := Start(context.Background(), api, o)
	for i := range 5 {
		if _, err := sink.Create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	stopped := make(chan struct{})
	go func() { sink.Stop(); close(stopped) }()
	close(block) // the writer was held in its first write
	<-stopped
	if _, err := sink.Create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "late"}}); err != nil {
		t.Fatal(err)
	}
	written, dropped := c.get()
	if written != 5 || api.stored() != 5 || dropped[DroppedStopped] != 1 || len(dropped) != 1 {
		t.Errorf("written %d (stored %d), dropped %v; want the 5 queued before Stop written and the late one counted as %s",
			written, api.stored(), dropped, DroppedStopped)
	}
}
