package netselect

import (
	"fmt"
	"net/netip"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// A Deployment may ask for a Network of its own (its annotations); the
// admission webhook and the Deployment-network controller read the ask,
// and list the Network in the pod template, alike.

// OfDeploymentNamed says whether a Network is the one of a Deployment of
// that name (its controller), whatever that Deployment's UID.
func OfDeploymentNamed(n metav1.Object, name string) bool {
	owner := metav1.GetControllerOfNoCopy(n)
	return owner != nil && owner.Name == name && owner.Kind == "Deployment" && owner.APIVersion == appsv1.SchemeGroupVersion.String()
}

// DeploymentWants reads a Deployment's annotations: whether it asks for a Network,
// and the cidr it names (invalid for one from the pool).
func DeploymentWants(annotations map[string]string) (netip.Prefix, bool, error) {
	mode, auto := annotations[samplecrd.DeploymentNetworkAnnotation]
	explicit, hasCIDR := annotations[samplecrd.DeploymentNetworkCIDRAnnotation]
	if auto && mode != samplecrd.DeploymentNetworkAuto {
		return netip.Prefix{}, false, fmt.Errorf("annotation %s: %q is not %q; for a cidr of your choice use %s",
			samplecrd.DeploymentNetworkAnnotation, mode, samplecrd.DeploymentNetworkAuto, samplecrd.DeploymentNetworkCIDRAnnotation)
	}
	if !hasCIDR {
		return netip.Prefix{}, auto, nil
	}
	cidr, err := netip.ParsePrefix(explicit)
	if err != nil {
		return netip.Prefix{}, false, fmt.Errorf("annotation %s: %q is not a cidr such as 10.1.0.0/24: %w", samplecrd.DeploymentNetworkCIDRAnnotation, explicit, err)
	}
	return cidr.Masked(), true, nil
}

// TemplateNetworks is the pod template's Multus annotation with the
// Deployment's Network listed, and whether it had to be added.
func TemplateNetworks(d *appsv1.Deployment) (string, bool, error) {
	return WithNetwork(d.Spec.Template.Annotations[NetworksAnnotation], d.Namespace, d.Name)
}
