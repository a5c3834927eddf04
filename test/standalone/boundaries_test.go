package standalone

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/tenancy"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// nodeServicePort is where a service of the node listens, in the
// namespace of the Networks' bridges, on every address (the gateways').
const nodeServicePort = "10299"

// Issue 33 on the real node: a pod of another namespace is refused at
// admission; a privileged pod on Network B that routes to Network A via
// its gateway gets no reply, and opens no connection to a service of the
// node through its gateway, while it still pings its gateway; the rules,
// flushed by hand, come back and hold again.
func checkBoundaries(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, backendNetns string) {
	ctx := t.Context()
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default")
	for name, cidr := range map[string]string{"neta": "10.171.0.0/24", "netb": "10.172.0.0/24"} {
		if _, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{cidr}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-b"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		p := busyboxPod("foreign", corev1.RestartPolicyAlways, "sleep 3600")
		p.Annotations = map[string]string{netselect.NetworksAnnotation: "default/neta"}
		_, err := kube.CoreV1().Pods("tenant-b").Create(ctx, p, metav1.CreateOptions{})
		return err != nil && strings.Contains(err.Error(), "pods of namespace tenant-b may not join Network default/neta: the Network admits pods of its own namespace only"),
			fmt.Sprintf("a pod of tenant-b naming default/neta: %v", err)
	})

	// Where admission does not look (kube-system, as everywhere with the
	// webhooks off), the allocation controller refuses: no address, a
	// Warning Event, and the kubelet's sandbox fails with the reason.
	unchecked := busyboxPod("unchecked", corev1.RestartPolicyAlways, "sleep 3600")
	unchecked.Annotations = map[string]string{netselect.NetworksAnnotation: "default/neta"}
	if _, err := kube.CoreV1().Pods("kube-system").Create(ctx, unchecked, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	why := "pods of namespace kube-system may not join Network default/neta: the Network admits pods of its own namespace only"
	for _, want := range []struct{ reason, message string }{
		{tenancy.Reason, why},
		{"FailedCreatePodSandBox", "netop refuses its Networks: " + why},
	} {
		testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
			events, err := kube.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=unchecked"})
			if err != nil {
				return false, err.Error()
			}
			var seen []string
			for _, e := range events.Items {
				if e.Reason == want.reason && strings.Contains(e.Message, want.message) {
					return true, ""
				}
				seen = append(seen, e.Reason+": "+e.Message)
			}
			return false, fmt.Sprintf("no %s Event saying %q; seen %q", want.reason, want.message, seen)
		})
	}
	if p, err := kube.CoreV1().Pods("kube-system").Get(ctx, "unchecked", metav1.GetOptions{}); err != nil || p.Annotations[netselect.AllocationsAnnotation] != "" {
		t.Errorf("the unchecked pod: allocations %q (%v), want none", p.Annotations[netselect.AllocationsAnnotation], err)
	}
	if err := kube.CoreV1().Pods("kube-system").Delete(ctx, "unchecked", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}

	a := busyboxPod("a1", corev1.RestartPolicyAlways, "sleep 3600")
	a.Annotations = map[string]string{netselect.NetworksAnnotation: "neta"}
	b := busyboxPod("b1", corev1.RestartPolicyAlways, "sleep 3600")
	b.Annotations = map[string]string{netselect.NetworksAnnotation: "netb"}
	b.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: new(bool)}
	*b.Spec.Containers[0].SecurityContext.Privileged = true
	runPod(t, kube, a)
	runPod(t, kube, b)
	waitRunning(t, kube, "a1", "c")
	waitRunning(t, kube, "b1", "c")
	fields := strings.Fields(execIn(t, cfg, kube, "a1", "sh", "-c", "ip -4 -o addr show dev net1"))
	if len(fields) < 4 {
		t.Fatalf("pod a1: net1 has %q", fields)
	}
	addrA := strings.Split(fields[3], "/")[0]
	execIn(t, cfg, kube, "b1", "ip", "route", "add", "10.171.0.0/24", "via", "10.172.0.1", "dev", "net1")

	// A service of the node, listening on every address of the bridges'
	// namespace, the gateways' among them: only the rules keep pods from
	// it.
	listener := exec.Command("ip", "netns", "exec", backendNetns, "busybox", "nc", "-ll", "-p", nodeServicePort, "-e", "true")
	if err := listener.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listener.Process.Kill(); _ = listener.Wait() })

	exitOf := func(pod, command string) string { return exitCode(t, cfg, kube, pod, command) }
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", backendNetns, "busybox", "netstat", "-ltn").CombinedOutput()
		return err == nil && strings.Contains(string(out), ":"+nodeServicePort+" "), fmt.Sprintf("the node's service is not listening: %v %s", err, out)
	})
	check := func(when string) {
		t.Helper()
		if got := exitOf("b1", "ping -c 1 -W 3 10.172.0.1"); got != "0" {
			t.Errorf("%s: b1 pinging its gateway exited %s", when, got)
		}
		if got := exitOf("b1", "ping -c 2 -W 1 "+addrA); got == "0" {
			t.Errorf("%s: b1 on netb reached a1 (%s) on neta through its gateway", when, addrA)
		}
		if got := exitOf("b1", "nc -w 2 10.172.0.1 "+nodeServicePort); got == "0" {
			t.Errorf("%s: b1 opened a connection to the node's port %s through its gateway", when, nodeServicePort)
		}
	}
	check("isolated")

	// Flushed by hand: repaired by the drift watch.
	conn, release, err := linux.NFTablesIn(backendNetns)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: linux.IsolationTable}
	conn.FlushTable(table)
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		rules, err := conn.GetRules(table, &nftables.Chain{Name: "forward", Table: table})
		return err == nil && len(rules) > 0, fmt.Sprintf("the forward chain has %d rules (%v)", len(rules), err)
	})
	check("after the table was flushed")
	for _, name := range []string{"a1", "b1"} {
		if err := kube.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// exitCode runs command in pod through sh and returns its exit status.
func exitCode(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, pod, command string) string {
	t.Helper()
	return strings.TrimSpace(execIn(t, cfg, kube, pod, "sh", "-c", command+" </dev/null >/dev/null 2>&1; echo $?"))
}

// Across nodes (issue 33): a privileged pod of another Network on node,
// routing to the cidr of spans (whose pods are on-1, on node 1, and on-3,
// on node) through its own gateway, reaches neither: not the pod on its
// node, not the one across the overlay. It still pings its gateway.
func checkOverlayIsolation(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, node, spansCIDR string, spans map[string]string) {
	t.Helper()
	ctx := t.Context()
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default")
	if _, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "walled"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.152.0.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := busyboxPod("walled", corev1.RestartPolicyAlways, "sleep 3600")
	p.Spec.NodeName = node
	p.Annotations = map[string]string{netselect.NetworksAnnotation: "walled"}
	privileged := true
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
	runPod(t, kube, p)
	waitRunning(t, kube, "walled", "c")
	execIn(t, cfg, kube, "walled", "ip", "route", "add", spansCIDR, "via", "10.152.0.1", "dev", "net1")
	// The node forwards, as a node with pods does (else the check below
	// would hold without any rule); the namespace is named after the node.
	if out, err := exec.Command("ip", "netns", "exec", node, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward").CombinedOutput(); err != nil {
		t.Fatalf("turning forwarding on in %s: %v %s", node, err, out)
	}
	if got := exitCode(t, cfg, kube, "walled", "ping -c 1 -W 3 10.152.0.1"); got != "0" {
		t.Errorf("the walled pod pinging its gateway exited %s", got)
	}
	for pod, addr := range spans {
		if got := exitCode(t, cfg, kube, "walled", "ping -c 2 -W 1 "+addr); got == "0" {
			t.Errorf("the walled pod on %s reached %s (%s) on another Network through its gateway", node, pod, addr)
		}
	}
	if err := kube.CoreV1().Pods("default").Delete(ctx, "walled", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}

// The token the kubelet gives the agent on node (bound to its pod, so the
// API server adds the pod's node to it) writes node's NetworkNode and no
// other's (config/policy/agent_node.yaml).
func checkAgentTokens(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, node, other string) {
	t.Helper()
	ctx := t.Context()
	agents, err := kube.CoreV1().Pods("netop-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent",
		FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(agents.Items) != 1 {
		t.Fatalf("agent of %s: %v %v", node, agents, err)
	}
	agent := agents.Items[0]
	token, err := kube.CoreV1().ServiceAccounts("netop-system").CreateToken(ctx, agent.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agent.Name, UID: agent.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	asAgent := rest.AnonymousClientConfig(cfg)
	asAgent.BearerToken = token.Status.Token
	reports := versioned.NewForConfigOrDie(asAgent).NetopV1alpha1().NetworkNodes()
	mine, err := reports.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agent reading its NetworkNode: %v", err)
	}
	// Dry runs: admission, the policy among it, answers them as any
	// write, and the agent's own report is left as it keeps it.
	dryRun := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := reports.UpdateStatus(ctx, mine, dryRun); err != nil {
		t.Errorf("the agent of %s writing its own NetworkNode: %v", node, err)
	}
	theirs, err := reports.Get(ctx, other, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agent reading another NetworkNode: %v", err)
	}
	_, err = reports.UpdateStatus(ctx, theirs, dryRun)
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "the agent of node "+node+" may write only its own NetworkNode, not "+other) {
		t.Errorf("the agent of %s writing %s's NetworkNode: %v, want Forbidden with the reason", node, other, err)
	}
}
