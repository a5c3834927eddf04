package standalone

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cri"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/image"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	cnatv1alpha1 "github.com/netop-dev/netop/pkg/apis/cnat/v1alpha1"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

const testNodeName = "netop-test-node"

// The standalone's node, as a newcomer uses it: pods run from local images
// offline, logs, exec and port-forward work, a deleted pod goes, the tutorial's pod is
// injected and its own container runs, an image that is not local fails
// with the usual pull error. Ctrl-C leaves no process, container or mount
// behind; a restart brings the node and its pods back.
func TestNode(t *testing.T) {
	nettest.RequireRoot(t)
	if err := node.Check(); err != nil {
		t.Fatalf("this host cannot run a node: %v", err)
	}
	dataDir := t.TempDir()
	// An image of one's own, as `make image` writes netop's, served from
	// --image-archive under a registry nobody can reach.
	local, err := node.LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "mine.tar")
	if err := image.Write(archive, map[string]v1.Image{"netop.local/mine:1": local[node.BusyboxImage]}); err != nil {
		t.Fatal(err)
	}
	netns := nettest.NetnsName("netop-n-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(netns) })
	args := []string{"--data-dir", dataDir, "--netns", netns, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0",
		"--node=true", "--node-name=" + testNodeName, "--image-archive", archive}
	sa := startStandaloneWith(t, args...)
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)

	got, err := kube.CoreV1().Nodes().Get(t.Context(), testNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no node %s after the standalone printed KUBECONFIG: %v", testNodeName, err)
	}
	if !strings.HasPrefix(got.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") || !nodeReady(got) {
		t.Fatalf("node %s: runtime %q, conditions %+v", testNodeName, got.Status.NodeInfo.ContainerRuntimeVersion, got.Status.Conditions)
	}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := kube.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprintf("no default ServiceAccount: %v", err)
	})

	t.Run("kubectl run busybox, logs", func(t *testing.T) {
		// As `kubectl run hello --image=busybox --restart=Never -- sh -c 'echo hello'`
		// makes it: busybox means :latest, so the kubelet pulls it (from the
		// standalone's registry).
		runPod(t, kube, busyboxPod("hello", corev1.RestartPolicyNever, "echo hello"))
		waitPhase(t, kube, "hello", corev1.PodSucceeded)
		if logs := podLogs(t, kube, "hello"); logs != "hello\n" {
			t.Errorf("logs %q, want hello", logs)
		}
	})

	t.Run("an image from DATA_DIR/images", func(t *testing.T) {
		p := busyboxPod("mine", corev1.RestartPolicyNever, "echo mine")
		p.Spec.Containers[0].Image = "netop.local/mine:1"
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
		runPod(t, kube, p)
		waitPhase(t, kube, "mine", corev1.PodSucceeded)
		if logs := podLogs(t, kube, "mine"); logs != "mine\n" {
			t.Errorf("logs %q", logs)
		}
	})

	t.Run("the seed's At runs its command on the node", func(t *testing.T) {
		// examples/at.yaml as the seed has it: a schedule in 2019, no
		// command; it runs at once, `date -u` in busybox.
		var at cnatv1alpha1.At
		readYAML(t, "../../examples/at.yaml", &at)
		ats := versioned.NewForConfigOrDie(cfg).CnatV1alpha1().Ats("default")
		if _, err := ats.Create(t.Context(), &at, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var done *cnatv1alpha1.At
		testenv.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, string) {
			var err error
			if done, err = ats.Get(ctx, at.Name, metav1.GetOptions{}); err != nil {
				return false, err.Error()
			}
			return done.Status.Phase == cnatv1alpha1.PhaseDone, fmt.Sprintf("status %+v", done.Status)
		})
		if done.Status.Succeeded == nil || !*done.Status.Succeeded {
			t.Fatalf("DONE with %+v, want succeeded", done.Status)
		}
		logs := podLogs(t, kube, done.Status.Pod)
		if ran, err := time.Parse("Mon Jan _2 15:04:05 MST 2006", strings.TrimSpace(logs)); err != nil || time.Since(ran) > 10*time.Minute {
			t.Errorf("the command printed %q, want the time it ran (date -u)", logs)
		}
	})

	t.Run("exec", func(t *testing.T) {
		runPod(t, kube, busyboxPod("sleeper", corev1.RestartPolicyAlways, "sleep 3600"))
		waitRunning(t, kube, "sleeper", "c")
		if out := execIn(t, cfg, kube, "sleeper", "echo", "from-exec"); out != "from-exec\n" {
			t.Errorf("exec printed %q", out)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		runPod(t, kube, busyboxPod("web", corev1.RestartPolicyAlways, "mkdir -p /www && echo served > /www/index.html && exec httpd -f -p 8080 -h /www"))
		waitRunning(t, kube, "web", "c")
		if body := portForwardGet(t, cfg, "web", 8080, "/index.html"); body != "served\n" {
			t.Errorf("GET through port-forward: %q", body)
		}
	})

	t.Run("delete", func(t *testing.T) {
		// The kubelet stops the container and confirms; only then does the
		// pod go.
		if err := kube.CoreV1().Pods("default").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
			_, err := kube.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("pod web still there (%v)", err)
		})
	})

	t.Run("pods join example-network", func(t *testing.T) {
		nets := versioned.NewForConfigOrDie(cfg).SamplecrdV1().Networks("default")
		network := &samplecrdv1.Network{}
		readYAML(t, "../../examples/network.yaml", network)
		if _, err := nets.Create(t.Context(), network, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		usage := func(ctx context.Context) string {
			n, err := nets.Get(ctx, network.Name, metav1.GetOptions{})
			if err != nil || n.Status.Addresses == nil {
				return fmt.Sprintf("no usage (%v)", err)
			}
			return fmt.Sprintf("%d allocated, %s available", n.Status.Addresses.Allocated, n.Status.Addresses.Available)
		}
		addrs := map[string]string{}
		for _, name := range []string{"na", "nb"} {
			p := busyboxPod(name, corev1.RestartPolicyAlways, "sleep 3600")
			p.Annotations = map[string]string{netselect.NetworksAnnotation: network.Name}
			runPod(t, kube, p)
		}
		for _, name := range []string{"na", "nb"} {
			waitRunning(t, kube, name, "c")
			// net1, in 192.168.0.0/16, as the pod itself sees it.
			fields := strings.Fields(execIn(t, cfg, kube, name, "sh", "-c", "ip -4 -o addr show dev net1"))
			if len(fields) < 4 || !strings.HasPrefix(fields[3], "192.168.") || !strings.HasSuffix(fields[3], "/16") {
				t.Fatalf("pod %s: net1 has %q, want an address of 192.168.0.0/16", name, fields)
			}
			addrs[name] = strings.TrimSuffix(fields[3], "/16")
			pod, err := kube.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkNetworkStatus(t, cfg, kube, pod, network.Name, addrs[name])
		}
		if addrs["na"] == addrs["nb"] {
			t.Fatalf("both pods have %s", addrs["na"])
		}
		for from, to := range map[string]string{"na": addrs["nb"], "nb": addrs["na"]} {
			for _, target := range []string{to, network.Spec.Gateway} {
				execIn(t, cfg, kube, from, "ping", "-c", "1", "-W", "3", target) // fails the test unless it answers
			}
		}
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			got := usage(ctx)
			return got == "2 allocated, 65531 available", got
		})
		for _, name := range []string{"na", "nb"} {
			if err := kube.CoreV1().Pods("default").Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
			got := usage(ctx)
			return got == "0 allocated, 65533 available", got
		})
		testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
			left, _ := filepath.Glob(filepath.Join(dataDir, "node", "cni", "netop", "*.json"))
			return len(left) == 0, fmt.Sprintf("attachment records left: %v", left)
		})
	})

	t.Run("a pod joins a dual-stack Network", func(t *testing.T) {
		// A v2 Network with both families: net1 has an address of each,
		// and the bridge's gateways answer over IPv4 and IPv6.
		nets := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default")
		if _, err := nets.Create(t.Context(), &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "dual"},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.140.0.0/24", "fd00:140::/64"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := busyboxPod("dual", corev1.RestartPolicyAlways, "sleep 3600")
		p.Annotations = map[string]string{netselect.NetworksAnnotation: "dual"}
		runPod(t, kube, p)
		waitRunning(t, kube, "dual", "c")
		got := execIn(t, cfg, kube, "dual", "sh", "-c", "ip -o addr show dev net1 scope global")
		if !strings.Contains(got, "inet 10.140.0.") || !strings.Contains(got, "inet6 fd00:140::") {
			t.Errorf("pod dual: net1 has %q, want an address of 10.140.0.0/24 and one of fd00:140::/64", got)
		}
		execIn(t, cfg, kube, "dual", "ping", "-c", "1", "-W", "3", "10.140.0.1")
		execIn(t, cfg, kube, "dual", "ping", "-6", "-c", "1", "-W", "3", "fd00:140::1")
		checkRuntimeNamesNetns(t, kube, dataDir, "dual")
		if err := kube.CoreV1().Pods("default").Delete(t.Context(), "dual", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
			_, err := kube.CoreV1().Pods("default").Get(ctx, "dual", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("pod dual still there (%v)", err)
		})
		if err := nets.Delete(t.Context(), "dual", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Networks are boundaries", func(t *testing.T) { checkBoundaries(t, cfg, kube, netns) })

	t.Run("a Deployment's own Network", func(t *testing.T) {
		// As `kubectl create deployment`, annotated: its pod runs on the
		// node with net1 on the Network netop made for it.
		labels := map[string]string{"app": "own"}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "own", Annotations: map[string]string{samplecrd.DeploymentNetworkAnnotation: samplecrd.DeploymentNetworkAuto}},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: busyboxPod("", corev1.RestartPolicyAlways, "sleep 3600").Spec},
			},
		}
		if _, err := kube.AppsV1().Deployments("default").Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var pod string
		testenv.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, string) {
			pods, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=own"})
			if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
				return false, fmt.Sprintf("pods %v (%v)", pods, err)
			}
			pod = pods.Items[0].Name
			return true, ""
		})
		n, err := versioned.NewForConfigOrDie(cfg).SamplecrdV1().Networks("default").Get(t.Context(), "own", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cidr := netip.MustParsePrefix(n.Spec.CIDR)
		fields := strings.Fields(execIn(t, cfg, kube, pod, "sh", "-c", "ip -4 -o addr show dev net1"))
		if len(fields) < 4 || !cidr.Contains(netip.MustParsePrefix(fields[3]).Addr()) {
			t.Fatalf("pod %s: net1 has %q, want an address of the Deployment's Network %s", pod, fields, cidr)
		}
		execIn(t, cfg, kube, pod, "ping", "-c", "1", "-W", "3", n.Spec.Gateway)
		if err := kube.AppsV1().Deployments("default").Delete(t.Context(), "own", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the tutorial's pod, injected", func(t *testing.T) {
		// The sidecar template, and Envoy's configuration that it mounts.
		for _, example := range []string{"envoy-initializer.yaml", "envoy-config.yaml"} {
			cm := &corev1.ConfigMap{}
			readYAML(t, "../../examples/"+example, cm)
			if _, err := kube.CoreV1().ConfigMaps("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pod := &corev1.Pod{}
		readYAML(t, "../../examples/pod.yaml", pod)
		// The webhook reads the template from a cache: a dry run says when
		// it has it.
		testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
			dry, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil && len(dry.Spec.Containers) == 2, fmt.Sprintf("dry run: %v", err)
		})
		runPod(t, kube, pod)
		created, err := kube.CoreV1().Pods("default").Get(t.Context(), pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(created.Spec.Containers) != 2 || created.Spec.Containers[1].Name != "envoy" {
			t.Fatalf("the tutorial's pod was not injected: %d containers", len(created.Spec.Containers))
		}
		// Envoy's image is not local, so it cannot start offline; the
		// tutorial's own container runs.
		waitRunning(t, kube, pod.Name, pod.Spec.Containers[0].Name)
	})

	t.Run("an image that is not local fails to pull", func(t *testing.T) {
		p := busyboxPod("elsewhere", corev1.RestartPolicyNever, "true")
		p.Spec.Containers[0].Image = "registry.example.invalid/nothing:1"
		runPod(t, kube, p)
		testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
			got, err := kube.CoreV1().Pods("default").Get(ctx, "elsewhere", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, s := range got.Status.ContainerStatuses {
				if w := s.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("container statuses %+v", got.Status.ContainerStatuses)
		})
	})

	before := containerID(t, kube, "sleeper", "c")
	sa.stop(t)
	if left := leftovers(dataDir); len(left) > 0 {
		t.Errorf("after Ctrl-C, left behind:\n%s", strings.Join(left, "\n"))
	}
	for _, log := range []string{"kubelet.log", "containerd.log", "kube-scheduler.log"} {
		if fi, err := os.Stat(filepath.Join(dataDir, "logs", log)); err != nil || fi.Size() == 0 {
			t.Errorf("log %s missing or empty: %v", log, err)
		}
	}

	// The same data directory: the same node, its pods back.
	sa = startStandaloneWith(t, args...)
	defer sa.stop(t)
	// The status from before the stop says Running: wait for the
	// container this kubelet started.
	testenv.Eventually(t, 60*time.Second, func(context.Context) (bool, string) {
		id := containerID(t, kube, "sleeper", "c")
		return id != "" && id != before, "the sleeper's container is still " + before
	})
	waitRunning(t, kube, "sleeper", "c")
	if out := execIn(t, cfg, kube, "sleeper", "echo", "back"); out != "back\n" {
		t.Errorf("exec after the restart printed %q", out)
	}
	if logs := podLogs(t, kube, "hello"); logs != "hello\n" {
		t.Errorf("logs of a finished pod after the restart: %q", logs)
	}
}

