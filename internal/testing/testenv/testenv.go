// Package testenv gives a test binary one real control plane (etcd,
// kube-apiserver, kube-controller-manager) with netop's CRDs installed, and
// each test its own namespace.
//
// One control plane per test binary, not per test: starting one costs about
// three seconds, and a custom resource created within two seconds of its CRD
// becoming Established waits in the server.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/standalone/controlplane"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/conversion"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdinstall "github.com/netop-dev/netop/pkg/apis/samplecrd/install"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// Env is the control plane of a test binary and clients for it.
type Env struct {
	ControlPlane *controlplane.ControlPlane
	// Conversion is the test binary's own conversion webhook for Networks,
	// registered on the CRD at start, as netop registers its own: clients
	// of v1 need it, v2 being the storage version, in every test,
	// whether or not an operator serving the webhooks runs.
	Conversion *ConversionServer
	// Config has full rights and generous rate limits.
	Config *rest.Config
	Kube   kubernetes.Interface
	Netop  versioned.Interface
}

var (
	startOnce sync.Once
	shared    *Env
	startErr  error
	setups    []Setup
	cleanups  []func()
)

// Setup runs once the control plane is up, before the first test that uses
// it; the function it returns runs after all tests.
type Setup func(env *Env) (teardown func(), err error)

// Main runs the tests and then stops the control plane, if a test started
// it. Call it from TestMain: os.Exit(testenv.Main(m)). The control plane
// starts on the first Get, so benchmarks and unit tests of the same binary
// neither wait for it nor measure it.
func Main(m *testing.M, setup ...Setup) int {
	setups = setup
	code := m.Run()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	return code
}

func start() (*Env, error) {
	dir, err := os.MkdirTemp("", "netop-testenv-")
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	ctx := context.Background()
	cp, err := controlplane.Start(ctx, controlplane.Config{DataDir: dir})
	if err != nil {
		return nil, fmt.Errorf("starting control plane: %w", err)
	}
	cleanups = append(cleanups, cp.Stop)
	cfg := cp.AdminConfig()
	cfg.QPS, cfg.Burst = 1000, 2000
	if err := install.CRDs(ctx, cfg); err != nil {
		return nil, err
	}
	conversion, err := ServeConversion(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, conversion.Close)
	env := &Env{
		ControlPlane: cp,
		Conversion:   conversion,
		Config:       cfg,
		Kube:         kubernetes.NewForConfigOrDie(cfg),
		Netop:        versioned.NewForConfigOrDie(cfg),
	}
	for _, s := range setups {
		teardown, err := s(env)
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		if teardown != nil {
			cleanups = append(cleanups, teardown)
		}
	}
	return env, nil
}

// ConversionServer serves Networks' conversion webhook from the test
// process over HTTPS (httptest's certificate), with netop's converter.
type ConversionServer struct {
	server *httptest.Server
	crds   apiextensionsclient.Interface
	// Reviews counts the ConversionReviews served.
	Reviews atomic.Int64
}

// ServeConversion starts a conversion webhook and registers it on the
// Network CRD of the API server at cfg.
func ServeConversion(ctx context.Context, cfg *rest.Config) (*ConversionServer, error) {
	scheme := runtime.NewScheme()
	samplecrdinstall.Install(scheme)
	crds, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	c := &ConversionServer{crds: crds}
	handler := conversion.Converter{Scheme: scheme}.Handler(ctx)
	c.server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.Reviews.Add(1)
		handler.ServeHTTP(w, r)
	}))
	if err := c.Register(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Register points the CRD at this server again: after a test's operator,
// which registers its own, stopped.
func (c *ConversionServer) Register(ctx context.Context) error {
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.server.Certificate().Raw})
	return webhook.RegisterConversion(ctx, c.crds, admission.NetworkCRD, webhook.Target{URL: c.server.URL}, admission.PathConvert, caBundle)
}

// Close stops the server.
func (c *ConversionServer) Close() { c.server.Close() }

// Get returns the test binary's environment, starting it on first use.
func Get(t testing.TB) *Env {
	t.Helper()
	startOnce.Do(func() { shared, startErr = start() })
	if startErr != nil {
		t.Fatalf("testenv: %v", startErr)
	}
	return shared
}

// Namespace creates a namespace for the test and deletes it when the test
// ends.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	ns, err := e.Kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: strings.Trim(name, "-") + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = e.Kube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	// Pods cannot be created before kube-controller-manager has made the
	// namespace's default ServiceAccount.
	Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := e.Kube.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprintf("no default ServiceAccount in %s: %v", ns.Name, err)
	})
	return ns.Name
}

// Eventually polls cond every 20ms until it returns true, failing the test
// with the last message cond gave if that takes longer than timeout.
func Eventually(t testing.TB, timeout time.Duration, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, msg := cond(ctx)
		last = msg
		return ok, nil
	})
	if err != nil {
		t.Fatalf("condition not met within %v: %s", timeout, last)
	}
}

