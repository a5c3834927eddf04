package conversion

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/pkg/apis/samplecrd/install"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

func converter() Converter {
	scheme := runtime.NewScheme()
	install.Install(scheme)
	return Converter{Scheme: scheme}
}

// The tutorial's Network, as v1 stores it.
const tutorialV1 = `{"apiVersion":"samplecrd.k8s.io/v1","kind":"Network","metadata":{"name":"example-network","namespace":"default","uid":"u1"},` +
	`"spec":{"cidr":"192.168.0.0/16","gateway":"192.168.0.1"},"status":{"cidr":"192.168.0.0/16","gateway":"192.168.0.1","backend":{"type":"linux","interface":"netop1"}}}`

const dualV2 = `{"apiVersion":"samplecrd.k8s.io/v2","kind":"Network","metadata":{"name":"dual","namespace":"default","uid":"u2","annotations":{"team":"a"}},` +
	`"spec":{"cidrs":["10.1.0.0/24","fd00:1::/64"],"gateways":["10.1.0.1","fd00:1::1"]}}`

func TestConvert(t *testing.T) {
	c := converter()
	out, err := c.Convert([]byte(tutorialV1), samplecrdv2.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	var v2 samplecrdv2.Network
	if err := json.Unmarshal(out, &v2); err != nil {
		t.Fatal(err)
	}
	if v2.APIVersion != "samplecrd.k8s.io/v2" || v2.Kind != "Network" || v2.Name != "example-network" || v2.UID != "u1" ||
		fmt.Sprint(v2.Spec.CIDRs, v2.Spec.Gateways, v2.Status.CIDRs) != "[192.168.0.0/16] [192.168.0.1] [192.168.0.0/16]" || v2.Status.Backend.Interface != "netop1" {
		t.Errorf("the tutorial's Network as v2: %s", out)
	}

	asV1, err := c.Convert([]byte(dualV2), samplecrdv1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	var v1 samplecrdv1.Network
	if err := json.Unmarshal(asV1, &v1); err != nil {
		t.Fatal(err)
	}
	if v1.APIVersion != "samplecrd.k8s.io/v1" || v1.Spec.CIDR != "10.1.0.0/24" || v1.Spec.Gateway != "10.1.0.1" ||
		v1.Annotations[samplecrdv1.SpecFamiliesAnnotation] == "" || v1.Annotations["team"] != "a" {
		t.Errorf("the dual-stack Network as v1: %s", asV1)
	}
	back, err := c.Convert(asV1, samplecrdv2.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, back, []byte(dualV2)) {
		t.Errorf("v2 → v1 → v2:\n%s\nwant\n%s", back, dualV2)
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	// creationTimestamp: null and status: {} are what an empty
	// metav1.Time and an empty status encode to.
	if m, ok := x.(map[string]any)["metadata"].(map[string]any); ok {
		delete(m, "creationTimestamp")
	}
	if status, ok := x.(map[string]any)["status"].(map[string]any); ok && len(status) == 0 {
		delete(x.(map[string]any), "status")
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

// The API server's view: a review in, every object converted or the
// review failed with the object named, and the request's UID back.
func TestHandler(t *testing.T) {
	srv := httptest.NewServer(converter().Handler(t.Context()))
	defer srv.Close()
	post := func(req apiextensionsv1.ConversionRequest) *apiextensionsv1.ConversionResponse {
		t.Helper()
		body, _ := json.Marshal(apiextensionsv1.ConversionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "ConversionReview"}, Request: &req})
		resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var review apiextensionsv1.ConversionReview
		if err := json.NewDecoder(resp.Body).Decode(&review); err != nil || review.Response == nil {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		return review.Response
	}
	objects := []runtime.RawExtension{{Raw: []byte(tutorialV1)}, {Raw: []byte(dualV2)}}
	got := post(apiextensionsv1.ConversionRequest{UID: types.UID("r1"), DesiredAPIVersion: "samplecrd.k8s.io/v1", Objects: objects})
	if got.UID != "r1" || got.Result.Status != metav1.StatusSuccess || len(got.ConvertedObjects) != 2 {
		t.Fatalf("response %+v", got)
	}
	for i, o := range got.ConvertedObjects {
		if !strings.Contains(string(o.Raw), `"apiVersion":"samplecrd.k8s.io/v1"`) {
			t.Errorf("object %d: %s", i, o.Raw)
		}
	}

	for _, tc := range []struct {
		desired string
		objects []string
		want    string
	}{
		{"samplecrd.k8s.io/v3", []string{tutorialV1}, "objects[0]: Network default/example-network"},
		{"samplecrd.k8s.io/v2", []string{tutorialV1, `{"apiVersion":"samplecrd.k8s.io/v1","kind":"Network","metadata":{"name":"x"},"spec":{"cidr":5}}`}, "objects[1]: Network x: decoding"},
		{"samplecrd.k8s.io/v2", []string{`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}`}, `is of group "apps"`},
		{"/a/b", []string{tutorialV1}, "desiredAPIVersion"},
	} {
		var raws []runtime.RawExtension
		for _, o := range tc.objects {
			raws = append(raws, runtime.RawExtension{Raw: []byte(o)})
		}
		got := post(apiextensionsv1.ConversionRequest{UID: "r2", DesiredAPIVersion: tc.desired, Objects: raws})
		if got.Result.Status != metav1.StatusFailure || !strings.Contains(got.Result.Message, tc.want) || len(got.ConvertedObjects) != 0 {
			t.Errorf("to %s: %+v, want a failure saying %q and no objects", tc.desired, got, tc.want)
		}
	}

	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"kind":"AdmissionReview"}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a review without a request: %d, want 400", resp.StatusCode)
	}
}

// A kind with top-level fields beside metadata, spec and status is
// refused, naming the field: the review is decoded into those alone, and a
// conversion would lose the rest.
func TestConvertRefusesOtherTopLevelFields(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	_, err := Converter{Scheme: scheme}.Convert([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"b"}}`), corev1.SchemeGroupVersion)
	if err == nil || !strings.Contains(err.Error(), `top-level field "immutable"`) {
		t.Errorf("converting a ConfigMap: %v, want a refusal naming a field conversion does not carry", err)
	}
}

// The conversion webhook's cost per object (BENCHMARKS.md): a v1 Network
// as stored, to v2, and a dual-stack v2 one to v1.
func BenchmarkConvert(b *testing.B) {
	c := converter()
	for _, tc := range []struct {
		name string
		raw  string
		to   string
	}{{"v1-to-v2", tutorialV1, "v2"}, {"dual-v2-to-v1", dualV2, "v1"}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			to := samplecrdv1.SchemeGroupVersion
			to.Version = tc.to
			for b.Loop() {
				if _, err := c.Convert([]byte(tc.raw), to); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A converted object carries the metadata the API server takes from it
// (name, namespace, UID, labels, annotations) and nothing else: the API
// server restores the rest from the object it sent, and the managed fields,
// most of a stored object, are neither decoded nor sent back.
func TestConvertKeepsWhatTheAPIServerTakes(t *testing.T) {
	stored, err := os.ReadFile("testdata/stored-network.json")
	if err != nil {
		t.Fatal(err)
	}
	out, err := converter().Convert(stored, samplecrdv1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	var v1 samplecrdv1.Network
	if err := json.Unmarshal(out, &v1); err != nil {
		t.Fatal(err)
	}
	if v1.Name != "example-network" || v1.Namespace != "default" || v1.UID != "3f0c2b9e-1d4a-4c1e-9a57-2b8f6d0c7e11" ||
		!strings.Contains(v1.Annotations["kubectl.kubernetes.io/last-applied-configuration"], `"cidr":"192.168.0.0/16"`) {
		t.Errorf("kept metadata %+v", v1.ObjectMeta)
	}
	if len(v1.ManagedFields) != 0 || v1.ResourceVersion != "" || len(v1.Finalizers) != 0 {
		t.Errorf("sent back metadata the API server restores: %+v", v1.ObjectMeta)
	}
	if v1.Spec.CIDR != "192.168.0.0/16" || v1.Status.Backend == nil || v1.Status.Backend.Interface != "netop3f0c2b9e1d" || len(v1.Status.Conditions) != 1 {
		t.Errorf("converted spec %+v, status %+v", v1.Spec, v1.Status)
	}
	if len(out) > len(stored)/2 {
		t.Errorf("converted object of %d bytes from %d: the managed fields came back?", len(out), len(stored))
	}
}

// BenchmarkHandler serves the ConversionReview the API server sends for
// every write while v1 is served (its watch cache converts each stored
// object): one Network as netop's users' clusters store it, with the
// managed fields of three writers, to v1, request body to response body.
func BenchmarkHandler(b *testing.B) {
	stored, err := os.ReadFile("testdata/stored-network.json")
	if err != nil {
		b.Fatal(err)
	}
	body, err := json.Marshal(&apiextensionsv1.ConversionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "ConversionReview"},
		Request: &apiextensionsv1.ConversionRequest{UID: "u", DesiredAPIVersion: samplecrdv1.SchemeGroupVersion.String(),
			Objects: []runtime.RawExtension{{Raw: stored}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	h := converter().Handler(b.Context())
	b.ReportAllocs()
	for b.Loop() {
		w, r := httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/convert", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}
