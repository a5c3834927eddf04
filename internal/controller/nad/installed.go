package nad

import (
	"context"
	"fmt"
	"time"

	"github.com/netop-dev/netop/internal/metrics"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v2"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// NewWhereInstalled is New where the cluster serves
// NetworkAttachmentDefinitions (Multus is installed), on a dynamic client
// of cfg and an informer factory of its own on every
// NetworkAttachmentDefinition of namespace ("": all), which the caller
// starts; nil, nil elsewhere.
func NewWhereInstalled(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, resync time.Duration, namespace string,
	networks samplecrdinformers.NetworkInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, dynamicinformer.DynamicSharedInformerFactory, error) {
	installed, err := Installed(kube.Discovery())
	if err != nil || !installed {
		klog.FromContext(ctx).V(1).Info("Not keeping NetworkAttachmentDefinitions", "installed", installed, "err", err)
		return nil, nil, nil //nolint:nilerr // discovery failing only means Multus support is off
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("dynamic client: %w", err)
	}
	// All of them, not only netop's: one a user made under a Network's
	// name must be seen to be left alone.
	nads := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, resync, namespace, nil)
	c, err := New(ctx, dyn, networks, nads.ForResource(Resource), recorder, m, o)
	return c, nads, err
}
