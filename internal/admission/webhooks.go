package admission

import (
	"slices"

	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/sidecar/pods"
	"github.com/netop-dev/netop/internal/sidecar/workloads"
	"github.com/netop-dev/netop/internal/tenancy"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/deployments"
	"github.com/netop-dev/netop/internal/webhook/networks"
	"github.com/netop-dev/netop/internal/webhook/podnetworks"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// WebhookConfigurationName names both of netop's webhook configurations.
const WebhookConfigurationName = "netop"

// NetworkCRD is the CRD whose conversion webhook netop serves.
const NetworkCRD = "networks." + samplecrd.GroupName

// PathConvert serves the Network CRD's conversion webhook.
const PathConvert = "/convert"

// Webhooks is netop's table of admission webhooks. Each handler's package
// declares its own (path, rules, match conditions, failure policy, and
// why); this is where they are built and listed.
//
// Failure policies are chosen so that a webhook outage never deadlocks the
// cluster yet never lets through what the user relies on: every webhook
// skips kube-system and the operator's own namespace, so that netop itself,
// and the system it needs to come back, can always start; each webhook
// fails closed only where what it refuses must never pass.
func Webhooks(d Deps, cidrs *networks.CIDRs) webhook.Set {
	skip := webhook.NamespacesExcept("kube-system", d.OperatorNamespace)
	var networkLister samplecrdlisters.NetworkLister
	if d.Networks != nil { // nil in unit tests of one webhook
		networkLister = samplecrdlisters.NewNetworkLister(d.Networks.GetIndexer())
	}
	joins := &podnetworks.Admission{Networks: networkLister,
		Namespaces: tenancy.Namespaces{Lister: d.Namespaces, Kube: d.Kube}, Pins: d.Pins}
	netAdmission := &networks.Admission{CIDRs: cidrs, Decoder: webhook.NewDecoder(kubeclient.Scheme()),
		Resolver: netspec.Resolver{AllowReserved: d.AllowReservedPrefixes}, Addresses: d.Addresses}
	templates := envoy.Finder{ConfigMaps: d.Templates, OperatorNamespace: d.OperatorNamespace, AllowPrivileged: d.AllowPrivilegedTemplates}
	podInjector := &pods.Injector{Templates: templates, Recorder: d.Recorder}
	workloadInjector := &workloads.Injector{Templates: templates, Recorder: d.Recorder}

	set := webhook.Set{Name: WebhookConfigurationName, Webhooks: slices.Concat(
		netAdmission.Webhooks(skip),
		joins.Webhooks(skip),
		podInjector.Webhooks(skip),
		[]webhook.Webhook{workloadInjector.Webhook(skip)},
	)}
	if d.DeploymentNetworks {
		set.Webhooks = append(set.Webhooks, (&deployments.Attacher{Networks: networkLister}).Webhook(skip))
	}
	return set
}
