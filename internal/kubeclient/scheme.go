package kubeclient

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	cnatv1alpha1 "github.com/netop-dev/netop/pkg/apis/cnat/v1alpha1"
	policyv1beta1 "github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
	samplecrdinstall "github.com/netop-dev/netop/pkg/apis/samplecrd/install"
)

// Scheme knows the built-in types and netop's: for Event references, for
// decoding admitted objects, and for converting Networks.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	// Network's hub and every served version, with their conversions:
	// the conversion webhook converts through them.
	samplecrdinstall.Install(Scheme)
	utilruntime.Must(cnatv1alpha1.AddToScheme(Scheme))
	utilruntime.Must(policyv1beta1.AddToScheme(Scheme))
}
