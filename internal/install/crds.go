// Package install puts netop's CustomResourceDefinitions (waiting until the
// API server serves them) and admission policies into a cluster, for
// netop-standalone and the tests.
package install

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/ssa"
)

// CRDs creates or updates netop's CRDs with a server-side apply, creates
// the shared ones (config.Shared) that are missing, and waits until each
// is Established.
func CRDs(ctx context.Context, cfg *rest.Config) error {
	crds, err := config.CRDs()
	if err != nil {
		return err
	}
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}
	var own []*apiextensionsv1.CustomResourceDefinition
	for _, crd := range crds {
		if !config.Shared(crd) {
			own = append(own, crd)
			continue
		}
		if err := createCRD(ctx, client, crd); err != nil {
			return err
		}
	}
	return applyCRDs(ctx, client, own)
}

// createCRD creates crd unless a CRD of its name exists, which is left as
// it is (another project's), and waits until it is Established.
func createCRD(ctx context.Context, client apiextensionsclient.Interface, crd *apiextensionsv1.CustomResourceDefinition) error {
	_, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{FieldManager: ssa.FieldManager})
	switch {
	case apierrors.IsAlreadyExists(err):
		klog.FromContext(ctx).V(1).Info("CRD installed already: left as it is", "crd", crd.Name)
	case err != nil:
		return fmt.Errorf("CRD %s: %w", crd.Name, err)
	}
	return waitEstablished(ctx, client, crd.Name)
}

// ApplyCRDs creates or updates CRDs with a server-side apply and waits
// until each is Established.
func ApplyCRDs(ctx context.Context, cfg *rest.Config, crds ...*apiextensionsv1.CustomResourceDefinition) error {
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}
	return applyCRDs(ctx, client, crds)
}

func applyCRDs(ctx context.Context, client apiextensionsclient.Interface, crds []*apiextensionsv1.CustomResourceDefinition) error {
	for _, crd := range crds {
		crd.APIVersion = apiextensionsv1.SchemeGroupVersion.String()
		crd.Kind = "CustomResourceDefinition"
		if err := keepConversionWebhook(ctx, client, crd); err != nil {
			return err
		}
		if _, err := ssa.Apply(ctx, client.ApiextensionsV1().CustomResourceDefinitions(), crd.Name, crd); err != nil {
			return fmt.Errorf("CRD: %w", err)
		}
		if err := waitEstablished(ctx, client, crd.Name); err != nil {
			return err
		}
		klog.FromContext(ctx).V(1).Info("CRD established", "crd", crd.Name)
	}
	return nil
}

// keepConversionWebhook leaves the conversion webhook of an installed CRD
// as it is: the operator points it at its own target (a URL in the
// standalone, where the manifest names the Service of a cluster
// deployment) with its CA, and an apply of the manifest's would undo
// that. A new CRD, or one without a webhook yet, gets the manifest's, so
// that a version that needs the webhook fails clearly until the operator
// serves it rather than being read unconverted.
func keepConversionWebhook(ctx context.Context, client apiextensionsclient.Interface, crd *apiextensionsv1.CustomResourceDefinition) error {
	if crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy != apiextensionsv1.WebhookConverter {
		return nil
	}
	installed, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("CRD %s: %w", crd.Name, err)
	}
	if installed.Spec.Conversion != nil && installed.Spec.Conversion.Strategy == apiextensionsv1.WebhookConverter {
		crd.Spec.Conversion = installed.Spec.Conversion.DeepCopy()
	}
	return nil
}

func waitEstablished(ctx context.Context, client apiextensionsclient.Interface, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be established: %w", name, err)
	}
	return nil
}

// Namespace creates the namespace unless it exists.
func Namespace(ctx context.Context, cfg *rest.Config, name string) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}
