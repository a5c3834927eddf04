// Package multus tests netop in a cluster that serves Multus's
// NetworkAttachmentDefinitions: its own test binary, so that the CRD it
// installs changes no other suite's cluster.
package multus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/controller/nad"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(env *testenv.Env) (func(), error) {
		data, err := os.ReadFile("testdata/network-attachment-definition-crd.yaml")
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return nil, err
		}
		return func() {}, install.ApplyCRDs(context.Background(), env.Config, crd)
	}))
}

func startOperator(t *testing.T, env *testenv.Env) (*operator.Operator, func()) {
	t.Helper()
	opts := operator.NewOptions()
	opts.Metrics.Addr = "0"
	opts.Webhooks.Addr = "0"
	opts.Workloads.Enabled = false
	opts.CNISocket = "@netop-cni-multus-test"
	return testenv.StartOperator(t, env.Config, opts, backendtest.New())
}

// Where Multus's CRD is served, every Network gets a
// NetworkAttachmentDefinition of its name, owned by it, whose CNI
// configuration makes netop's plugin the delegate for that Network (a
// configuration the plugin itself accepts, field for field). A changed or
// deleted one is put back; one a user made under a Network's name is left
// alone, with a Warning; a restarted operator writes none; the garbage
// collector removes a Network's with the Network.
func TestNetworkAttachmentDefinitions(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	nads := dyn.Resource(nad.Resource).Namespace(ns)
	nets := env.Netop.SamplecrdV1().Networks(ns)

	// A user's own definition under the name of a Network to come.
	mine := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": nad.Kind,
		"metadata": map[string]any{"name": "taken"},
		"spec":     map[string]any{"config": `{"cniVersion":"1.0.0","type":"macvlan","master":"eth0"}`},
	}}
	if _, err := nads.Create(t.Context(), mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	_, stop := startOperator(t, env)
	for name, cidr := range map[string]string{"example-network": "192.168.0.0/16", "taken": "10.8.0.0/24"} {
		if _, err := nets.Create(t.Context(), &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: samplecrdv1.NetworkSpec{CIDR: cidr}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	network := env.WaitReady(t, ns, "example-network", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)

	var got *unstructured.Unstructured
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		var err error
		got, err = nads.Get(ctx, "example-network", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	owners := got.GetOwnerReferences()
	if len(owners) != 1 || owners[0].UID != network.UID || owners[0].Kind != "Network" || owners[0].Controller == nil || !*owners[0].Controller {
		t.Errorf("owner references %+v, want the Network as controller", owners)
	}
	config, _, _ := unstructured.NestedString(got.Object, "spec", "config")
	var conf cniapi.Config
	dec := json.NewDecoder(bytes.NewReader([]byte(config)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&conf); err != nil {
		t.Fatalf("config %s: not the plugin's: %v", config, err)
	}
	if conf.Type != cniapi.Type || conf.Network != ns+"/example-network" || conf.Socket != "@netop-cni-multus-test" || conf.CNIVersion == "" || conf.DataDir == "" {
		t.Errorf("config %s", config)
	}

	// The user's definition stays theirs, and the Network says why it has
	// none of its own.
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.SelectorFromSet(fields.Set{
			"involvedObject.name": "taken", "reason": nad.ReasonConflict}).String()})
		return err == nil && len(events.Items) > 0 && events.Items[0].Type == corev1.EventTypeWarning, fmt.Sprint(err)
	})
	if taken, err := nads.Get(t.Context(), "taken", metav1.GetOptions{}); err != nil || len(taken.GetOwnerReferences()) != 0 {
		t.Errorf("the user's definition: %v, owners %v", err, taken.GetOwnerReferences())
	} else if c, _, _ := unstructured.NestedString(taken.Object, "spec", "config"); c != `{"cniVersion":"1.0.0","type":"macvlan","master":"eth0"}` {
		t.Errorf("the user's definition was changed: %s", c)
	}

	// Changed or deleted: put back.
	edited := got.DeepCopy()
	if err := unstructured.SetNestedField(edited.Object, `{"type":"bridge"}`, "spec", "config"); err != nil {
		t.Fatal(err)
	}
	if _, err := nads.Update(t.Context(), edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitConfig(t, nads, "example-network", config)
	if err := nads.Delete(t.Context(), "example-network", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitConfig(t, nads, "example-network", config)

	// A restart writes none.
	stop()
	restarted, _ := startOperator(t, env)
	env.WaitReady(t, ns, "example-network", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		return testutil.ToFloat64(restarted.Metrics().ReconcileTotal.WithLabelValues(nad.Name, "success")) >= 2,
			"the restarted operator has not synced both Networks' definitions"
	})
	if writes := testutil.ToFloat64(restarted.Metrics().APIWrites.WithLabelValues("patch", "network-attachment-definitions")); writes != 0 {
		t.Errorf("a restarted operator wrote %v NetworkAttachmentDefinitions that were right", writes)
	}

	// The garbage collector removes it with its Network.
	if err := nets.Delete(t.Context(), "example-network", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, err := nads.Get(ctx, "example-network", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("definition still there (%v)", err)
	})
}

func waitConfig(t *testing.T, nads dynamic.ResourceInterface, name, want string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		got, err := nads.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c, _, _ := unstructured.NestedString(got.Object, "spec", "config")
		return c == want, "config " + c
	})
}