// StartOperator configures an operator for cfg with the backend be, logging
// to the test, and runs it until the test ends or stop is called. An
// operator left with the default CNI socket gets one of the test's own:
// the tests' operators share this host's namespace.
func StartOperator(t testing.TB, cfg *rest.Config, opts *operator.Options, be backend.Backend) (op *operator.Operator, stop func()) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	if opts.CNISocket == cniapi.DefaultSocket {
		opts.CNISocket = fmt.Sprintf("%s-test-%d-%s", cniapi.DefaultSocket, os.Getpid(), rand.Text()[:8])
	}
	op, err := operator.New(ctx, cfg, opts, be)
	if err != nil {
		t.Fatal(err)
	}
	run := RunOperator(t, ctx, op)
	if opts.Webhooks.Addr == "0" || shared == nil {
		return op, run
	}
	// The operator registers its own conversion webhook, which goes with
	// it: the test binary's takes over again.
	var once sync.Once
	stop = func() {
		once.Do(func() {
			run()
			if err := shared.Conversion.Register(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("registering the test's conversion webhook again: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return op, stop
}

// RunOperator runs op until the test ends or stop is called; stop waits
// for it to return and fails the test on an error.
func RunOperator(t testing.TB, ctx context.Context, op interface{ Run(context.Context) error }) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- op.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("operator: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Table gets the resource at path as the API server's Table, as kubectl
// get shows it: the names of the columns kubectl shows by default, in
// upper case and space-separated, and the rows.
func (e *Env) Table(t testing.TB, path string) (columns string, rows []metav1.TableRow) {
	t.Helper()
	raw, err := e.Kube.Discovery().RESTClient().Get().AbsPath(path).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("table of %s: %v", path, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatalf("table of %s: %v", path, err)
	}
	var names []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			names = append(names, strings.ToUpper(c.Name))
		}
	}
	return strings.Join(names, " "), table.Rows
}

// WaitReady waits until the Network's Ready condition has the status and
// reason for its current generation, and returns the Network.
func (e *Env) WaitReady(t testing.TB, namespace, name string, status metav1.ConditionStatus, reason string, timeout time.Duration) *samplecrdv1.Network {
	t.Helper()
	var got *samplecrdv1.Network
	Eventually(t, timeout, func(ctx context.Context) (bool, string) {
		n, err := e.Netop.SamplecrdV1().Networks(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got = n
		c := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady)
		if c == nil || n.Status.ObservedGeneration != n.Generation {
			return false, fmt.Sprintf("%s: status %+v, generation %d", name, n.Status, n.Generation)
		}
		return c.Status == status && c.Reason == reason, fmt.Sprintf("%s: Ready=%s reason %s: %s", name, c.Status, c.Reason, c.Message)
	})
	return got
}

// BackendMatches reports whether every Network is converged (not being
// deleted, Ready for its generation, with backend IDs) and the backend owns
// exactly their networks, with the counts for messages: the property every
// crash and outage test ends on.
func BackendMatches(ctx context.Context, list func(context.Context) (*samplecrdv1.NetworkList, error),
	be interface {
		ListOwned(context.Context) ([]backend.Observed, error)
	}) (networks, owned int, ok bool) {
	nets, err := list(ctx)
	if err != nil {
		return 0, 0, false
	}
	var want, got []string
	converged := true
	for _, n := range nets.Items {
		if n.DeletionTimestamp != nil || n.Status.Backend == nil || n.Status.ObservedGeneration != n.Generation ||
			!meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady) {
			converged = false
		}
		want = append(want, string(n.UID))
	}
	observed, err := be.ListOwned(ctx)
	if err != nil {
		return len(want), 0, false
	}
	for _, o := range observed {
		got = append(got, string(o.UID))
	}
	slices.Sort(want)
	slices.Sort(got)
	return len(want), len(got), converged && slices.Equal(want, got)
}

// ApplyManifests applies every object of a multi-document YAML stream (as
// `netop manifests` prints), in its order, as `kubectl apply
// --server-side` does.
func ApplyManifests(ctx context.Context, cfg *rest.Config, manifests []byte) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	groups, err := restmapper.GetAPIGroupResources(kube.Discovery())
	if err != nil {
		return err
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for doc := range bytes.SplitSeq(manifests, []byte("---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			return err
		}
		gvk := obj.GroupVersionKind()
		if gvk.Kind == "CustomResourceDefinition" {
			// The conversion webhook stays the test binary's: the
			// manifests name the Service of a cluster, which tests reach
			// by URL instead.
			unstructured.RemoveNestedField(obj.Object, "spec", "conversion")
		}
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		_, err = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), obj,
			metav1.ApplyOptions{FieldManager: "kubectl", Force: true})
		if err != nil {
			// In order: a Role before its namespace fails here.
			return fmt.Errorf("%s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return nil
}

// RegisterNode creates the Node name with internalIP as its InternalIP,
// as a kubelet would report it (addresses are status). The node controller
// may write the new Node meanwhile (taints), so the status write is
// retried on conflict.
func RegisterNode(ctx context.Context, kube kubernetes.Interface, name, internalIP string) error {
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Node %s: %w", name, err)
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: internalIP}}
		_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// HistogramCount is the number of samples an operator's histogram holds.
func HistogramCount(t testing.TB, o prometheus.Observer) uint64 {
	t.Helper()
	h, ok := o.(prometheus.Metric)
	if !ok {
		t.Fatalf("%T is not a metric", o)
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// BurnCPU keeps every core busy until the test ends, as other work on a
// busy machine would: what waits for a cache or a configuration to be
// taken up then waits longer.
func BurnCPU(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range goruntime.NumCPU() {
		wg.Go(func() {
			sum := sha256.Sum256(nil)
			for ctx.Err() == nil {
				sum = sha256.Sum256(sum[:])
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}
