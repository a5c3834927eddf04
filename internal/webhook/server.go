// Package webhook is the generic core of admission: an HTTPS server that
// decodes AdmissionReviews and hands the requests to handlers, within
// limits on the reviews and bytes it holds at once (Limits), a decoder of
// admitted objects by their apiVersion and kind, a serving certificate of
// its own (a CA, persisted, renewed before expiry), and the registration of
// a Set of webhooks with that CA as caBundle. It knows no handler: the
// operator mounts them (internal/operator) and the handlers live in
// subpackages, one per kind.
package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/httpserver"
	"github.com/netop-dev/netop/internal/pki"
)

// MaxRequestBytes caps an AdmissionReview body. The API server's own limit
// on an object is about 1.5 MiB; the review carries the object twice on an
// update.
const MaxRequestBytes = 4 << 20

// Handler admits one request.
type Handler interface {
	Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

// Admit calls f.
func (f HandlerFunc) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	return f(ctx, req)
}

// Server is the HTTPS admission server.
type Server struct {
	mux     *http.ServeMux
	certs   *CertManager
	limiter *limiter
}

// NewServer returns a server presenting the certificate of certs, serving
// reviews within limits (shared by all its paths; /healthz is not limited).
func NewServer(certs *CertManager, limits Limits) *Server {
	s := &Server{mux: http.NewServeMux(), certs: certs, limiter: newLimiter(limits)}
	s.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	return s
}

// Handle serves h at path.
func (s *Server) Handle(ctx context.Context, path string, h Handler) {
	s.mux.Handle(path, s.limiter.wrap(ReviewHandler(ctx, h)))
}

// MountGated serves every webhook of set at its path, each request held
// until ready is closed, for at most wait: the server starts before what
// the handlers read (caches) is ready, so that the paths that need nothing
// (conversion) serve at once. A request still held after wait gets a 503,
// a failed call for the API server, which then applies the webhook's
// failurePolicy: never a denial that the policy would not soften.
func (s *Server) MountGated(ctx context.Context, set Set, ready <-chan struct{}, wait time.Duration) {
	for _, w := range set.Webhooks {
		// Held at the gate before taking a slot of the limits, which the
		// conversion webhook shares and the caches may wait on.
		s.mux.Handle(w.Path, Gate(ready, wait, s.limiter.wrap(ReviewHandler(ctx, w.Handler))))
	}
}

// Gate holds each request to h until ready is closed, for at most wait,
// and answers 503 Service Unavailable if it is still not.
func Gate(ready <-chan struct{}, wait time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
		default:
			timer := time.NewTimer(wait)
			defer timer.Stop()
			select {
			case <-ready:
			case <-timer.C:
				http.Error(w, "netop is starting: its caches are not synced yet", http.StatusServiceUnavailable)
				return
			case <-r.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// Run serves on l until ctx is done.
func (s *Server) Run(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		// TLS 1.3, or TLS 1.2 with ECDHE and AEAD suites only.
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			CipherSuites:   pki.TLSCipherSuites(),
			GetCertificate: s.certs.GetCertificate,
		},
	}
	klog.FromContext(ctx).Info("Serving webhooks", "address", l.Addr().String())
	if err := httpserver.Run(ctx, srv, func() error { return srv.ServeTLS(l, "", "") }); err != nil {
		return fmt.Errorf("webhook server: %w", err)
	}
	return nil
}

// ReviewHandler decodes admission/v1 AdmissionReviews, passes the request to
// h and encodes its answer. What is not a well-formed review gets a 400 with
// a message.
func ReviewHandler(ctx context.Context, h Handler) http.Handler {
	logger := klog.FromContext(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		review, status, err := decodeReview(w, r)
		if err != nil {
			http.Error(w, err.Error(), status)
			return
		}
		resp := h.Admit(klog.NewContext(r.Context(), logger.WithValues("uid", review.Request.UID)), review.Request)
		if resp == nil {
			resp = &admissionv1.AdmissionResponse{Allowed: true}
		}
		resp.UID = review.Request.UID
		out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(&out); err != nil {
			logger.Error(err, "Writing admission response")
		}
	})
}

func decodeReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, int, error) {
	body, status, err := ReadBody(w, r)
	if err != nil {
		return nil, status, err
	}
	review, err := DecodeReview(body)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	return review, 0, nil
}

// HandleHTTP serves h at path within the server's limits: for reviews
// that are not admission reviews (the CRDs' ConversionReviews), whose
// handlers read their body with ReadBody. The path has an in-flight count
// of its own (the bytes budget is the server's): the API server asks for
// a conversion on every write while two versions are served, and neither
// those nor a burst of admission reviews should wait for the other.
func (s *Server) HandleHTTP(path string, h http.Handler) {
	s.mux.Handle(path, s.limiter.ownInFlight().wrap(h))
}

// ReadBody reads the JSON body of a review the API server POSTs, at most
// MaxRequestBytes; on an error it returns the HTTP status to answer.
func ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	if r.Method != http.MethodPost {
		return nil, http.StatusMethodNotAllowed, fmt.Errorf("reviews are POSTed, not %s", r.Method)
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q is not application/json", r.Header.Get("Content-Type"))
	}
	if r.ContentLength > MaxRequestBytes {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("admission review larger than %d bytes", MaxRequestBytes)
	}
	// Read into a buffer of the declared size: io.ReadAll would grow one
	// by doubling, allocating about twice the body.
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	body := buf.Bytes()
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("review larger than %d bytes", MaxRequestBytes)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading review: %w", err)
	}
	return body, 0, nil
}

// DecodeReview parses an admission/v1 AdmissionReview that carries a request.
func DecodeReview(body []byte) (*admissionv1.AdmissionReview, error) {
	review := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, review); err != nil {
		return nil, fmt.Errorf("decoding admission review: %w", err)
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("expected an admission.k8s.io/v1 AdmissionReview, got %s %s", review.APIVersion, review.Kind)
	}
	if review.Request == nil || review.Request.UID == "" {
		return nil, errors.New("admission review has no request or no request uid")
	}
	return review, nil
}

// Denied answers a request with a rejection carrying reason and HTTP code.
func Denied(code int32, reason metav1.StatusReason, message string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: message},
	}
}

// Patched allows a request with the given JSON patch (none: allowed as is).
func Patched(ops []jsonpatch.Operation) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{Allowed: true}
	if len(ops) == 0 {
		return resp
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return Denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("encoding patch: %v", err))
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	return resp
}
