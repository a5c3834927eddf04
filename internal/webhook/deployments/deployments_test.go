package deployments

import (
	"encoding/json"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

func TestAdmit(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	owned := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "owned", Namespace: "ns", UID: "d1"}}
	_ = indexer.Add(&samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "taken", Namespace: "ns"}})
	_ = indexer.Add(&samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "owned", Namespace: "ns",
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(owned, appsv1.SchemeGroupVersion.WithKind("Deployment"))}}})
	a := &Attacher{Networks: samplecrdlisters.NewNetworkLister(indexer)}
	auto := map[string]string{samplecrd.DeploymentNetworkAnnotation: samplecrd.DeploymentNetworkAuto}

	for _, tc := range []struct {
		name        string
		op          admissionv1.Operation
		uid         string
		annotations map[string]string
		template    map[string]string
		// want is the template's networks annotation after the patch; a
		// denial is named by a fragment of its message.
		want, denied string
	}{
		{name: "web", op: admissionv1.Create, annotations: auto, want: "web"},
		{name: "web", op: admissionv1.Create, annotations: auto, template: map[string]string{"x": "y"}, want: "web"},
		{name: "web", op: admissionv1.Create, annotations: map[string]string{samplecrd.DeploymentNetworkCIDRAnnotation: "10.1.0.0/24"},
			template: map[string]string{netselect.NetworksAnnotation: `[{"name":"other"}]`}, want: `[{"name":"other"},{"name":"web","namespace":"ns"}]`},
		{name: "web", op: admissionv1.Update, annotations: auto, template: map[string]string{netselect.NetworksAnnotation: "other,web"}, want: "other,web"},
		{name: "web", op: admissionv1.Create, want: ""},
		{name: "web", op: admissionv1.Create, annotations: map[string]string{samplecrd.DeploymentNetworkAnnotation: "yes"}, denied: samplecrd.DeploymentNetworkAnnotation},
		{name: "web", op: admissionv1.Create, annotations: map[string]string{samplecrd.DeploymentNetworkCIDRAnnotation: "ten"}, denied: samplecrd.DeploymentNetworkCIDRAnnotation},
		{name: "web", op: admissionv1.Create, annotations: auto, template: map[string]string{netselect.NetworksAnnotation: "bad name!"}, denied: "spec.template.metadata.annotations"},
		{name: "taken", op: admissionv1.Create, annotations: auto, denied: "is not this Deployment's"},
		// A Deployment of this name was deleted; its Network is not
		// collected yet.
		{name: "owned", op: admissionv1.Create, annotations: auto, want: "owned"},
		// generateName: no name yet, nothing to add.
		{name: "", op: admissionv1.Create, annotations: auto, template: map[string]string{netselect.NetworksAnnotation: "other"}, want: "other"},
		{name: "owned", op: admissionv1.Update, uid: "d1", annotations: auto, want: "owned"},
	} {
		// The API server sets the UID after mutating admission of a create.
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: tc.name, UID: types.UID(tc.uid), Annotations: tc.annotations}}
		d.Spec.Template.Annotations = tc.template
		raw, _ := json.Marshal(d)
		resp := a.Admit(t.Context(), &admissionv1.AdmissionRequest{Operation: tc.op, Namespace: "ns", Name: tc.name, Object: runtime.RawExtension{Raw: raw}})
		if tc.denied != "" {
			if resp.Allowed || !strings.Contains(resp.Result.Message, tc.denied) {
				t.Errorf("%s %v: allowed %v, %+v; want denied naming %s", tc.name, tc.annotations, resp.Allowed, resp.Result, tc.denied)
			}
			continue
		}
		if !resp.Allowed {
			t.Errorf("%s %v: denied: %s", tc.name, tc.annotations, resp.Result.Message)
			continue
		}
		got := raw
		if len(resp.Patch) > 0 {
			patch, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatal(err)
			}
			if got, err = patch.Apply(raw); err != nil {
				t.Fatalf("%s: applying %s: %v", tc.name, resp.Patch, err)
			}
		}
		var after appsv1.Deployment
		_ = json.Unmarshal(got, &after)
		if a := after.Spec.Template.Annotations[netselect.NetworksAnnotation]; a != tc.want {
			t.Errorf("%s %v %v: template's networks = %q, want %q", tc.name, tc.annotations, tc.template, a, tc.want)
		}
		if tc.template["x"] != "" && after.Spec.Template.Annotations["x"] != "y" {
			t.Errorf("%s: other template annotations lost: %v", tc.name, after.Spec.Template.Annotations)
		}
	}
}