// Where the node cannot run, the standalone says what is missing and how
// to install it, and runs without a node.
func TestNoNodeSaysWhatIsMissing(t *testing.T) {
	nettest.RequireRoot(t)
	netns := nettest.NetnsName("netop-n-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(netns) })
	empty := t.TempDir()
	t.Setenv("PATH", empty) // no containerd, no runc
	sa := startStandaloneWith(t, "--data-dir", t.TempDir(), "--netns", netns, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0", "--node=true")
	defer sa.stop(t)
	stderr := sa.stderr.String()
	for _, want := range []string{"Running without a node", "containerd (Debian package containerd)", "runc (Debian package runc)", "apt-get install -y containerd runc"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
	kube := kubernetes.NewForConfigOrDie(restConfig(t, sa.kubeconfig))
	nodes, err := kube.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 0 {
		t.Errorf("nodes %v (%v), want none", nodes, err)
	}
}

func restConfig(t *testing.T, kubeconfig string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// Polls every 20 ms: client-go's default 5 QPS would throttle them.
	cfg.QPS, cfg.Burst = 100, 200
	return cfg
}

// containerID is the ID of the running container of pod name, or "".
func containerID(t *testing.T, kube kubernetes.Interface, name, container string) string {
	t.Helper()
	got, err := kube.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range got.Status.ContainerStatuses {
		if s.Name == container && s.State.Running != nil {
			return s.ContainerID
		}
	}
	return ""
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func busyboxPod(name string, restart corev1.RestartPolicy, script string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{RestartPolicy: restart, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "c", Image: "busybox", Command: []string{"sh", "-c", script}}}}}
}

func runPod(t *testing.T, kube kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	if _, err := kube.CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
}

func waitPhase(t *testing.T, kube kubernetes.Interface, name string, phase corev1.PodPhase) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		got, err := kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == phase, fmt.Sprintf("pod %s is %s, want %s: %+v", name, got.Status.Phase, phase, got.Status.ContainerStatuses)
	})
}

