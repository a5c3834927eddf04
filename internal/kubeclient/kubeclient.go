// Package kubeclient is how netop talks to the API server: where the
// cluster is (ConfigFlags), the clients' options, the scheme of the types
// netop reads and writes, the cluster's identity, and the informer
// transforms that keep the caches small. Clients of the built-in resources
// (pods, deployments, configmaps, events, leases, nodes) speak protobuf, as
// Kubernetes' own components do (their --kube-api-content-type): it is
// smaller on the wire and cheaper to encode and decode than JSON. Custom
// resources (Networks, and the NetworkAttachmentDefinitions of the dynamic
// client) have no protobuf encoding, so their clients keep the
// configuration's JSON.
package kubeclient

import (
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The content types a client of the built-in resources may use.
const (
	Protobuf = runtime.ContentTypeProtobuf
	JSON     = runtime.ContentTypeJSON
)

// ValidContentType says why contentType cannot be used, or nil.
func ValidContentType(contentType string) error {
	if contentType != Protobuf && contentType != JSON {
		return fmt.Errorf("content type %q is not supported; supported: %s, %s", contentType, Protobuf, JSON)
	}
	return nil
}

// Config is a copy of cfg whose requests are encoded as contentType and
// whose responses may come in it, or in JSON: an aggregated API server
// that serves no protobuf still answers.
func Config(cfg *rest.Config, contentType string) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = contentType
	cfg.AcceptContentTypes = contentType
	if contentType != JSON {
		cfg.AcceptContentTypes += "," + JSON
	}
	return cfg
}

// New is a clientset of the built-in resources speaking contentType.
func New(cfg *rest.Config, contentType string) (*kubernetes.Clientset, error) {
	if err := ValidContentType(contentType); err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(Config(cfg, contentType))
}

// Serves reports whether the API server serves resource gvr: a CRD netop
// works with may not be installed (Multus's), or not yet (an upgrade whose
// CRDs are applied after the binary).
func Serves(d discovery.DiscoveryInterface, gvr schema.GroupVersionResource) (bool, error) {
	resources, err := d.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", gvr.GroupVersion(), err)
	}
	return slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource }), nil
}
