package install

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/ssa"
)

// Policies creates or updates netop's admission policies and their
// bindings (config.Policies) with a server-side apply: the API server
// enforces them with no netop in the path.
func Policies(ctx context.Context, cfg *rest.Config) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	policies, bindings, err := config.Policies()
	if err != nil {
		return err
	}
	for _, p := range policies {
		p.APIVersion, p.Kind = admissionregistrationv1.SchemeGroupVersion.String(), "ValidatingAdmissionPolicy"
		if _, err := ssa.Apply(ctx, kube.AdmissionregistrationV1().ValidatingAdmissionPolicies(), p.Name, p); err != nil {
			return fmt.Errorf("ValidatingAdmissionPolicy: %w", err)
		}
	}
	for _, b := range bindings {
		b.APIVersion, b.Kind = admissionregistrationv1.SchemeGroupVersion.String(), "ValidatingAdmissionPolicyBinding"
		if _, err := ssa.Apply(ctx, kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings(), b.Name, b); err != nil {
			return fmt.Errorf("ValidatingAdmissionPolicyBinding: %w", err)
		}
	}
	return nil
}