// waitRunning waits until container of pod name runs.
func waitRunning(t *testing.T, kube kubernetes.Interface, name, container string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		got, err := kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, s := range got.Status.ContainerStatuses {
			if s.Name == container && s.State.Running != nil && s.Ready {
				return true, ""
			}
		}
		return false, fmt.Sprintf("pod %s: %s %+v", name, got.Status.Phase, got.Status.ContainerStatuses)
	})
}

func podLogs(t *testing.T, kube kubernetes.Interface, name string) string {
	t.Helper()
	data, err := kube.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	return string(data)
}

func execIn(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, pod string, command ...string) string {
	t.Helper()
	return execInNamespace(t, cfg, kube, "default", pod, command...)
}

func execInNamespace(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, namespace, pod string, command ...string) string {
	t.Helper()
	out, errOut, code := execCodeIn(t, cfg, kube, namespace, pod, command...)
	if code != 0 {
		t.Fatalf("exec %v in %s: exit %d (stderr %q)", command, pod, code, errOut)
	}
	return out
}

// portForwardGet forwards a local port to port of pod and GETs path.
func portForwardGet(t *testing.T, cfg *rest.Config, pod string, port int, path string) string {
	t.Helper()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := kubernetes.NewForConfigOrDie(cfg).CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 1)
	go func() { errs <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errs:
		t.Fatalf("port-forward: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("port-forward not ready within 30s")
	}
	ports, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", ports[0].Local, path))
	if err != nil {
		t.Fatalf("GET through port-forward: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// leftovers lists what the node left running or mounted: processes that
// name the data directory or live in the node's cgroup, and mounts under
// the data directory.
func leftovers(dataDir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		cgroup, _ := os.ReadFile(filepath.Join(p, "cgroup"))
		if bytes.Contains(cmdline, []byte(dataDir)) || bytes.Contains(cgroup, []byte("/netop-"+testNodeName+"-")) {
			out = append(out, fmt.Sprintf("process %s: %s", filepath.Base(p), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
	}
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], dataDir) {
			out = append(out, "mount "+fields[4])
		}
	}
	return out
}

// startWithNode starts the standalone with its real node, in a data
// directory and a backend namespace of the test's own. The caller defers
// stop once its pods are gone: it stops the standalone as a user does
// (Ctrl-C) and checks that nothing of the node stays behind (the cleanup
// of a test that failed kills it instead).
func startWithNode(t *testing.T) (sa *standalone, dataDir string, stop func()) {
	t.Helper()
	nettest.RequireRoot(t)
	if err := node.Check(); err != nil {
		t.Fatalf("this host cannot run a node: %v", err)
	}
	dataDir = t.TempDir()
	backendNetns := nettest.NetnsName("netop-n-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(backendNetns) })
	sa = startStandaloneWith(t, "--data-dir", dataDir, "--netns", backendNetns, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0",
		"--node=true", "--node-name="+testNodeName)
	sa.netns = backendNetns
	return sa, dataDir, func() {
		sa.stop(t)
		if left := leftovers(dataDir); len(left) > 0 {
			t.Errorf("after Ctrl-C, left behind:\n%s", strings.Join(left, "\n"))
		}
	}
}

// deletePods deletes every pod of namespaces at once and waits until
// they are gone.
func deletePods(t *testing.T, kube kubernetes.Interface, namespaces ...string) {
	t.Helper()
	ctx := context.Background()
	for _, ns := range namespaces {
		_ = kube.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
	}
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		left := 0
		for _, ns := range namespaces {
			list, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			left += len(list.Items)
		}
		return left == 0, fmt.Sprintf("%d pods left", left)
	})
}

// checkNetworkStatus checks pod's k8s.v1.cni.cncf.io/network-status
// against the Network Plumbing Working Group's multi-network
// specification, as Multus writes it: the default interface first (eth0,
// "default": true, the pod's own addresses and eth0's MAC, named after
// the pod network's configuration), then net1 on Network default/network
// with addr; every entry with name, interface, ips, mac and dns.
func checkNetworkStatus(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, pod *corev1.Pod, network, addr string) {
	t.Helper()
	// Written by the CNI plugin once it attached net1: an instant after
	// the pod ran, perhaps.
	var raw string
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		got, err := kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod, raw = got, got.Annotations[netselect.StatusAnnotation]
		return strings.Contains(raw, `"default": true`), "network-status without the default interface: " + raw
	})
	var entries []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &entries); err != nil || len(entries) != 2 {
		t.Fatalf("pod %s: network-status %s (%v), want two entries", pod.Name, raw, err)
	}
	type entry struct {
		Name, Interface, Mac string
		IPs                  []string
		Default              bool
		DNS                  *struct{ Nameservers []string }
	}
	var got []entry
	for i, e := range entries {
		for _, field := range []string{"name", "interface", "ips", "mac", "dns"} {
			if _, ok := e[field]; !ok {
				t.Errorf("pod %s: network-status entry %d has no %q: %s", pod.Name, i, field, raw)
			}
		}
		data, _ := json.Marshal(e)
		var parsed entry
		if err := json.Unmarshal(data, &parsed); err != nil {
			t.Fatal(err)
		}
		got = append(got, parsed)
	}
	var podIPs []string
	for _, ip := range pod.Status.PodIPs {
		podIPs = append(podIPs, ip.IP)
	}
	eth0 := strings.TrimSpace(execIn(t, cfg, kube, pod.Name, "cat", "/sys/class/net/eth0/address"))
	if d := got[0]; d.Name != "netop-pods" || d.Interface != "eth0" || !d.Default || !slices.Equal(d.IPs, podIPs) || d.Mac != eth0 {
		t.Errorf("pod %s: network-status's default entry %+v, want eth0 of netop-pods, default, with %v and MAC %s", pod.Name, d, podIPs, eth0)
	}
	net1 := strings.TrimSpace(execIn(t, cfg, kube, pod.Name, "cat", "/sys/class/net/net1/address"))
	if n := got[1]; n.Name != "default/"+network || n.Interface != "net1" || n.Default || !slices.Equal(n.IPs, []string{addr}) || n.Mac != net1 {
		t.Errorf("pod %s: network-status's second entry %+v, want net1 on default/%s with %s and MAC %s", pod.Name, n, network, addr, net1)
	}
}

