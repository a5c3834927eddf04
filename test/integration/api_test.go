// Package integration tests netop's API against a real kube-apiserver: the
// CRD as controller-gen made it, the generated clientset, informers and
// listers, and what kubectl users see.
package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	netopscheme "github.com/netop-dev/netop/pkg/generated/clientset/versioned/scheme"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func network(name, cidr, gateway string) *samplecrdv1.Network {
	return &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       samplecrdv1.NetworkSpec{CIDR: cidr, Gateway: gateway},
	}
}

// The generated clientset, informer and lister see the same objects the API
// server stores, through create, status update, spec update and delete.
func TestRoundTripThroughClientsetInformerAndLister(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithCancel(t.Context())
	nets := env.Netop.SamplecrdV1().Networks(ns)

	factory := informers.NewSharedInformerFactoryWithOptions(env.Netop, time.Minute, informers.WithNamespace(ns))
	lister := factory.Samplecrd().V1().Networks().Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown() // after cancel, which stops the informers
	defer cancel()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer for %v did not sync", typ)
		}
	}

	created, err := nets.Create(ctx, network("example-network", "192.168.0.0/16", "192.168.0.1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if created.Spec.CIDR != "192.168.0.0/16" || created.Generation != 1 {
		t.Fatalf("created object = %+v", created)
	}

	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		got, err := lister.Networks(ns).Get("example-network")
		if err != nil {
			return false, err.Error()
		}
		return got.UID == created.UID, "lister has another UID"
	})

	// Status is a subresource: a status write does not change the spec or
	// the generation, and an update of the main resource ignores status.
	created.Status = samplecrdv1.NetworkStatus{
		ObservedGeneration: 1,
		CIDR:               "192.168.0.0/16",
		Gateway:            "192.168.0.1",
		Conditions: []metav1.Condition{{
			Type: samplecrd.ConditionReady, Status: metav1.ConditionTrue, Reason: samplecrd.ReasonProvisioned,
			Message: "bridge up", LastTransitionTime: metav1.Now(), ObservedGeneration: 1,
		}},
		Backend: &samplecrdv1.NetworkBackendStatus{Type: samplecrdv1.BackendLinux, Interface: "netop0123456789"},
	}
	withStatus, err := nets.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status: %v", err)
	}
	if withStatus.Generation != 1 || withStatus.Status.Backend == nil || withStatus.Status.Backend.Interface != "netop0123456789" {
		t.Fatalf("after status update: generation %d, status %+v", withStatus.Generation, withStatus.Status)
	}

	withStatus.Spec.CIDR, withStatus.Spec.Gateway = "192.168.1.0/16", "192.168.1.1"
	withStatus.Status = samplecrdv1.NetworkStatus{}
	updated, err := nets.Update(ctx, withStatus, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if updated.Generation != 2 || updated.Status.Backend == nil {
		t.Fatalf("spec update: generation %d (want 2), status kept: %v", updated.Generation, updated.Status.Backend != nil)
	}

	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		got, err := lister.Networks(ns).Get("example-network")
		if err != nil {
			return false, err.Error()
		}
		return got.Spec.CIDR == "192.168.1.0/16" && got.Status.Backend != nil,
			"lister has spec " + got.Spec.CIDR
	})
	all, err := lister.List(labels.Everything())
	if err != nil || len(all) != 1 {
		t.Fatalf("lister list: %d items, %v", len(all), err)
	}

	if err := nets.Delete(ctx, "example-network", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		_, err := lister.Networks(ns).Get("example-network")
		return apierrors.IsNotFound(err), "still in the lister"
	})
}

// The tutorial's manifest applies unchanged.
func TestTutorialManifestApplies(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	data, err := os.ReadFile("../../examples/network.yaml")
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &obj.Object); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(obj)
	force := true
	res := env.Netop.SamplecrdV1().RESTClient().Patch(types.ApplyPatchType).
		Namespace(ns).Resource("networks").Name(obj.GetName()).
		VersionedParams(&metav1.PatchOptions{FieldManager: "kubectl", Force: &force}, netopscheme.ParameterCodec).
		Body(body).Do(t.Context())
	if err := res.Error(); err != nil {
		t.Fatalf("applying examples/network.yaml: %v", err)
	}
	got, err := env.Netop.SamplecrdV1().Networks(ns).Get(t.Context(), "example-network", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.CIDR != "192.168.0.0/16" || got.Spec.Gateway != "192.168.0.1" {
		t.Fatalf("spec = %+v", got.Spec)
	}
}

