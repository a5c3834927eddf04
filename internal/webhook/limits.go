package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"golang.org/x/sync/semaphore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of Limits.
//
// 32 reviews in flight: the API server calls webhooks from the request
// handlers of its own mutating requests, and a review of a normal object
// is answered in well under a millisecond, so 32 at once is a burst far
// beyond what one operator sees in normal use, while 32 goroutines each
// holding a review stay small.
//
// 64 MiB of review bodies: 32 reviews of 2 MiB, so for every object etcd
// can store (at most 1.5 MiB) the in-flight cap binds first; only reviews
// bigger than anything storable (up to MaxRequestBytes, which the API
// server's 3 MiB request limit or a client other than the API server
// reaches) meet this cap. Decoding holds about three times the body (the
// body, the object copied out of the review, what the handler decodes),
// so the admission server stays below about 200 MiB of heap whatever it
// is sent, where 64 reviews of 4 MiB took a standalone from 455 MB to
// 1.3 GB of RSS.
const (
	DefaultMaxInFlight          = 32
	DefaultMaxBodyBytesInFlight = 64 << 20
	// RetryAfterSeconds is the Retry-After of a 429. The API server's
	// webhook client (client-go) honours it: it waits and sends the
	// review again, up to 10 times within the webhook's timeout, so a
	// short burst is paced rather than failed.
	RetryAfterSeconds = 1
)

// Values passed to Limits.Rejected: the limit that refused a request.
const (
	LimitInFlight = "in_flight"
	LimitBytes    = "bytes"
)

// Limits bound what the admission server reads and decodes at once. A
// review beyond them is answered at once, before its body is read, with
// 429 Too Many Requests, a Retry-After header and a Status naming the
// limit: the API server counts that as a failed call of the webhook and
// retries it after Retry-After while the webhook's timeout allows, then
// the webhook's failurePolicy decides. Zero means no limit (as with
// kube-apiserver's --max-requests-inflight).
type Limits struct {
	// MaxInFlight caps the reviews being read, decoded and answered at
	// once, over all paths of the server.
	MaxInFlight int
	// MaxBodyBytesInFlight caps the bytes of review bodies being read and
	// decoded at once. A review reserves its Content-Length (or
	// MaxRequestBytes when it declares none) before its body is read, and
	// holds it until it is answered.
	MaxBodyBytesInFlight int64
	// Rejected, when set, is called for each review refused, with the
	// limit that refused it: LimitInFlight or LimitBytes.
	Rejected func(limit string)
}

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{MaxInFlight: DefaultMaxInFlight, MaxBodyBytesInFlight: DefaultMaxBodyBytesInFlight}
}

// limiter applies Limits to the review handlers of one server.
type limiter struct {
	limits   Limits
	inFlight *semaphore.Weighted // nil: no limit
	bytes    *semaphore.Weighted // nil: no limit
}

// ownInFlight is a limiter with an in-flight count of its own and the
// bytes budget of l: the reviews it lets in neither wait for l's nor hold
// them up, while the memory bound stays one for the whole server.
func (l *limiter) ownInFlight() *limiter {
	own := *l
	if l.limits.MaxInFlight > 0 {
		own.inFlight = semaphore.NewWeighted(int64(l.limits.MaxInFlight))
	}
	return &own
}

func newLimiter(l Limits) *limiter {
	lim := &limiter{limits: l}
	if l.MaxInFlight > 0 {
		lim.inFlight = semaphore.NewWeighted(int64(l.MaxInFlight))
	}
	if l.MaxBodyBytesInFlight > 0 {
		lim.bytes = semaphore.NewWeighted(l.MaxBodyBytesInFlight)
	}
	return lim
}

// wrap serves next within the limits. A declared body larger than
// MaxRequestBytes is refused with 413 before anything is reserved, so
// that it never counts as overload.
func (l *limiter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxRequestBytes {
			http.Error(w, fmt.Sprintf("review larger than %d bytes", MaxRequestBytes), http.StatusRequestEntityTooLarge)
			return
		}
		if l.inFlight != nil {
			if !l.inFlight.TryAcquire(1) {
				l.reject(w, r, LimitInFlight, fmt.Sprintf("%d reviews in flight, the limit (--webhook-max-inflight)", l.limits.MaxInFlight))
				return
			}
		}
		if l.bytes != nil {
			// Without a Content-Length the body may be as large as
			// MaxRequestBytes (http.MaxBytesReader stops it there). A limit
			// below one review would refuse it forever: it gets the whole
			// budget instead.
			n := int64(MaxRequestBytes)
			if r.ContentLength >= 0 {
				n = r.ContentLength
			}
			n = min(n, l.limits.MaxBodyBytesInFlight)
			if !l.bytes.TryAcquire(n) {
				if l.inFlight != nil {
					// Not held while reject drains the body.
					l.inFlight.Release(1)
				}
				l.reject(w, r, LimitBytes, fmt.Sprintf("review bodies of more than %d bytes in flight, the limit (--webhook-max-inflight-bytes)", l.limits.MaxBodyBytesInFlight))
				return
			}
			defer l.bytes.Release(n)
		}
		if l.inFlight != nil {
			defer l.inFlight.Release(1)
		}
		next.ServeHTTP(w, r)
	})
}

// reject answers 429 with Retry-After and a Status before reading the body.
// An HTTP/2 client (the API server) has its stream reset and keeps its
// connection. An HTTP/1 client that is still sending the body would have
// the connection reset under it (net/http closes it when more than 256 KiB
// are left unread), and may lose the answer: the rest of the body is read
// and discarded, at most MaxRequestBytes and within the server's read
// timeout, which holds a small buffer, not the body.
func (l *limiter) reject(w http.ResponseWriter, r *http.Request, limit, why string) {
	if l.limits.Rejected != nil {
		l.limits.Rejected(limit)
	}
	status := metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure,
		Message:  fmt.Sprintf("netop webhook server overloaded: %s; retry after %ds", why, RetryAfterSeconds),
		Reason:   metav1.StatusReasonTooManyRequests,
		Details:  &metav1.StatusDetails{RetryAfterSeconds: RetryAfterSeconds},
		Code:     http.StatusTooManyRequests,
	}
	body, _ := json.Marshal(&status)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
	if r.ProtoMajor == 1 {
		_ = http.NewResponseController(w).Flush()
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	}
}
