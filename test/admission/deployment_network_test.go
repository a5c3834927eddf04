package admission

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/netop-dev/netop/internal/controller/deploynet"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// networkDeployment is a Deployment of busybox pods (labelled app=name)
// with the annotations given.
func networkDeployment(name string, replicas int32, annotations map[string]string) *appsv1.Deployment {
	d := annotatedDeployment(name, replicas, corev1.Container{Name: "c", Image: "busybox"})
	d.Annotations = annotations
	return d
}

// ownNetwork waits until the Deployment's Network is Ready and checks that
// the Deployment owns it as the garbage collector needs.
func ownNetwork(t *testing.T, env *testenv.Env, d *appsv1.Deployment) *samplecrdv1.Network {
	t.Helper()
	n := env.WaitReady(t, d.Namespace, d.Name, metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
	ref := metav1.GetControllerOf(n)
	if ref == nil || ref.UID != d.UID || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("Network %s: owner %+v, want the Deployment (uid %s) as controller, blocking its deletion", n.Name, ref, d.UID)
	}
	return n
}

// podsJoin waits until the Deployment's replicas (made by the real
// ReplicaSet controller) hold addresses of its Network.
func podsJoin(t *testing.T, env *testenv.Env, d *appsv1.Deployment, n *samplecrdv1.Network) {
	t.Helper()
	cidr := netip.MustParsePrefix(n.Spec.CIDR)
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		pods, err := env.Kube.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + d.Name})
		if err != nil {
			return false, err.Error()
		}
		joined := 0
		for _, p := range pods.Items {
			allocations, _ := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
			for _, a := range allocations {
				if ip, err := netip.ParsePrefix(a.IPs[0]); a.Network == n.Namespace+"/"+n.Name && err == nil && cidr.Contains(ip.Addr()) {
					joined++
				}
			}
		}
		return joined == int(*d.Spec.Replicas), fmt.Sprintf("%d of %d pods hold an address of %s (%d pods)", joined, *d.Spec.Replicas, cidr, len(pods.Items))
	})
}

func gone(t *testing.T, what string, get func(context.Context) error) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, string) {
		err := get(ctx)
		return apierrors.IsNotFound(err), fmt.Sprintf("%s still there (%v)", what, err)
	})
}

