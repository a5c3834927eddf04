// Package standalone tests the netop-standalone command as the process a
// user runs: started, stopped with Ctrl-C, killed with SIGKILL and started
// again on the same data directory. TestMain builds the command once; every
// test runs that binary.
package standalone

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netop-dev/netop/internal/testing/nettest"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// klogLine is the header of a klog text line.
var klogLine = regexp.MustCompile(`^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [a-z_]+\.go:\d+\] `)

// binary is the netop-standalone that TestMain built.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "netop-standalone-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary, err = build(dir)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// build builds netop-standalone into dir with the go command that runs the
// tests: go test puts its own GOROOT/bin first in PATH, so that the binary
// is built by the same toolchain, with the same build cache.
func build(dir string) (string, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build netop-standalone: no go command in PATH (go test puts it there; for a compiled test binary add $(go env GOROOT)/bin to PATH): %w", err)
	}
	out := filepath.Join(dir, "netop-standalone")
	// By import path, so that it builds whatever the working directory
	// inside the module.
	cmd := exec.Command(goCmd, "build", "-o", out, "github.com/netop-dev/netop/cmd/netop-standalone")
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build netop-standalone with %s: %w\n%s", goCmd, err, output)
	}
	return out, nil
}

type standalone struct {
	cmd        *exec.Cmd
	kubeconfig string
	stderr     *strings.Builder
	// netns is the backend's network namespace, where known.
	netns string
	// args start it again.
	args []string
}

// startStandalone runs netop-standalone on dataDir and waits for the line
// that gives the kubeconfig.
func startStandalone(t *testing.T, dataDir string) *standalone {
	t.Helper()
	nettest.RequireRoot(t)
	netns := nettest.NetnsName("netop-r-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(netns) })
	return startStandaloneWith(t, "--data-dir", dataDir, "--netns", netns, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0")
}

// startStandaloneWith runs netop-standalone with args and waits for the line
// that gives the kubeconfig.
// The operator's tests need no node, and run without one unless args say
// --node (node_test.go).
func startStandaloneWith(t *testing.T, args ...string) *standalone {
	t.Helper()
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--node=") }) {
		args = append(args, "--node=false")
	}
	cmd := exec.Command(binary, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &standalone{cmd: cmd, stderr: &strings.Builder{}, args: args}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", binary, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			// A test that failed before stopping it: Ctrl-C first, so that
			// its node stops its pods (a killed node leaves its containers
			// running, holding its namespaces, underlay and pod routes,
			// which the next test's standalone then cannot have), then
			// SIGKILL if it does not exit within a minute.
			_ = cmd.Process.Signal(syscall.SIGINT)
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			select {
			case <-exited:
				return
			case <-time.After(time.Minute):
			}
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	deadline := time.After(90 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("netop-standalone exited before printing KUBECONFIG; stderr:\n%s%s", s.stderr, nodeErrors(args))
			}
			if _, path, found := strings.Cut(line, "KUBECONFIG="); found {
				s.kubeconfig = path
				return s
			}
		case <-deadline:
			t.Fatalf("no KUBECONFIG line within 90s; stderr:\n%s", s.stderr)
		}
	}
}

// stop sends Ctrl-C and waits for a clean exit.
func (s *standalone) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("netop-standalone did not exit cleanly on SIGINT: %v; stderr:\n%s", err, s.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("netop-standalone did not stop within 60s of SIGINT")
	}
}

func client(t *testing.T, kubeconfig string) versioned.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return versioned.NewForConfigOrDie(cfg)
}

// A Network created before a restart is there after it, and the kubeconfig
// written by the first start still works.
func TestRestartKeepsObjectsAndKubeconfig(t *testing.T) {
	dataDir := t.TempDir()
	first := startStandalone(t, dataDir)
	if want := filepath.Join(dataDir, "kubeconfig"); first.kubeconfig != want {
		t.Fatalf("KUBECONFIG=%s, want %s", first.kubeconfig, want)
	}
	nets := client(t, first.kubeconfig).SamplecrdV1().Networks("default")
	created, err := nets.Create(context.Background(), &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Name: "example-network"},
		Spec:       samplecrdv1.NetworkSpec{CIDR: "192.168.0.0/16", Gateway: "192.168.0.1"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	first.stop(t)

	// The Kubernetes components log to files, not to the terminal: every
	// line there is netop's own (klog's header, netop's source files), none
	// a component's (etcd's client logs JSON through zap).
	for _, line := range strings.Split(strings.TrimSpace(first.stderr.String()), "\n") {
		if strings.HasPrefix(line, "{") || strings.Contains(line, "kube-apiserver") || !klogLine.MatchString(line) {
			t.Errorf("component log leaked to stderr: %s", line)
		}
	}
	for _, name := range []string{"kube-apiserver.log", "kube-controller-manager.log", "etcd.log"} {
		if fi, err := os.Stat(filepath.Join(dataDir, "logs", name)); err != nil || fi.Size() == 0 {
			t.Errorf("log file %s missing or empty: %v", name, err)
		}
	}

	second := startStandalone(t, dataDir)
	got, err := client(t, first.kubeconfig).SamplecrdV1().Networks("default").Get(context.Background(), "example-network", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after restart, with the first kubeconfig: %v", err)
	}
	if got.UID != created.UID {
		t.Fatalf("after restart the Network has UID %s, want %s", got.UID, created.UID)
	}
	second.stop(t)
}

// nodeErrors are the error lines of the node components' logs in the data
// directory args name: why a node stopped while starting, which the
// test's temporary directory would otherwise take away.
func nodeErrors(args []string) string {
	i := slices.Index(args, "--data-dir")
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	logs, _ := filepath.Glob(filepath.Join(args[i+1], "logs", "*.log"))
	more, _ := filepath.Glob(filepath.Join(args[i+1], "nodes", "*", "logs", "*.log"))
	var out strings.Builder
	for _, path := range append(logs, more...) {
		data, _ := os.ReadFile(path)
		var errs []string
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "E") || strings.HasPrefix(line, "F") {
				errs = append(errs, line)
			}
		}
		if len(errs) > 10 {
			errs = errs[len(errs)-10:]
		}
		if len(errs) > 0 {
			fmt.Fprintf(&out, "%s:\n%s\n", path, strings.Join(errs, "\n"))
		}
	}
	return out.String()
}
