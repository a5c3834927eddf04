package standalone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// The standalone is a whole cluster, as a newcomer tries it after the
// README's walk: `kubectl create deployment web --image=busybox -- httpd`,
// `kubectl expose`, and from another pod `wget` by ClusterIP and by name;
// the endpoint follows the pod when it is replaced, the NodePort answers
// from the host, `nslookup kubernetes.default` answers, no pod gets a
// MissingClusterDNS Event, the busybox applets people reach for work;
// Ctrl-C leaves no table or underlay behind, and a restart on the same
// data directory serves the Service by name again.
func TestServicesAndDNS(t *testing.T) {
	nettest.RequireRoot(t)
	if err := node.Check(); err != nil {
		t.Fatalf("this host cannot run a node: %v", err)
	}
	dataDir := t.TempDir()
	backendNetns := nettest.NetnsName("netop-s-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(backendNetns) })
	args := []string{"--data-dir", dataDir, "--netns", backendNetns, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0",
		"--node=true", "--node-name=" + testNodeName}
	sa := startStandaloneWith(t, args...)
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)
	waitDefaultServiceAccount(t, kube)

	web := webDeployment("web", 1)
	if _, err := kube.AppsV1().Deployments("default").Create(t.Context(), web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, Selector: web.Spec.Selector.MatchLabels,
		Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}}
	svc, err := kube.CoreV1().Services("default").Create(t.Context(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	runPod(t, kube, busyboxPod("client", corev1.RestartPolicyNever, "sleep 3600"))
	waitRunning(t, kube, "client", "c")
	first := waitWebPod(t, kube, "")

	t.Run("wget by ClusterIP and by name", func(t *testing.T) {
		for _, url := range []string{"http://" + svc.Spec.ClusterIP + "/", "http://web.default.svc.cluster.local/", "http://web/"} {
			if page := execIn(t, cfg, kube, "client", "wget", "-q", "-T", "5", "-O-", url); page != "hello from "+first+"\n" {
				t.Errorf("wget %s: %q, want the page of %s", url, page, first)
			}
		}
	})

	t.Run("nslookup kubernetes.default", func(t *testing.T) {
		out := execIn(t, cfg, kube, "client", "nslookup", "kubernetes.default")
		if !strings.Contains(out, "Name:\tkubernetes.default\nAddress: 10.0.0.1\n") {
			t.Errorf("nslookup kubernetes.default:\n%s", out)
		}
		// A name outside the cluster is the host's resolvers' to answer:
		// not the Service's, and it fails fast offline.
		if out, _, _ := execCode(t, cfg, kube, "client", "nslookup", "web.example"); strings.Contains(out, svc.Spec.ClusterIP) {
			t.Errorf("nslookup web.example answered with the Service:\n%s", out)
		}
	})

	t.Run("NodePort from the host", func(t *testing.T) {
		n, err := kube.CoreV1().Nodes().Get(t.Context(), testNodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ip string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		url := "http://" + net.JoinHostPort(ip, strconv.Itoa(int(svc.Spec.Ports[0].NodePort))) + "/"
		if page := httpGet(t, url); page != "hello from "+first+"\n" {
			t.Errorf("GET %s from the host: %q", url, page)
		}
	})

	t.Run("busybox applets", func(t *testing.T) {
		pod, err := kube.CoreV1().Pods("default").Get(t.Context(), first, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, command := range [][]string{
			{"sh", "-c", "echo $((6*7)) | grep -qx 42"},
			{"ip", "-4", "addr", "show", "eth0"},
			{"ip", "route"},
			{"ping", "-c", "1", "-W", "5", pod.Status.PodIP},
			{"sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 web 80 | grep -q 'hello from'"},
			{"wget", "-q", "-T", "5", "--spider", "http://web/"},
			{"nslookup", "web.default.svc.cluster.local"},
			// httpd serves: the web pods run it.
			{"sh", "-c", "wget -q -T 5 -O- http://" + pod.Status.PodIP + ":8080/ | grep -q 'hello from'"},
		} {
			if out, stderr, code := execCode(t, cfg, kube, "client", command...); code != 0 {
				t.Errorf("%v exited %d:\n%s%s", command, code, out, stderr)
			}
		}
	})

	t.Run("the endpoint follows the pod", func(t *testing.T) {
		if err := kube.CoreV1().Pods("default").Delete(t.Context(), first, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		second := waitWebPod(t, kube, first)
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			page, _, code := execCode(t, cfg, kube, "client", "wget", "-q", "-T", "2", "-O-", "http://web/")
			return code == 0 && page == "hello from "+second+"\n", fmt.Sprintf("wget http://web/: %q (exit %d), want the page of %s", page, code, second)
		})
	})

	t.Run("no MissingClusterDNS", func(t *testing.T) {
		events, err := kube.CoreV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "reason=MissingClusterDNS"})
		if err != nil {
			t.Fatal(err)
		}
		if len(events.Items) > 0 {
			t.Errorf("MissingClusterDNS: %s", events.Items[0].Message)
		}
	})

	// Ctrl-C with the web pods running: the node stops them.
	sa.stop(t)
	if left := leftovers(dataDir); len(left) > 0 {
		t.Errorf("after Ctrl-C, left behind:\n%s", strings.Join(left, "\n"))
	}
	if left := netfilterTables(t, backendNetns); len(left) > 0 {
		t.Errorf("after Ctrl-C, tables left in the node's namespace: %v", left)
	}
	if left := underlays(t, backendNetns); len(left) > 0 {
		t.Errorf("after Ctrl-C, the underlay stays: %v", left)
	}

	// The same data directory again: the Service by name, from a new pod.
	sa = startStandaloneWith(t, args...)
	defer sa.stop(t)
	defer deleteWeb(t, kube)
	waitWebPod(t, kube, "")
	runPod(t, kube, busyboxPod("again", corev1.RestartPolicyNever, "sleep 3600"))
	waitRunning(t, kube, "again", "c")
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		page, stderr, code := execCode(t, cfg, kube, "again", "wget", "-q", "-T", "2", "-O-", "http://web.default.svc.cluster.local/")
		return code == 0 && strings.HasPrefix(page, "hello from web-"), fmt.Sprintf("after a restart, wget by name: %q %q (exit %d)", page, stderr, code)
	})
}

