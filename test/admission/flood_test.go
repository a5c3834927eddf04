package admission

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/sidecar/pods"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// procStatus reads a size in bytes from /proc/self/status (VmRSS, VmHWM).
func procStatus(t *testing.T, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// readyzWatch polls the API server's /readyz until stop is called, and
// returns the answers that were not ok and the slowest answer. A check of
// the API server (etcd's among them) that fails or times out makes the
// answer not ok; an answer slower than 10 s is a failure too. (On a shared
// 2-core machine a flood of 4 MB reviews starves this process of CPU for
// seconds, so the time of an ok answer is logged, not judged.)
func readyzWatch(env *testenv.Env) (stop func() ([]string, time.Duration)) {
	var (
		mu       sync.Mutex
		failures []string
		slowest  time.Duration
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			began := time.Now()
			body, err := env.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
			took := time.Since(began)
			rcancel()
			if ctx.Err() != nil {
				return
			}
			mu.Lock()
			slowest = max(slowest, took)
			mu.Unlock()
			if err != nil || string(body) != "ok" {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("%s: %q %v", time.Now().Format(time.StampMilli), body, err))
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return func() ([]string, time.Duration) {
		cancel()
		wg.Wait()
		return failures, slowest
	}
}

// bigPodReview is an AdmissionReview of a pod CREATE in namespace ns,
// padded by an annotation to size bytes.
func bigPodReview(t *testing.T, ns string, size int) []byte {
	t.Helper()
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns, Annotations: map[string]string{"pad": ""}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("flood"),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: ns, Name: "big", Operation: admissionv1.Create,
		},
	}
	review.Request.Object.Raw = raw
	body, err := json.Marshal(&review)
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("a", size-len(body))
	return bytes.Replace(body, []byte(`"pad":""`), []byte(`"pad":"`+pad+`"`), 1)
}

