// Package install registers the samplecrd.k8s.io group in a scheme: the
// hub and every version, with their conversions, v2 preferred.
package install

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Install registers the group in scheme.
func Install(scheme *runtime.Scheme) {
	utilruntime.Must(samplecrd.AddToScheme(scheme))
	utilruntime.Must(samplecrdv1.AddToScheme(scheme))
	utilruntime.Must(samplecrdv2.AddToScheme(scheme))
	utilruntime.Must(scheme.SetVersionPriority(samplecrdv2.SchemeGroupVersion, samplecrdv1.SchemeGroupVersion))
}
