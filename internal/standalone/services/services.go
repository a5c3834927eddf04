package services

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/ssa"
	"github.com/netop-dev/netop/internal/standalone/node"
)

// The cluster's DNS, as the kubelet hands it to pods.
const (
	// ClusterDomain is the cluster's DNS domain.
	ClusterDomain = "cluster.local"
	// DNSServiceIP is the kube-dns Service's address: the tenth of the
	// Service range, by convention.
	DNSServiceIP = "10.0.0.10"
)

// managedBy marks the EndpointSlices this package writes, for the
// EndpointSlice controller, which leaves others' slices alone.
const managedBy = "netop-standalone"

// Config is what the Services are served from.
type Config struct {
	// Admin writes the Services and their endpoints.
	Admin *rest.Config
	// Kubeconfig is the file CoreDNS reads the cluster with.
	Kubeconfig string
	// Host is the standalone's address on the underlay, where both are
	// served.
	Host netip.Addr
	// APIServer is the API server's loopback address, 127.0.0.1:PORT.
	APIServer string
	// LogDir gets CoreDNS's log.
	LogDir string
}

// Services serves the kubernetes and kube-dns Services.
type Services struct {
	forwarder     *node.Forwarder
	dns           *dnsServer
	stopInformers chan struct{}
}

// Start serves the API server and DNS on cfg.Host and points the two
// Services at them.
func Start(ctx context.Context, cfg Config) (_ *Services, err error) {
	s := &Services{forwarder: &node.Forwarder{}}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	_, apiPort, err := net.SplitHostPort(cfg.APIServer)
	if err != nil {
		return nil, fmt.Errorf("API server address %s: %w", cfg.APIServer, err)
	}
	port, err := strconv.Atoi(apiPort)
	if err != nil {
		return nil, fmt.Errorf("API server address %s: %w", cfg.APIServer, err)
	}
	l, err := net.Listen("tcp", netip.AddrPortFrom(cfg.Host, uint16(port)).String())
	if err != nil {
		return nil, fmt.Errorf("serving the API server on the underlay: %w", err)
	}
	s.forwarder.Forward(ctx, l, cfg.APIServer)
	kube, err := kubernetes.NewForConfig(cfg.Admin)
	if err != nil {
		return nil, err
	}
	factory := kubeinformers.NewSharedInformerFactory(kube, 0)
	namespaces := factory.Core().V1().Namespaces()
	nsInformer := namespaces.Informer()
	s.stopInformers = make(chan struct{})
	factory.Start(s.stopInformers)
	exists := func(name string) bool {
		_, err := namespaces.Lister().Get(name)
		return err == nil
	}
	if s.dns, err = startDNS(ctx, cfg.Host, cfg.Kubeconfig, cfg.LogDir, exists); err != nil {
		return nil, err
	}
	if !cache.WaitForCacheSync(ctx.Done(), nsInformer.HasSynced) {
		return nil, fmt.Errorf("listing namespaces: %w", ctx.Err())
	}
	if err := applyDNSService(ctx, kube); err != nil {
		return nil, err
	}
	https, dns, dnsTCP := "https", "dns", "dns-tcp"
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p53 := int32(53)
	p := int32(port)
	if err := applyEndpoints(ctx, kube, metav1.NamespaceDefault, "kubernetes", cfg.Host, []discoveryv1.EndpointPort{{Name: &https, Protocol: &tcp, Port: &p}}); err != nil {
		return nil, err
	}
	if err := applyEndpoints(ctx, kube, metav1.NamespaceSystem, "kube-dns", cfg.Host, []discoveryv1.EndpointPort{{Name: &dns, Protocol: &udp, Port: &p53}, {Name: &dnsTCP, Protocol: &tcp, Port: &p53}}); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(1).Info("Cluster services served", "address", cfg.Host, "dns", DNSServiceIP)
	return s, nil
}

// Stop stops serving; the Services stay, for the next start.
func (s *Services) Stop() {
	if s.stopInformers != nil {
		close(s.stopInformers)
		s.stopInformers = nil
	}
	if s.dns != nil {
		s.dns.stop()
		s.dns = nil
	}
	s.forwarder.Stop()
}

// applyDNSService declares kube-system/kube-dns at DNSServiceIP.
func applyDNSService(ctx context.Context, kube kubernetes.Interface) error {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: metav1.NamespaceSystem, Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: DNSServiceIP,
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53},
			},
		},
	}
	_, err := ssa.Apply(ctx, kube.CoreV1().Services(metav1.NamespaceSystem), svc.Name, svc)
	return err
}

// applyEndpoints points the Service name at addr.
func applyEndpoints(ctx context.Context, kube kubernetes.Interface, namespace, name string, addr netip.Addr, ports []discoveryv1.EndpointPort) error {
	if !addr.Is4() {
		return errors.New("the underlay is IPv4")
	}
	ready := true
	slice := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-standalone", Namespace: namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: name,
			discoveryv1.LabelManagedBy:   managedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       ports,
	}
	_, err := ssa.Apply(ctx, kube.DiscoveryV1().EndpointSlices(namespace), slice.Name, slice)
	return err
}