// The flood of issue 12, against the operator's webhook server beside a
// real API server and etcd in this process, as in netop-standalone:
//
//  1. 64 concurrent 4 MB pod reviews sent straight to the webhook port,
//     each on its own connection (a client on the host; the API server's
//     own requests are capped at 3 MiB): every one is answered, with 200
//     or 429 and Retry-After, the process's peak RSS grows by a bounded
//     amount and the API server's /readyz stays ok. Without the limits,
//     64 such reviews took a standalone from 455 MB to 1.3 GB of RSS.
//  2. 64 concurrent 2.5 MB pod creates (dry run) through the API server in
//     a namespace labelled for injection, whose webhook fails closed:
//     every create ends, injected or refused by the webhook's failure
//     policy, and /readyz stays ok.
func TestWebhookFlood(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createTemplate(t, env, ns)
	enableNamespace(t, env, ns)
	// The template is in the webhook's cache: a labelled pod is injected.
	createPod(t, env, ns, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}, true)

	vwc, err := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), admission.WebhookConfigurationName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(vwc.Webhooks[0].ClientConfig.CABundle)

	const n, size = 64, 4_000_000
	body := bigPodReview(t, ns, size)
	url := "https://" + webhookAddr + pods.PathNamespace

	t.Run("direct", func(t *testing.T) {
		runtime.GC()
		debug.FreeOSMemory()
		// Writing 5 to clear_refs resets the peak RSS (VmHWM) to the
		// current RSS.
		if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
			t.Fatal(err)
		}
		base := procStatus(t, "VmRSS")
		stopWatch := readyzWatch(env)
		began := time.Now()
		wait := floodWebhook(t, url, pool, body, n, nil)
		codes := wait()
		took := time.Since(began)
		peak := procStatus(t, "VmHWM")
		failures, slowest := stopWatch()
		growth := peak - base
		t.Logf("%d reviews of %d bytes in %v: %v (HTTP code: count); RSS %d MiB before, peak %d MiB (+%d MiB); slowest /readyz %v",
			n, len(body), took.Round(time.Millisecond), codes, base>>20, peak>>20, growth>>20, slowest.Round(time.Millisecond))
		if codes[http.StatusOK] == 0 || codes[http.StatusTooManyRequests] == 0 {
			t.Errorf("want some reviews served and some refused by the limits, got %v", codes)
		}
		// The limits hold 64 MiB of bodies, about 200 MiB of heap. Without
		// them, this flood added about 700 MiB here (850 MB to a
		// standalone).
		const bound = 400 << 20
		if growth > bound {
			t.Errorf("peak RSS grew by %d MiB during the flood, want at most %d MiB", growth>>20, bound>>20)
		}
		if len(failures) > 0 {
			t.Errorf("/readyz not ok during the flood: %v", failures)
		}
	})

	// Pods created through the API server while the port is flooded: the
	// API server gets 429s, retries after Retry-After within the webhook's
	// timeout, and every create ends, injected or refused by the failure
	// policy (Fail) with the webhook's message.
	t.Run("through the API server during a flood", func(t *testing.T) {
		const creates = 64
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "during-"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox",
				Env: []corev1.EnvVar{{Name: "PAD", Value: strings.Repeat("a", 10_000)}}}}},
		}
		stopWatch := readyzWatch(env)
		start := make(chan struct{})
		var (
			wg                sync.WaitGroup
			mu                sync.Mutex
			injected, refused int
			overloaded        []string
			others            []string
		)
		began := time.Now()
		wait := floodWebhook(t, url, pool, body, n, start)
		for range creates {
			wg.Go(func() {
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				p, err := env.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "envoy" }):
					injected++
				case err != nil && strings.Contains(err.Error(), "failed calling webhook"):
					refused++
					if strings.Contains(err.Error(), "overloaded") {
						overloaded = append(overloaded, err.Error())
					}
				default:
					others = append(others, fmt.Sprintf("%v", err))
				}
			})
		}
		close(start)
		wg.Wait()
		codes := wait()
		failures, slowest := stopWatch()
		t.Logf("%d pod creates (dry run) during a flood of %d reviews (%v) in %v: %d injected, %d refused by the failure policy (%d naming the overload); slowest /readyz %v",
			creates, n, codes, time.Since(began).Round(time.Millisecond), injected, refused, len(overloaded), slowest.Round(time.Millisecond))
		if len(overloaded) > 0 {
			t.Logf("a refusal: %.400s", overloaded[0])
		}
		if len(others) > 0 {
			t.Errorf("%d creates neither injected nor refused by the webhook: %.500v", len(others), others)
		}
		if injected == 0 {
			t.Error("no create was injected")
		}
		if len(failures) > 0 {
			t.Errorf("/readyz not ok during the flood: %v", failures)
		}
	})

	// The webhook serves normally afterwards.
	createPod(t, env, ns, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "after"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}, true)
}

// floodWebhook posts body n times at once to url, each on its own
// connection (HTTP/1.1), as a flooding client on the host would, once
// start is closed (nil: at once). wait waits for the answers and returns
// their count by HTTP code; anything but a 200 with a patch or a 429 with
// Retry-After and the reason fails the test.
func floodWebhook(t *testing.T, url string, pool *x509.CertPool, body []byte, n int, start chan struct{}) (wait func() map[int]int) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: n,
	}}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes = map[int]int{}
		errs  []string
	)
	for range n {
		wg.Go(func() {
			if start != nil {
				<-start
			}
			resp, err := client.Post(url, "application/json", bytes.NewReader(body))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			var out bytes.Buffer
			_, _ = out.ReadFrom(resp.Body)
			_ = resp.Body.Close()
			codes[resp.StatusCode]++
			switch resp.StatusCode {
			case http.StatusOK:
				if !strings.Contains(out.String(), `"allowed":true`) || !strings.Contains(out.String(), `"patch"`) {
					errs = append(errs, "200 without an injection: "+out.String())
				}
			case http.StatusTooManyRequests:
				if resp.Header.Get("Retry-After") == "" || !strings.Contains(out.String(), "overloaded") {
					errs = append(errs, fmt.Sprintf("429 without Retry-After (%q) or the reason: %s", resp.Header.Get("Retry-After"), out.String()))
				}
			default:
				errs = append(errs, fmt.Sprintf("%d: %.200s", resp.StatusCode, out.String()))
			}
		})
	}
	return func() map[int]int {
		wg.Wait()
		client.CloseIdleConnections()
		if len(errs) > 0 {
			t.Errorf("%d of %d reviews not answered 200 or 429: %v", len(errs), n, errs)
		}
		return codes
	}
}