// The tutorial's closing idea: Deployments annotated
// samplecrd.k8s.io/network: auto get a Network of their own from the pool,
// without overlaps, or the cidr they name; admission lists it in their pod
// template so that the pods the ReplicaSet controller makes join it; the
// Deployment owns it, and deleting the Deployment deletes it through the
// garbage collector, in the foreground (the Network goes first) and the
// background, freeing the cidr for the next Deployment.
func TestDeploymentNetworks(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	ns := env.Namespace(t)
	deployments := env.Kube.AppsV1().Deployments(ns)
	networks := env.Netop.SamplecrdV1().Networks(ns)
	auto := map[string]string{samplecrd.DeploymentNetworkAnnotation: samplecrd.DeploymentNetworkAuto}
	create := func(d *appsv1.Deployment) *appsv1.Deployment {
		t.Helper()
		created, err := deployments.Create(t.Context(), d, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}

	web := create(networkDeployment("web", 2, auto))
	if got := web.Spec.Template.Annotations[netselect.NetworksAnnotation]; got != "web" {
		t.Errorf("web's pod template at admission: %s = %q, want web", netselect.NetworksAnnotation, got)
	}
	api := create(networkDeployment("api", 1, auto))
	db := create(networkDeployment("db", 1, map[string]string{samplecrd.DeploymentNetworkCIDRAnnotation: "10.77.0.0/24"}))
	webNet, apiNet, dbNet := ownNetwork(t, env, web), ownNetwork(t, env, api), ownNetwork(t, env, db)
	pool := netip.MustParsePrefix("172.30.0.0/16")
	webCIDR, apiCIDR := netip.MustParsePrefix(webNet.Spec.CIDR), netip.MustParsePrefix(apiNet.Spec.CIDR)
	if !pool.Contains(webCIDR.Addr()) || !pool.Contains(apiCIDR.Addr()) || webCIDR.Bits() != 24 || webCIDR.Overlaps(apiCIDR) {
		t.Errorf("auto cidrs %s and %s: want distinct /24s of %s", webCIDR, apiCIDR, pool)
	}
	if dbNet.Spec.CIDR != "10.77.0.0/24" {
		t.Errorf("db's Network has %s, want the annotation's 10.77.0.0/24", dbNet.Spec.CIDR)
	}
	podsJoin(t, env, web, webNet)
	podsJoin(t, env, db, dbNet)

	t.Run("foreground deletion", func(t *testing.T) {
		if err := deployments.Delete(t.Context(), "web", metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationForeground)}); err != nil {
			t.Fatal(err)
		}
		// The Network blocks its owner's deletion: when the Deployment is
		// gone, so is the Network (its bridge removed by netop first).
		gone(t, "Deployment web", func(ctx context.Context) error {
			_, err := deployments.Get(ctx, "web", metav1.GetOptions{})
			return err
		})
		if n, err := networks.Get(t.Context(), "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Deployment web gone in the foreground before its Network: %v, %v", n.GetDeletionTimestamp(), err)
		}
		// Its cidr is free again: the next Deployment gets it.
		next := create(networkDeployment("web2", 1, auto))
		if n := ownNetwork(t, env, next); n.Spec.CIDR != webCIDR.String() {
			t.Errorf("after web went, web2 got %s, want web's freed %s", n.Spec.CIDR, webCIDR)
		}
	})

	t.Run("background deletion", func(t *testing.T) {
		if err := deployments.Delete(t.Context(), "api", metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationBackground)}); err != nil {
			t.Fatal(err)
		}
		gone(t, "Network api", func(ctx context.Context) error { _, err := networks.Get(ctx, "api", metav1.GetOptions{}); return err })
	})

	t.Run("refused, naming the annotation", func(t *testing.T) {
		for _, tc := range []struct {
			annotations map[string]string
			want        string
		}{
			{map[string]string{samplecrd.DeploymentNetworkAnnotation: "yes"}, samplecrd.DeploymentNetworkAnnotation},
			{map[string]string{samplecrd.DeploymentNetworkCIDRAnnotation: "10.1.0.0"}, samplecrd.DeploymentNetworkCIDRAnnotation},
		} {
			_, err := deployments.Create(t.Context(), networkDeployment("bad", 1, tc.annotations), metav1.CreateOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: got %v, want a refusal naming %s", tc.annotations, err, tc.want)
			}
		}
		// A user's Network under the Deployment's name (admission checks
		// against netop's cache, which has it once it is Ready; one it
		// does not have yet gets a NetworkConflict Event instead).
		if _, err := networks.Create(t.Context(), network("mine", "10.78.0.0/24", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		env.WaitReady(t, ns, "mine", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
		_, err := deployments.Create(t.Context(), networkDeployment("mine", 1, auto), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "is not this Deployment's") {
			t.Errorf("a Deployment named like a user's Network: %v", err)
		}
	})
}

// A Deployment that admission did not see (here: in netop's own namespace,
// which no webhook sees) gets its Network all the same, and the
// controller lists it in the pod template, with an Event.
func TestDeploymentNetworkWithoutAdmission(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	d := networkDeployment("unadmitted", 1, map[string]string{samplecrd.DeploymentNetworkAnnotation: samplecrd.DeploymentNetworkAuto})
	created, err := env.Kube.AppsV1().Deployments(operatorNamespace).Create(t.Context(), d, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Kube.AppsV1().Deployments(operatorNamespace).Delete(context.Background(), d.Name, metav1.DeleteOptions{})
	})
	if got := created.Spec.Template.Annotations[netselect.NetworksAnnotation]; got != "" {
		t.Fatalf("admission saw it after all: %q", got)
	}
	n := ownNetwork(t, env, created)
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		got, err := env.Kube.AppsV1().Deployments(operatorNamespace).Get(ctx, d.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		a := got.Spec.Template.Annotations[netselect.NetworksAnnotation]
		return a == d.Name, fmt.Sprintf("pod template's %s = %q", netselect.NetworksAnnotation, a)
	})
	// Events are recorded asynchronously, after the write they tell of.
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(operatorNamespace).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.name": d.Name, "reason": deploynet.ReasonTemplateAttached}.String()})
		return err == nil && len(events.Items) > 0, fmt.Sprintf("no %s Event: %v", deploynet.ReasonTemplateAttached, err)
	})
	current, err := env.Kube.AppsV1().Deployments(operatorNamespace).Get(t.Context(), d.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podsJoin(t, env, current, n)
}