// deleteWeb deletes the web Deployment and every pod of the default
// namespace, and waits until they are gone.
func deleteWeb(t *testing.T, kube kubernetes.Interface) {
	t.Helper()
	if err := kube.AppsV1().Deployments("default").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting the web Deployment: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		rs, err := kube.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		return err == nil && len(rs.Items) == 0, fmt.Sprintf("ReplicaSets of web left: %v", err)
	})
	deletePods(t, kube, "default")
}

// webDeployment is `kubectl create deployment NAME --image=busybox --
// httpd`, with a page that names the pod that serves it.
func webDeployment(name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64), Containers: []corev1.Container{{
					Name: "httpd", Image: "busybox",
					Command: []string{"sh", "-c", "mkdir -p /www && echo \"hello from $(hostname)\" > /www/index.html && exec httpd -f -p 8080 -h /www"},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
						PeriodSeconds: 1},
				}}},
			},
		},
	}
}

// waitWebPod waits for a ready pod of the web Deployment other than not,
// and returns its name.
func waitWebPod(t *testing.T, kube kubernetes.Interface, not string) string {
	t.Helper()
	var name string
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		pods, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Name != not && p.DeletionTimestamp == nil && podReady(&p) {
				name = p.Name
				return true, ""
			}
		}
		return false, fmt.Sprintf("no ready web pod but %q among %d", not, len(pods.Items))
	})
	return name
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitDefaultServiceAccount(t *testing.T, kube kubernetes.Interface) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := kube.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprintf("no default ServiceAccount: %v", err)
	})
}