// The schema rejects what is plainly wrong, naming the field, even with no
// webhook running.
func TestSchemaRejectsInvalidNetworks(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, tc := range []struct {
		name, cidr, gateway string
		field, reason       string
	}{
		{"empty-cidr", "", "10.0.0.1", "spec.cidr", "should be at least 1 chars long"},
		{"not-a-cidr", "192.168.0.0", "", "spec.cidr", "must be an IP prefix"},
		{"garbage-cidr", "x/y", "", "spec.cidr", "must be an IP prefix"},
		{"bad-gateway", "10.0.0.0/8", "10.0.0", "spec.gateway", "must be an IP address"},
		{"gateway-outside", "10.0.0.0/8", "11.0.0.1", "spec.gateway", "must be an address inside spec.cidr"},
		// The worst special-purpose prefixes, refused by CEL rules of the
		// schema even with no webhook (this API server has none).
		{"loopback", "127.0.0.0/8", "", "spec.cidr", "must not be in or contain a loopback range"},
		{"in-loopback", "127.0.1.0/24", "", "spec.cidr", "must not be in or contain a loopback range"},
		{"contains-loopback", "126.0.0.0/7", "", "spec.cidr", "must not be in or contain a loopback range"},
		{"loopback6", "::1/128", "", "spec.cidr", "must not be in or contain a loopback range"},
		{"contains-loopback6", "::/64", "", "spec.cidr", "must not be in or contain a loopback range"},
		{"all4", "0.0.0.0/0", "", "spec.cidr", "must not be a /0 prefix"},
		{"all6", "::/0", "", "spec.cidr", "must not be a /0 prefix"},
		{"multicast", "224.0.0.0/4", "", "spec.cidr", "must not be in or contain a multicast range"},
		{"in-multicast", "239.1.1.0/24", "", "spec.cidr", "must not be in or contain a multicast range"},
		{"contains-multicast", "128.0.0.0/1", "", "spec.cidr", "must not be in or contain a multicast range"},
		{"multicast6", "ff02::/16", "", "spec.cidr", "must not be in or contain a multicast range"},
		{"contains-multicast6", "fe00::/7", "", "spec.cidr", "must not be in or contain a multicast range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network(tc.name, tc.cidr, tc.gateway), metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: got %v, want an Invalid error", err)
			}
			if !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %q does not name %s and %q", err, tc.field, tc.reason)
			}
		})
	}

	// A manifest without cidr at all, as kubectl would send it.
	err := env.Netop.SamplecrdV1().RESTClient().Post().Namespace(ns).Resource("networks").
		Body([]byte(`{"apiVersion":"samplecrd.k8s.io/v1","kind":"Network","metadata":{"name":"no-cidr"},"spec":{"gateway":"10.0.0.1"}}`)).
		Do(t.Context()).Error()
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.cidr: Required value") {
		t.Fatalf("create without spec.cidr: got %v, want spec.cidr: Required value", err)
	}

	// A non-canonical cidr, as in the tutorial's update step, is accepted.
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network("tutorial-update", "192.168.1.0/16", "192.168.1.1"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("non-canonical cidr rejected: %v", err)
	}
	// The schema refuses only the worst: the other reserved ranges are the
	// webhook's (and --allow-reserved-prefixes lets them through), and
	// ranges that merely lie next to loopback or multicast pass.
	for i, cidr := range []string{"169.254.0.0/16", "fe80::/64", "126.0.0.0/8", "128.0.0.0/8", "223.255.255.0/24", "240.0.0.0/4", "fd00::/64", "2001:DB8::/64"} {
		if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network(fmt.Sprintf("schema-allows-%d", i), cidr, ""), metav1.CreateOptions{}); err != nil {
			t.Errorf("cidr %s rejected by the schema: %v", cidr, err)
		}
	}
}

// kubectl get net shows CIDR, GATEWAY, READY and ALLOCATED; the table comes from the
// CRD's printer columns, which is what kubectl prints.
func TestPrinterColumnsAndShortName(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), network("n", "10.1.0.0/16", "10.1.0.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	columns, rows := env.Table(t, "/apis/samplecrd.k8s.io/v1/namespaces/"+ns+"/networks")
	if want := "NAME CIDR GATEWAY READY NODES ALLOCATED AGE"; columns != want {
		t.Fatalf("columns = %q, want %q", columns, want)
	}
	if len(rows) != 1 || rows[0].Cells[1] != "10.1.0.0/16" || rows[0].Cells[2] != "10.1.0.1" {
		t.Fatalf("rows = %+v", rows)
	}

	resources, err := env.Kube.Discovery().ServerResourcesForGroupVersion(samplecrdv1.SchemeGroupVersion.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resources.APIResources {
		if r.Name == "networks" {
			if strings.Join(r.ShortNames, ",") != "net" || strings.Join(r.Categories, ",") != "netop" || !r.Namespaced {
				t.Fatalf("networks resource: shortNames %v categories %v namespaced %v", r.ShortNames, r.Categories, r.Namespaced)
			}
			return
		}
	}
	t.Fatal("discovery has no networks resource")
}

// kubectl explain reads field descriptions from the OpenAPI v3 document.
func TestExplainHasDescriptions(t *testing.T) {
	env := testenv.Get(t)
	for version, fields := range map[string][]string{"v1": {"cidr", "gateway"}, "v2": {"cidrs", "gateways"}} {
		// The API server publishes a CRD's OpenAPI a moment after it is
		// Established.
		var raw []byte
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			var err error
			raw, err = env.Kube.Discovery().RESTClient().Get().AbsPath("/openapi/v3/apis/samplecrd.k8s.io/" + version).DoRaw(ctx)
			return err == nil, fmt.Sprintf("OpenAPI v3 of %s: %v", version, err)
		})
		var doc struct {
			Components struct {
				Schemas map[string]struct {
					Properties map[string]struct {
						Description string `json:"description"`
						Properties  map[string]struct {
							Description string `json:"description"`
						} `json:"properties"`
					} `json:"properties"`
				} `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		schema, ok := doc.Components.Schemas["io.k8s.samplecrd."+version+".Network"]
		if !ok {
			t.Fatalf("no %s Network schema in OpenAPI v3", version)
		}
		descriptions := map[string]string{version + " status": schema.Properties["status"].Description}
		for _, f := range fields {
			descriptions[version+" spec."+f] = schema.Properties["spec"].Properties[f].Description
		}
		for path, desc := range descriptions {
			if len(desc) < 20 {
				t.Errorf("%s has no useful description: %q", path, desc)
			}
		}
	}
}