// checkRuntimeNamesNetns checks that the node's runtime, asked through
// the CRI as hot-plug asks it, names the sandbox and network namespace the
// CNI plugin attached the running pod's Networks for and in (the plugin's
// record's key and namespace), and no sandbox for a pod that does not run.
func checkRuntimeNamesNetns(t *testing.T, kube kubernetes.Interface, dataDir, pod string) {
	t.Helper()
	p, err := kube.CoreV1().Pods("default").Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var attached cni.Record
	records, _ := filepath.Glob(filepath.Join(dataDir, "node", "cni", "netop", "*.json"))
	for _, path := range records {
		var r cni.Record
		if data, err := os.ReadFile(path); err == nil && json.Unmarshal(data, &r) == nil && r.Pod == "default/"+pod {
			attached = r
		}
	}
	rt, err := cri.Dial(node.ContainerdSocket(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.Close() }()
	got, err := rt.PodSandbox(t.Context(), string(p.UID))
	if err != nil || got.Netns == "" || got.Netns != attached.Netns || got.ID != attached.ContainerID {
		t.Errorf("the runtime names pod %s's sandbox %+v (%v); the CNI plugin attached it in %q, as container %q", pod, got, err, attached.Netns, attached.ContainerID)
	}
	if _, err := rt.PodSandbox(t.Context(), "no-such-pod"); !errors.Is(err, cri.ErrNoSandbox) {
		t.Errorf("a pod that does not run: %v, want %v", err, cri.ErrNoSandbox)
	}
}
