package operator

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/spf13/pflag"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/networks"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// --allow-reserved-prefixes reaches the Network validation webhook: a
// link-local Network is refused without it and admitted with it.
func TestAllowReservedPrefixesReachesValidation(t *testing.T) {
	n := &samplecrdv1.Network{
		TypeMeta:   metav1.TypeMeta{APIVersion: samplecrdv1.SchemeGroupVersion.String(), Kind: "Network"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n"},
		Spec:       samplecrdv1.NetworkSpec{CIDR: "169.254.0.0/16"},
	}
	raw, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	req := &admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}
	for _, args := range [][]string{nil, {"--allow-reserved-prefixes"}} {
		o := NewOptions()
		fs := pflag.NewFlagSet("netop", pflag.ContinueOnError)
		o.AddFlags(fs, RoleController)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		set := admission.Webhooks(admission.Deps{OperatorNamespace: o.OperatorNamespace, AllowReservedPrefixes: o.AllowReservedPrefixes}, networks.NewCIDRs())
		var validate webhook.Handler
		for _, w := range set.Webhooks {
			if w.Path == networks.PathValidate {
				validate = w.Handler
			}
		}
		if validate == nil {
			t.Fatalf("no webhook at %s", networks.PathValidate)
		}
		resp := validate.Admit(context.Background(), req)
		if want := len(args) > 0; resp.Allowed != want {
			t.Errorf("flags %q: 169.254.0.0/16 allowed=%v (%v), want %v", args, resp.Allowed, resp.Result, want)
		}
	}
}
