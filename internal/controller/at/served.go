package at

import (
	"context"

	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/metrics"
	cnatv1alpha1 "github.com/netop-dev/netop/pkg/apis/cnat/v1alpha1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	cnatinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/cnat/v1alpha1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// NewWhereServed is New where the API server serves Ats; nil, nil
// elsewhere: a netop upgraded before its CRDs were applied still runs,
// and Ats wait for a restart.
func NewWhereServed(ctx context.Context, client versioned.Interface, kube kubernetes.Interface, ats cnatinformers.AtInformer,
	pods coreinformers.PodInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	served, err := kubeclient.Serves(kube.Discovery(), cnatv1alpha1.SchemeGroupVersion.WithResource("ats"))
	if err != nil || !served {
		if err == nil {
			klog.FromContext(ctx).Info("Not running Ats: the API server does not serve them; apply netop's CRDs and restart", "resource", "ats."+cnatv1alpha1.GroupName)
		}
		return nil, err
	}
	return New(ctx, client, kube, ats, pods, recorder, m, o)
}
