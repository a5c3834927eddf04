// Package eventsink writes the Events of client-go's event broadcaster with
// several writers at once, and counts every Event it drops.
//
// The broadcaster (tools/record) hands Events to its sink one at a time, so
// one API round trip per Event bounds their rate: under load that was fewer
// Events a second than the controller wrote statuses, its queue of 1000
// filled, and at 10000 Networks it dropped 6.7 % of them with nothing but a
// log line. A Sink returns at once and writes in the background: the Events
// are spread over writers by name, so that the writes of one Event (its
// create, then the count updates of its repeats) stay in order, and the
// rate is the event client's rate limit, not the latency. What it cannot
// write it counts, by reason.
package eventsink

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Reasons an Event is dropped.
const (
	// DroppedQueueFull: its writer's queue was full.
	DroppedQueueFull = "queue_full"
	// DroppedRejected: the API server refused it for what it is (invalid,
	// forbidden), so trying again cannot help. Errors that say to come
	// back later (429, 5xx, timeouts) are retried.
	DroppedRejected = "rejected"
	// DroppedNamespaceTerminating: its namespace is being deleted, with
	// the object it is about.
	DroppedNamespaceTerminating = "namespace_terminating"
	// DroppedRetriesExhausted: the API server could not be reached for the
	// whole backoff.
	DroppedRetriesExhausted = "retries_exhausted"
	// DroppedStopped: the sink was stopped before it could write it.
	DroppedStopped = "stopped"
)

// Options tune a Sink. Zero values take the defaults.
type Options struct {
	// Writers write at once (default 8).
	Writers int
	// QueueLength is each writer's queue (default 1000).
	QueueLength int
	// Backoff is how a write is retried while the API server cannot be
	// reached or asks to come back later (default: 9 tries 200 ms apart,
	// doubling, about 50 s in all: an API server restart).
	Backoff wait.Backoff
	// Written is called for each Event write that succeeded; Dropped for
	// each one given up, with its reason. Either may be nil.
	Written func()
	Dropped func(reason string)
}

type verb int

const (
	create verb = iota
	update
	patch
)

type write struct {
	verb  verb
	event *corev1.Event
	patch []byte
}

// Sink is a record.EventSink that queues and returns at once.
type Sink struct {
	next   record.EventSink
	opts   Options
	queues []chan write
	// ctx ends with Stop: the writers flush and return, in-flight retries
	// end. closed, under mu, keeps an enqueue from racing a writer's last
	// flush: what is queued before Stop is written or counted, what comes
	// after is counted.
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.RWMutex
	closed  bool
	writers sync.WaitGroup
}

var _ record.EventSink = (*Sink)(nil)

// Start returns a Sink writing to next until Stop. ctx gives the logger;
// its end does not stop the sink, so that the Events of a controller that
// is stopping with the same ctx are still written.
func Start(ctx context.Context, next record.EventSink, o Options) *Sink {
	if o.Writers <= 0 {
		o.Writers = 8
	}
	if o.QueueLength <= 0 {
		o.QueueLength = 1000
	}
	if o.Backoff.Steps == 0 {
		// No Cap: a capped backoff stops at the cap (apimachinery's
		// Backoff sets Steps to 0 there).
		o.Backoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 9}
	}
	logger := klog.FromContext(ctx).WithName("events")
	s := &Sink{next: next, opts: o}
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	for range o.Writers {
		q := make(chan write, o.QueueLength)
		s.queues = append(s.queues, q)
		s.writers.Go(func() { s.run(logger, q) })
	}
	return s
}

// Stop writes what is queued, once each, for up to flushTimeout, counts
// the rest, and returns once the writers have stopped. Events handed to
// the sink afterwards are counted as dropped.
func (s *Sink) Stop() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.writers.Wait()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.writers.Wait()
}

// Create queues the creation of e.
func (s *Sink) Create(e *corev1.Event) (*corev1.Event, error) {
	s.enqueue(write{verb: create, event: e.DeepCopy()})
	return e, nil
}

// Update queues the update of e.
func (s *Sink) Update(e *corev1.Event) (*corev1.Event, error) {
	s.enqueue(write{verb: update, event: e.DeepCopy()})
	return e, nil
}

// Patch queues a patch of e (a repeat's count and time); e is created
// whole if it is not there.
func (s *Sink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	s.enqueue(write{verb: patch, event: e.DeepCopy(), patch: data})
	return e, nil
}

