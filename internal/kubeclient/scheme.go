package kubeclient

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	cnatv1alpha1 "github.com/netop-dev/netop/pkg/apis/cnat/v1alpha1"
	policyv1beta1 "github.com/netop-dev/netop/pkg/apis/k8s.cni.cncf.io/v1beta1"
	samplecrdinstall "github.com/netop-dev/netop/pkg/apis/samplecrd/install"
)

// Scheme knows the built-in types and netop's: for Event references, for
// decoding admitted objects, and for converting Networks. It is built on
// first use, not at package initialisation, which every process importing
// the package paid: the CNI plugin, which the runtime executes for every
// pod and which never uses it, starts about 1.3 ms sooner (BENCHMARKS.md).
var Scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	// Network's hub and every served version, with their conversions:
	// the conversion webhook converts through them.
	samplecrdinstall.Install(s)
	utilruntime.Must(cnatv1alpha1.AddToScheme(s))
	utilruntime.Must(policyv1beta1.AddToScheme(s))
	return s
})