// execCode runs command in pod and returns its output and exit code, a
// non-zero exit being an outcome, not a failure of the test.
func execCode(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, pod string, command ...string) (stdout, stderr string, code int) {
	t.Helper()
	return execCodeIn(t, cfg, kube, "default", pod, command...)
}

// execCodeIn is execCode in a pod of namespace.
func execCodeIn(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, namespace, pod string, command ...string) (stdout, stderr string, code int) {
	t.Helper()
	stdout, stderr, code, err := tryExec(t.Context(), cfg, kube, namespace, pod, command...)
	if err != nil {
		t.Fatalf("exec %v in %s: %v (stderr %q)", command, pod, err, stderr)
	}
	return stdout, stderr, code
}

// tryExec runs command in pod: its output and exit code, or why it could
// not run it.
func tryExec(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, namespace, pod string, command ...string) (stdout, stderr string, code int, err error) {
	req := kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: command, Stdout: true, Stderr: true}, clientgoscheme.ParameterCodec)
	exec, err := remotecommand.NewSPDYExecutor(cfg, http.MethodPost, req.URL())
	if err != nil {
		return "", "", -1, err
	}
	var out, errOut bytes.Buffer
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	var exit interface{ ExitStatus() int }
	switch {
	case err == nil:
		return out.String(), errOut.String(), 0, nil
	case errors.As(err, &exit):
		return out.String(), errOut.String(), exit.ExitStatus(), nil
	default:
		return out.String(), errOut.String(), -1, err
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// netfilterTables lists the ip and ip6 tables in the named namespace:
// the node's components' (kube-proxy, the kubelet's iptables chains).
func netfilterTables(t *testing.T, name string) []string {
	t.Helper()
	conn, release, err := linux.NFTablesIn(name)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	tables, err := conn.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range tables {
		if tb.Family == nftables.TableFamilyIPv4 || tb.Family == nftables.TableFamilyIPv6 {
			out = append(out, tb.Name)
		}
	}
	return out
}

// underlays lists the host's links whose alias names the nodes' namespace.
func underlays(t *testing.T, netnsName string) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasSuffix(l.Attrs().Alias, " "+netnsName) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// checkServiceAcrossNodes checks that a Service whose pods run on the first
// two nodes answers, from both, a pod on the third: kube-proxy on that node
// sends its traffic across the underlay.
func checkServiceAcrossNodes(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, nodes []string) {
	t.Helper()
	waitDefaultServiceAccount(t, kube)
	template := webDeployment("web", 1).Spec.Template
	var pods []string
	for i, n := range nodes[:2] {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%d", i+1), Labels: template.Labels}, Spec: *template.Spec.DeepCopy()}
		p.Spec.NodeName = n
		runPod(t, kube, p)
		pods = append(pods, p.Name)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{
		Selector: template.Labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}}
	if _, err := kube.CoreV1().Services("default").Create(t.Context(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := busyboxPod("client", corev1.RestartPolicyNever, "sleep 3600")
	client.Spec.NodeName = nodes[2]
	runPod(t, kube, client)
	waitRunning(t, kube, "client", "c")
	seen := map[string]bool{}
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		page, stderr, code := execCode(t, cfg, kube, "client", "wget", "-q", "-T", "2", "-O-", "http://web.default.svc.cluster.local/")
		if code == 0 {
			seen[strings.TrimSpace(strings.TrimPrefix(page, "hello from "))] = true
		}
		return seen[pods[0]] && seen[pods[1]], fmt.Sprintf("from %s, the Service answered from %v (last: %q %q, exit %d), want both of %v", nodes[2], seen, page, stderr, code, pods)
	})
	for _, name := range append(pods, "client") {
		_ = kube.CoreV1().Pods("default").Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	_ = kube.CoreV1().Services("default").Delete(t.Context(), "web", metav1.DeleteOptions{})
}