// enqueue never blocks: the broadcaster must not wait on the API server.
// Returning no error for a dropped Event is deliberate: the broadcaster
// would retry it in its own goroutine, sleeping, and fall behind.
func (s *Sink) enqueue(w write) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(w.event.Namespace + "/" + w.event.Name))
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.dropped(DroppedStopped)
		return
	}
	select {
	case s.queues[h.Sum32()%uint32(len(s.queues))] <- w:
	default:
		s.dropped(DroppedQueueFull)
	}
}

func (s *Sink) run(logger klog.Logger, q chan write) {
	for {
		select {
		case <-s.ctx.Done():
			s.flush(logger, q)
			return
		case w := <-q:
			s.write(logger, w)
		}
	}
}

// flushTimeout bounds how long a stopping sink spends writing what is
// queued, once each, so that a clean stop keeps its last Events (a request
// in flight when it passes still finishes: the event client's timeout
// bounds it).
const flushTimeout = 5 * time.Second

func (s *Sink) flush(logger klog.Logger, q chan write) {
	deadline := time.Now().Add(flushTimeout)
	for {
		select {
		case w := <-q:
			if time.Now().After(deadline) {
				s.dropped(DroppedStopped)
				continue
			}
			s.writeOnce(logger, w)
		default:
			return
		}
	}
}

// writeOnce tries w once: the sink is stopping.
func (s *Sink) writeOnce(logger klog.Logger, w write) {
	if err := s.do(w); err != nil && !apierrors.IsAlreadyExists(err) {
		logger.V(2).Info("Dropped an Event while stopping", "eventReason", w.event.Reason, "err", err)
		s.dropped(DroppedStopped)
		return
	}
	s.written()
}

// write tries w until it is written, refused, or the backoff is spent.
func (s *Sink) write(logger klog.Logger, w write) {
	if s.ctx.Err() != nil {
		s.writeOnce(logger, w) // taken from the queue as Stop came
		return
	}
	var last error
	err := wait.ExponentialBackoffWithContext(s.ctx, s.opts.Backoff, func(context.Context) (bool, error) {
		last = s.do(w)
		if last == nil || apierrors.IsAlreadyExists(last) {
			return true, nil
		}
		if final(last) {
			return false, last // the same request would get the same answer
		}
		return false, nil
	})
	if err == nil {
		s.written()
		return
	}
	reason := DroppedRejected
	switch {
	case apierrors.HasStatusCause(last, corev1.NamespaceTerminatingCause):
		reason = DroppedNamespaceTerminating
	case s.ctx.Err() != nil:
		reason = DroppedStopped
	case wait.Interrupted(err):
		reason = DroppedRetriesExhausted
	}
	logger.V(2).Info("Dropped an Event", "reason", reason, "object", klog.KRef(w.event.InvolvedObject.Namespace, w.event.InvolvedObject.Name),
		"eventReason", w.event.Reason, "err", last)
	s.dropped(reason)
}

// final reports whether err is the API server refusing the request itself,
// rather than the server being unreachable, busy or failing for now.
func final(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false // transport: not answered
	}
	_, later := apierrors.SuggestsClientDelay(err)
	return !later && !apierrors.IsTooManyRequests(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) &&
		!apierrors.IsServiceUnavailable(err) && !apierrors.IsInternalError(err) && !apierrors.IsUnexpectedServerError(err)
}

func (s *Sink) do(w write) error {
	var err error
	switch w.verb {
	case update:
		_, err = s.next.Update(w.event)
		return err
	case patch:
		_, err = s.next.Patch(w.event, w.patch)
		if !apierrors.IsNotFound(err) {
			return err
		}
		// Gone (expired, or its create was dropped): the whole Event,
		// with its count, is what the patch would have made.
	}
	e := w.event.DeepCopy()
	e.ResourceVersion = ""
	_, err = s.next.Create(e)
	return err
}

func (s *Sink) written() {
	if s.opts.Written != nil {
		s.opts.Written()
	}
}

func (s *Sink) dropped(reason string) {
	if s.opts.Dropped != nil {
		s.opts.Dropped(reason)
	}
}

// NewRecorder records Events from component through client-go's
// broadcaster into a Sink writing with client: a client, and so a rate
// limiter, of their own, since Events are best effort and must not slow
// the status writes down. stop shuts the broadcaster down, then flushes
// the Sink.
func NewRecorder(ctx context.Context, client kubernetes.Interface, scheme *runtime.Scheme, component string, o Options) (recorder record.EventRecorder, stop func()) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	sink := Start(ctx, &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, o)
	broadcaster.StartRecordingToSink(sink)
	return broadcaster.NewRecorder(scheme, corev1.EventSource{Component: component}), func() {
		broadcaster.Shutdown()
		sink.Stop()
	}
}
