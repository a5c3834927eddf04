// Package metrics holds the operator's Prometheus metrics: the workqueue
// (through client-go's MetricsProvider hook), reconciles, backend
// operations and API writes. Each operator gets its own registry, so that
// several can run in one process (the tests do).
package metrics

import (
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/util/workqueue"
)

const namespace = "netop"

// Values of the result label of reconcile_total.
const (
	ResultSuccess  = "success"
	ResultError    = "error"
	ResultConflict = "conflict"
	ResultNotFound = "not_found"
)

// Values of the action label of backend_changes_total, beside the
// backend.Action values of Ensure (Created, Updated).
const (
	ChangeDeleted = "Deleted"
	// ChangeSwept is an orphan removed by the resync.
	ChangeSwept = "Swept"
)

// Values of the phase label of startup_seconds.
const (
	PhaseNetworksListed = "networks_listed"
	PhaseCachesSynced   = "caches_synced"
)

// Values of the phase label of cni_add_seconds.
const (
	// CNIPhaseAllocation: from the ADD's arrival until the node's cache
	// holds the pod with its addresses (the allocation controller's
	// patch, and the watch bringing it).
	CNIPhaseAllocation = "allocation"
	// CNIPhaseAttach: the interfaces made and recorded.
	CNIPhaseAttach = "attach"
)

// Metrics are one operator's metrics.
type Metrics struct {
	Registry *prometheus.Registry

	ReconcileTotal    *prometheus.CounterVec
	ReconcileDuration *prometheus.HistogramVec
	BackendDuration   *prometheus.HistogramVec
	BackendChanges    *prometheus.CounterVec
	APIWrites         *prometheus.CounterVec
	// APIRequests counts every request to the API server, reads and
	// watches included, by verb (the HTTP method).
	APIRequests *prometheus.CounterVec
	// APIBytes counts the bytes of request and response bodies, by
	// direction (sent, received) and encoding (protobuf, json, other).
	APIBytes *prometheus.CounterVec
	Startup  *prometheus.GaugeVec
	// WebhookRejected counts admission reviews refused with 429 by the
	// webhook server's limits, by limit (in_flight, bytes).
	WebhookRejected *prometheus.CounterVec
	// Leader is 1 while this replica leads (runs the controllers).
	Leader prometheus.Gauge
	// EventsWritten counts Events written to the API server; EventsDropped
	// those given up, by reason (see internal/eventsink).
	EventsWritten prometheus.Counter
	EventsDropped *prometheus.CounterVec
	// PolicyProgramming times the node's writes of its network policy
	// rules, by kind (replace: the table whole; elements: pods only);
	// PolicyRules and PolicyElements are the table's rules and set
	// elements.
	PolicyProgramming *prometheus.HistogramVec
	PolicyRules       prometheus.Gauge
	PolicyElements    prometheus.Gauge
	// CNIAdd times the node side's CNI ADDs by phase (see the
	// CNIPhase values) and result (ResultSuccess or ResultError): where
	// a pod's start waits on netop, apart from the waits that failed.
	CNIAdd *prometheus.HistogramVec

	queueDepth          *prometheus.GaugeVec
	queueAdds           *prometheus.CounterVec
	queueLatency        *prometheus.HistogramVec
	queueWorkDuration   *prometheus.HistogramVec
	queueUnfinished     *prometheus.GaugeVec
	queueLongestRunning *prometheus.GaugeVec
	queueRetries        *prometheus.CounterVec
}

