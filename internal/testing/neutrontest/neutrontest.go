// Package neutrontest runs a real OpenStack Neutron API server for tests,
// through hack/neutron.sh, so that the neutron backend is tested against
// Neutron itself rather than against a fake that agrees with its author.
// It has no Kubernetes dependencies.
//
// Each Server has its own state directory, database and port, so several
// test binaries can run servers at once. A package's tests usually share
// one, started on first use by Shared and stopped by Main in TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(neutrontest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		srv := neutrontest.Shared(t)
//		...
//	}
package neutrontest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// StartTimeout bounds a start, which on a fresh machine includes
// installing Neutron with apt.
const StartTimeout = 5 * time.Minute

const (
	urlPrefix = "NEUTRON_URL="
	// neutronModule is where Debian's python3-neutron puts the package.
	neutronModule = "/usr/lib/python3/dist-packages/neutron/__init__.py"
	python        = "/usr/bin/python3"
)

// Server is a Neutron API server with its own state directory.
type Server struct {
	// URL is the root of the API, e.g. http://127.0.0.1:40123/, for
	// neutron.Config.Endpoint.
	URL    string
	dir    string
	script string
}

// Unavailable returns why a Neutron server cannot run here, or "" if it can:
// it needs Debian's python3-neutron, or root and apt to install it.
func Unavailable() string {
	if _, err := os.Stat(python); err != nil {
		return "no " + python + " to run Neutron with"
	}
	if _, err := os.Stat(neutronModule); err == nil {
		return ""
	}
	if os.Geteuid() != 0 {
		return "python3-neutron is not installed and installing it needs root; run as root, or apt-get install --no-install-recommends python3-neutron first"
	}
	for _, tool := range []string{"apt-get", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "python3-neutron is not installed and there is no " + tool + " to install it (Debian or Ubuntu needed)"
		}
	}
	return ""
}

// Require skips t when Neutron cannot run here, except in CI (CI=true),
// where skipping would hide the backend's tests: there it fails.
func Require(t testing.TB) {
	t.Helper()
	reason := Unavailable()
	if reason == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI must run the Neutron tests: %s", reason)
	}
	t.Skipf("skipping a test against a real Neutron: %s", reason)
}

// Start starts a server with a fresh database in a new temporary state
// directory. Close it when done.
func Start(ctx context.Context) (*Server, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "netop-neutron-")
	if err != nil {
		return nil, fmt.Errorf("make a state directory for neutron: %w", err)
	}
	s := &Server{dir: dir, script: filepath.Join(root, "hack", "neutron.sh")}
	if err := s.start(ctx, "--fresh"); err != nil {
		_ = s.Stop()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Restart stops the server, if it runs, and starts it again on the same
// port and database, as after an outage.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.start(ctx)
}

// Stop stops the server and waits until its processes are gone. Its state
// is kept for Restart. Stopping a stopped server does nothing.
func (s *Server) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := s.run(ctx, "stop", s.dir)
	return err
}

// Close stops the server and removes its state.
func (s *Server) Close() error {
	err := s.Stop()
	return errors.Join(err, os.RemoveAll(s.dir))
}

// Dir is the server's state directory; its log is neutron-server.log there.
func (s *Server) Dir() string { return s.dir }

// LogTail returns the last n lines of the server's log, for failure messages.
func (s *Server) LogTail(n int) string {
	data, err := os.ReadFile(filepath.Join(s.dir, "neutron-server.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (s *Server) start(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	out, err := s.run(ctx, append(append([]string{"start"}, args...), s.dir)...)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), urlPrefix); ok {
			s.URL = u
			return nil
		}
	}
	return fmt.Errorf("%s start printed no %s line: %q", s.script, urlPrefix, out)
}

func (s *Server) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{s.script}, args...)...)
	env := append(os.Environ(), fmt.Sprintf("NEUTRON_WATCH_PID=%d", os.Getpid()))
	if os.Geteuid() != 0 {
		// The schema template is cached per user when /var/cache is not
		// writable.
		if cache, err := os.UserCacheDir(); err == nil {
			env = append(env, "NETOP_NEUTRON_CACHE="+filepath.Join(cache, "netop-neutron"))
		}
	}
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// The server is detached from our pipes; this only guards against a
	// script bug keeping them open.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s", s.script, strings.Join(args, " "), err, tail(stderr.String(), 40))
	}
	return out, nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// repoRoot finds the repository, and so hack/neutron.sh, from the working
// directory, which go test sets to the package's.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "hack", "neutron.sh")); err != nil {
				return "", fmt.Errorf("no hack/neutron.sh beside %s: %w", filepath.Join(dir, "go.mod"), err)
			}
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in the working directory or above it: run the tests from the repository")
		}
		dir = parent
	}
}

var shared struct {
	sync.Mutex
	srv *Server
	err error
}

// Shared returns the server shared by the test binary's tests, starting it
// on first use; Main stops it. It skips or fails t as Require does.
func Shared(t testing.TB) *Server {
	t.Helper()
	Require(t)
	shared.Lock()
	defer shared.Unlock()
	if shared.srv == nil && shared.err == nil {
		start := time.Now()
		shared.srv, shared.err = Start(context.Background())
		if shared.err == nil {
			t.Logf("neutron %s started in %v (state in %s)", shared.srv.URL, time.Since(start).Round(time.Millisecond), shared.srv.Dir())
		}
	}
	if shared.err != nil {
		t.Fatalf("start neutron: %v", shared.err)
	}
	return shared.srv
}

// Main runs the tests of m and then closes the shared server, if one was
// started; it returns the exit code for os.Exit.
func Main(m *testing.M) int {
	code := m.Run()
	if err := closeShared(); err != nil && code == 0 {
		code = 1
	}
	return code
}

// CloseShared stops the shared server, if one was started, for test
// binaries whose TestMain is not Main.
func CloseShared() { _ = closeShared() }

func closeShared() error {
	shared.Lock()
	defer shared.Unlock()
	if shared.srv == nil {
		return nil
	}
	err := shared.srv.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "neutrontest: stop the shared neutron: %v\n", err)
	}
	shared.srv = nil
	return err
}
