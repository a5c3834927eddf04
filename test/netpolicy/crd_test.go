package netpolicy

import (
	"context"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
)

// A policy as Multus users write it is accepted in both versions and read
// back in v1beta1 by netop's generated client; what NetworkPolicy refuses
// is refused by the CRD, naming the field.
func TestValidation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	create := func(version, spec string) error {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte("apiVersion: k8s.cni.cncf.io/"+version+"\nkind: MultiNetworkPolicy\nmetadata: {generateName: p-}\nspec:\n"+spec), &obj.Object); err != nil {
			t.Fatal(err)
		}
		_, err := dyn.Resource(schema.GroupVersionResource{Group: v1beta1.GroupName, Version: version, Resource: "multi-networkpolicies"}).
			Namespace(ns).Create(t.Context(), obj, metav1.CreateOptions{})
		return err
	}
	const valid = `
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - podSelector: {matchLabels: {app: web}}
      namespaceSelector: {matchLabels: {team: a}}
    - ipBlock: {cidr: 10.0.0.0/16, except: [10.0.1.0/24]}
    ports:
    - {protocol: TCP, port: 5432}
    - {protocol: UDP, port: 1000, endPort: 2000}
    - {port: metrics}
    - {protocol: SCTP}
  egress:
  - to: [{ipBlock: {cidr: "2001:db8::/64"}}]
`
	for _, version := range []string{"v1beta1", "v1beta2"} {
		if err := create(version, valid); err != nil {
			t.Errorf("a valid policy in %s: %v", version, err)
		}
	}
	list, err := env.Netop.K8sCniCncfIoV1beta1().MultiNetworkPolicies(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("listing with the generated client: %v %v", list, err)
	}
	for _, p := range list.Items {
		if got := p.Spec.Ingress[0].Ports[1].EndPort; got == nil || *got != 2000 || p.Spec.Ingress[0].From[1].IPBlock.Except[0] != "10.0.1.0/24" {
			t.Errorf("policy %s read back as %+v", p.Name, p.Spec)
		}
	}

	for _, c := range []struct{ name, spec, want string }{
		{"bad cidr", "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]",
			"spec.ingress[0].from[0].ipBlock.cidr: Invalid value: cidr must be a CIDR"},
		{"except outside cidr", "  podSelector: {}\n  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/24, except: [10.0.1.0/25]}}]}]",
			"spec.egress[0].to[0].ipBlock.except: Invalid value: every except block must be a CIDR strictly inside cidr"},
		{"except the whole cidr", "  podSelector: {}\n  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/24, except: [10.0.0.0/24]}}]}]",
			"spec.egress[0].to[0].ipBlock.except"},
		{"port 0", "  podSelector: {}\n  ingress: [{ports: [{port: 0}]}]",
			"spec.ingress[0].ports[0].port: Invalid value: a port number must be between 1 and 65535"},
		{"port 70000", "  podSelector: {}\n  ingress: [{ports: [{port: 70000}]}]",
			"spec.ingress[0].ports[0].port"},
		{"long port name", "  podSelector: {}\n  ingress: [{ports: [{port: a-very-long-port-name}]}]",
			"spec.ingress[0].ports[0].port: Invalid value: a port name must have 1 to 15 characters"},
		{"endPort below port", "  podSelector: {}\n  ingress: [{ports: [{port: 90, endPort: 80}]}]",
			"spec.ingress[0].ports[0].endPort: Invalid value: endPort must not be below port"},
		{"endPort with a name", "  podSelector: {}\n  ingress: [{ports: [{port: web, endPort: 80}]}]",
			"spec.ingress[0].ports[0].endPort: Invalid value: endPort needs a port number"},
		{"bad protocol", "  podSelector: {}\n  ingress: [{ports: [{protocol: ICMP, port: 1}]}]",
			"spec.ingress[0].ports[0].protocol: Unsupported value: \"ICMP\""},
		{"ipBlock and selector", "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]",
			"spec.ingress[0].from[0]: Invalid value: a peer is an ipBlock, or a podSelector and/or a namespaceSelector"},
		{"empty peer", "  podSelector: {}\n  ingress: [{from: [{}]}]",
			"spec.ingress[0].from[0]: Invalid value: a peer is"},
		{"bad policy type", "  podSelector: {}\n  policyTypes: [Both]",
			"spec.policyTypes[0]: Unsupported value: \"Both\""},
	} {
		err := create("v1beta1", c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// The CRD another project installed (here: upstream's, whose v1beta2 is
// not served) is left as it is by netop's installation, and netop's client
// works with it.
func TestAnotherProjectsCRD(t *testing.T) {
	env := testenv.Get(t)
	crds := apiextensionsclient.NewForConfigOrDie(env.Config).ApiextensionsV1().CustomResourceDefinitions()
	const name = "multi-networkpolicies.k8s.cni.cncf.io"
	crd, err := crds.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	theirs := func(crd *apiextensionsv1.CustomResourceDefinition) {
		for i := range crd.Spec.Versions {
			if crd.Spec.Versions[i].Name == "v1beta2" {
				crd.Spec.Versions[i].Served = false
			}
		}
	}
	theirs(crd)
	if _, err := crds.Update(t.Context(), crd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			crd.Spec.Versions[1].Served = true
			_, err = crds.Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Error(err)
		}
	})
	if err := install.CRDs(t.Context(), env.Config); err != nil {
		t.Fatal(err)
	}
	crd, err = crds.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1beta2" && v.Served {
			t.Error("installing netop's CRDs served v1beta2 again: it rewrote another project's CRD")
		}
	}
	ns := env.Namespace(t)
	p := &v1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: v1beta1.MultiNetworkPolicySpec{PolicyTypes: []v1beta1.MultiPolicyType{v1beta1.PolicyTypeIngress},
			Ingress: []v1beta1.MultiNetworkPolicyIngressRule{{Ports: []v1beta1.MultiNetworkPolicyPort{{EndPort: ptr.To[int32](5)}}}}}}
	if _, err := env.Netop.K8sCniCncfIoV1beta1().MultiNetworkPolicies(ns).Create(t.Context(), p, metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "endPort needs a port number") {
		t.Errorf("netop's client with the kept CRD: %v, want its validation", err)
	}
}