// New makes the metrics and registers them, with the Go and process
// collectors, on a new registry.
func New() *Metrics {
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "leader",
			Help: "1 while this replica leads and runs the controllers (with --leader-elect; always 1 without), else 0.",
		}),
		EventsWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_written_total",
			Help: "Event creates and count updates written to the API server.",
		}),
		EventsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_dropped_total",
			Help: "Events given up, by reason: queue_full, rejected, namespace_terminating, retries_exhausted, stopped.",
		}, []string{"reason"}),
		ReconcileTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "reconcile_total",
			Help: "Reconciles by controller and result (success, error, conflict, not_found).",
		}, []string{"controller", "result"}),
		ReconcileDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "reconcile_duration_seconds",
			Help: "Time one reconcile took.", Buckets: buckets,
		}, []string{"controller"}),
		BackendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "backend_operation_duration_seconds",
			Help: "Time backend operations took, by backend, operation and result.", Buckets: buckets,
		}, []string{"backend", "operation", "result"}),
		BackendChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "backend_changes_total",
			Help: "Backend networks created, updated or deleted, by backend and action.",
		}, []string{"backend", "action"}),
		APIRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "api_requests_total",
			Help: "Requests sent to the API server, reads and watches included, by HTTP method.",
		}, []string{"method"}),
		APIBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "api_bytes_total",
			Help: "Bytes of the bodies of requests sent to and responses (watches included) received from the API server, as decoded (after gzip), by direction (sent, received) and encoding (protobuf, json, other).",
		}, []string{"direction", "encoding"}),
		APIWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "api_writes_total",
			Help: "Requests that change state sent to the API server, by verb and resource.",
		}, []string{"verb", "resource"}),
		Startup: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "startup_seconds",
			Help: "Seconds from the start of the operator's Run to each startup phase: networks_listed (the initial list of Networks is in the informer cache), caches_synced (every informer is synced and the Network controller has been handed the whole initial list; /readyz says ok).",
		}, []string{"phase"}),
		WebhookRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "webhook_rejected_total",
			Help: "Admission reviews answered 429 Too Many Requests because a limit of the webhook server was reached, by limit: in_flight (--webhook-max-inflight) or bytes (--webhook-max-inflight-bytes).",
		}, []string{"limit"}),
		PolicyProgramming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "policy", Name: "programming_seconds",
			Help:    "Time to write the node's network policy rules into nftables, by kind (replace, elements).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"kind"}),
		PolicyRules: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "policy", Name: "rules", Help: "Rules of the node's network policy table.",
		}),
		PolicyElements: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "policy", Name: "set_elements", Help: "Set elements (pod addresses) of the node's network policy table.",
		}),
		CNIAdd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "cni", Name: "add_seconds",
			Help: "Time of the phases of the CNI ADDs this node side served, by phase and result (success or error): allocation (waiting for the pod's addresses in the node's cache), attach (making and recording its interfaces).", Buckets: buckets,
		}, []string{"phase", "result"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "workqueue", Name: "depth", Help: "Current depth of the workqueue.",
		}, []string{"name"}),
		queueAdds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "workqueue", Name: "adds_total", Help: "Adds handled by the workqueue.",
		}, []string{"name"}),
		queueLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "workqueue", Name: "queue_duration_seconds",
			Help: "How long an item waits in the workqueue before it is processed.", Buckets: buckets,
		}, []string{"name"}),
		queueWorkDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "workqueue", Name: "work_duration_seconds",
			Help: "How long processing an item takes.", Buckets: buckets,
		}, []string{"name"}),
		queueUnfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "workqueue", Name: "unfinished_work_seconds",
			Help: "Seconds of work in progress not yet observed by work_duration.",
		}, []string{"name"}),
		queueLongestRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "workqueue", Name: "longest_running_processor_seconds",
			Help: "Seconds the longest running worker has been processing its item.",
		}, []string{"name"}),
		queueRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "workqueue", Name: "retries_total", Help: "Retries handled by the workqueue.",
		}, []string{"name"}),
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.ReconcileTotal, m.ReconcileDuration, m.BackendDuration, m.BackendChanges, m.APIWrites, m.APIRequests, m.APIBytes, m.Startup, m.WebhookRejected, m.Leader, m.EventsWritten, m.EventsDropped,
		m.PolicyProgramming, m.PolicyRules, m.PolicyElements, m.CNIAdd,
		m.queueDepth, m.queueAdds, m.queueLatency, m.queueWorkDuration,
		m.queueUnfinished, m.queueLongestRunning, m.queueRetries,
	)
	return m
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// ObserveBackend records one backend operation.
func (m *Metrics) ObserveBackend(backend, operation string, d time.Duration, err error) {
	m.BackendDuration.WithLabelValues(backend, operation, resultOf(err)).Observe(d.Seconds())
}

// ObserveCNIAdd records one phase of a CNI ADD (a CNIPhase value).
func (m *Metrics) ObserveCNIAdd(phase string, d time.Duration, err error) {
	m.CNIAdd.WithLabelValues(phase, resultOf(err)).Observe(d.Seconds())
}

// resultOf is the result label of an operation that ended with err.
func resultOf(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultSuccess
}

// CountRequests wraps an API client transport so that every request is
// counted by method, every request that changes state by verb and
// resource, and the bytes of both ways by encoding.
func (m *Metrics) CountRequests(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		m.APIRequests.WithLabelValues(req.Method).Inc()
		switch req.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			m.APIWrites.WithLabelValues(strings.ToLower(req.Method), resourceOf(req.URL.Path)).Inc()
		}
		if req.ContentLength > 0 {
			m.APIBytes.WithLabelValues("sent", encodingOf(req.Header.Get("Content-Type"))).Add(float64(req.ContentLength))
		}
		resp, err := rt.RoundTrip(req)
		if err == nil && resp.Body != nil {
			resp.Body = &countingBody{ReadCloser: resp.Body, bytes: m.APIBytes.WithLabelValues("received", encodingOf(resp.Header.Get("Content-Type")))}
		}
		return resp, err
	})
}

// encodingOf names a body's encoding by its media type: protobuf (watch
// streams too: ";stream=watch"), json (patches too, and the
// apply-patch+yaml of client-go's apply configurations, which is JSON) or
// other.
func encodingOf(contentType string) string {
	media, _, _ := strings.Cut(contentType, ";")
	switch media = strings.TrimSpace(media); {
	case media == "application/vnd.kubernetes.protobuf":
		return "protobuf"
	case strings.HasSuffix(media, "json"), strings.HasSuffix(media, "+yaml"):
		return "json"
	default:
		return "other"
	}
}

// countingBody counts what is read of a response body as it is read, so
// that a watch's stream is counted as it arrives.
type countingBody struct {
	io.ReadCloser
	bytes prometheus.Counter
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.bytes.Add(float64(n))
	}
	return n, err
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// resourceOf extracts "resource" or "resource/subresource" from an API path
// such as /apis/GROUP/VERSION/namespaces/NS/RESOURCE/NAME/SUBRESOURCE.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "other"
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "other"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

// WorkqueueProvider returns client-go's hook for workqueue metrics.
func (m *Metrics) WorkqueueProvider() workqueue.MetricsProvider { return workqueueProvider{m} }

type workqueueProvider struct{ m *Metrics }

func (p workqueueProvider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.m.queueDepth.WithLabelValues(name)
}
func (p workqueueProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.m.queueAdds.WithLabelValues(name)
}
func (p workqueueProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.m.queueLatency.WithLabelValues(name)
}
func (p workqueueProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.m.queueWorkDuration.WithLabelValues(name)
}
func (p workqueueProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.queueUnfinished.WithLabelValues(name)
}
func (p workqueueProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.queueLongestRunning.WithLabelValues(name)
}
func (p workqueueProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.m.queueRetries.WithLabelValues(name)
}
