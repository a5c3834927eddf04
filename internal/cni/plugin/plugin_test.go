package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/vishvananda/netlink"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/testing/nettest"
)

// netconf is a configuration as the runtime passes it on stdin.
func netconf(t *testing.T, dataDir string, extra map[string]any) []byte {
	t.Helper()
	c := map[string]any{"cniVersion": "1.1.0", "name": "netop-test", "type": cniapi.Type, "socket": filepath.Join(dataDir, "nobody.sock"), "dataDir": dataDir}
	for k, v := range extra {
		c[k] = v
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// podCall is a call for a pod's net1 in container id.
func podCall(stdin []byte, id string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: id, Netns: "/run/netns/" + id, IfName: "net1",
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1", StdinData: stdin}
}

// invoke runs a command as Main does, with stdout swapped for a file so
// that a log written there shows; it returns the command's error and what
// went to stderr.
func invoke(t *testing.T, name string, fn command, args *skel.CmdArgs) (stderr string, cmdErr error) {
	t.Helper()
	stdout, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = stdout
	var errOut bytes.Buffer
	cmdErr = runner{stderr: &errOut}.run(name, fn, args)
	os.Stdout = saved
	_ = stdout.Close()
	if out, err := os.ReadFile(stdout.Name()); err != nil || len(out) != 0 {
		t.Errorf("%s wrote to stdout (the result's): %q %v", name, out, err)
	}
	return errOut.String(), cmdErr
}

func lines(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == '\n' })
}

// failureLine checks that out has exactly one line saying the command
// failed, with the container, the pod and the error.
func failureLine(t *testing.T, where, out, containerID string, cmdErr error) {
	t.Helper()
	var found []string
	for _, l := range lines(out) {
		if strings.Contains(l, `"CNI command failed"`) {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: want one failure line, got %d in:\n%s", where, len(found), out)
	}
	for _, want := range []string{
		`containerID="` + containerID + `"`, `pod="ns1/pod1"`, `ifname="net1"`,
		"err=" + strconv.Quote(cmdErr.Error()),
	} {
		if !strings.Contains(found[0], want) {
			t.Errorf("%s: failure line lacks %s:\n%s", where, want, found[0])
		}
	}
	if !strings.HasPrefix(found[0], "E") {
		t.Errorf("%s: failure line is not at error severity: %s", where, found[0])
	}
}

// A failed ADD (no node side answers) is returned with why, and logged to
// the configured file, made with its directory, and to stderr.
func TestAddFailureLogged(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "log", "netop-cni.log")
	args := podCall(netconf(t, filepath.Join(dir, "records"), map[string]any{"logFile": logFile}), "c-add")
	// A namespace to pass (any file will do: nobody receives it).
	args.Netns = filepath.Join(dir, "netns")
	if err := os.WriteFile(args.Netns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stderr, err := invoke(t, "ADD", cmdAdd, args)
	if err == nil || !strings.Contains(err.Error(), "netop's node agent did not answer at "+filepath.Join(dir, "records", "nobody.sock")) {
		t.Fatalf("ADD with nobody serving the socket: %v", err)
	}
	log, rerr := os.ReadFile(logFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	failureLine(t, "log file", string(log), "c-add", err)
	failureLine(t, "stderr", stderr, "c-add", err)
	if len(lines(stderr)) != 1 {
		t.Errorf("stderr: want one line, got:\n%s", stderr)
	}
	if !strings.Contains(string(log), `"CNI command" command="ADD"`) {
		t.Errorf("log file lacks the command's start at the default level (info):\n%s", log)
	}
	for path, want := range map[string]os.FileMode{logFile: 0o600, filepath.Dir(logFile): 0o700 | os.ModeDir} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v (%v)", path, fi.Mode(), want, err)
		}
	}
}

// A failed DEL (the records' directory is a file) is returned and logged;
// at level error only the failure is written; the file is appended to.
func TestDelFailureLogged(t *testing.T) {
	dir := t.TempDir()
	records := filepath.Join(dir, "records")
	if err := os.WriteFile(records, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "netop-cni.log")
	if err := os.WriteFile(logFile, []byte("earlier\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := podCall(netconf(t, records, map[string]any{"logFile": logFile, "logLevel": "error"}), "c-del")
	stderr, err := invoke(t, "DEL", cmdDel, args)
	if err == nil || !strings.Contains(err.Error(), "attachment records") {
		t.Fatalf("DEL with no records' directory to write: %v", err)
	}
	log, rerr := os.ReadFile(logFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	failureLine(t, "log file", string(log), "c-del", err)
	failureLine(t, "stderr", stderr, "c-del", err)
	if got := lines(string(log)); len(got) != 2 || got[0] != "earlier" {
		t.Errorf("at level error, want the earlier line and the failure, got:\n%s", log)
	}
}

// nodeNamespace makes a throwaway network namespace for the node's links,
// and a netlink handle in it.
func nodeNamespace(t *testing.T, prefix string) (string, *netlink.Handle) {
	t.Helper()
	nettest.RequireRoot(t)
	name := nettest.NetnsName(prefix)
	if err := linux.EnsureNetns(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nettest.DeleteNetns(name) })
	return name, nettest.Handle(t, name)
}

// DEL of a container whose record is not one (another version's, edited
// by hand) succeeds, or the runtime would retry forever a sandbox it could
// never remove: as a delegate it deletes its interface's host end, named
// after the container and the interface; chained, the interfaces go with
// the sandbox's namespace. The record goes, and the log file says why, at
// error severity.
func TestDelUnreadableRecord(t *testing.T) {
	nodeNetns, node := nodeNamespace(t, "cnidel")
	for _, network := range []string{"", "ns1/net"} {
		records := t.TempDir()
		if err := os.WriteFile(filepath.Join(records, "c-bad.json"), []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
		hostEnd := ifname.HostVeth("c-bad", "net1")
		pair := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostEnd}, PeerName: "pod-end"}
		if err := node.LinkAdd(pair); err != nil {
			t.Fatal(err)
		}
		logFile := filepath.Join(t.TempDir(), "netop-cni.log")
		extra := map[string]any{"nodeNetns": filepath.Join("/run/netns", nodeNetns), "logFile": logFile, "logLevel": "error"}
		if network != "" {
			extra["network"] = network
		}
		if _, err := invoke(t, "DEL", cmdDel, podCall(netconf(t, records, extra), "c-bad")); err != nil {
			t.Fatalf("network %q: DEL with an unreadable record: %v", network, err)
		}
		if _, err := os.Stat(filepath.Join(records, "c-bad.json")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("network %q: the unreadable record is still there: %v", network, err)
		}
		if log, _ := os.ReadFile(logFile); !strings.HasPrefix(string(log), "E") || !strings.Contains(string(log), "record of c-bad: "+cni.ErrUnreadable.Error()) {
			t.Errorf("network %q: want an error line naming the record, got:\n%s", network, log)
		}
		_, err := node.LinkByName(hostEnd)
		switch gone := errors.As(err, new(netlink.LinkNotFoundError)); {
		case network != "" && !gone:
			t.Errorf("as a delegate: the host end %s is still there (%v)", hostEnd, err)
		case network == "" && gone:
			t.Errorf("chained: the host end %s was deleted; the namespace's end takes it", hostEnd)
		case network == "":
			if err := node.LinkDel(pair); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// GC detaches what the records of containers the runtime no longer has
// hold, also beside a record that is not one; but while one is there, no
// host end is deleted for being unknown to the records (the unreadable one
// may hold it), and GC says so.
func TestGCBesideAnUnreadableRecord(t *testing.T) {
	nodeNetns, node := nodeNamespace(t, "cnigc")
	records := t.TempDir()
	hostEnd := func(id, peer string) string {
		t.Helper()
		name := ifname.HostVeth(id, "net1")
		if err := node.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			t.Fatal(err)
		}
		return name
	}
	gone, orphan := hostEnd("c-gone", "pod-gone"), hostEnd("c-orphan", "pod-orphan")
	store := cni.Store{Dir: records}
	if err := store.Save(cni.Record{ContainerID: "c-gone", Netns: "/run/netns/c-gone", Pod: "ns1/pod1",
		Interfaces: []cni.RecordedInterface{{Config: "netop-test", Interface: "net1", Network: "ns1/net", HostVeth: gone}}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(records, "c-bad.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	there := func(name string) bool {
		_, err := node.LinkByName(name)
		return err == nil
	}
	conf := netconf(t, records, map[string]any{"nodeNetns": filepath.Join("/run/netns", nodeNetns)})
	_, err := invoke(t, "GC", cmdGC, &skel.CmdArgs{StdinData: conf})
	if err == nil || !strings.Contains(err.Error(), "records of c-bad: "+cni.ErrUnreadable.Error()) {
		t.Errorf("GC beside an unreadable record: %v, want it named", err)
	}
	if _, ok, _ := store.Load("c-gone"); ok || there(gone) {
		t.Errorf("GC left the container the runtime no longer has: record %v, host end %v", ok, there(gone))
	}
	if !there(orphan) {
		t.Errorf("GC deleted %s, which the unreadable record may hold", orphan)
	}

	// Once its container's DEL removed it, GC deletes what no record knows.
	if err := store.Remove("c-bad"); err != nil {
		t.Fatal(err)
	}
	if _, err := invoke(t, "GC", cmdGC, &skel.CmdArgs{StdinData: conf}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if there(orphan) {
		t.Errorf("GC left %s, which no record knows", orphan)
	}
}

// DEL on a node with no records' directory (netop never attached there,
// or was removed) succeeds and makes nothing: not the directory, not a
// lock.
func TestDelWithoutRecords(t *testing.T) {
	records := filepath.Join(t.TempDir(), "records")
	if _, err := invoke(t, "DEL", cmdDel, podCall(netconf(t, records, nil), "c-none")); err != nil {
		t.Fatalf("DEL with no records' directory: %v", err)
	}
	if _, err := os.Stat(records); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("DEL made the records' directory: %v", err)
	}
}

// logLevel decides what a successful command writes; a success writes
// nothing to stderr.
func TestLogLevels(t *testing.T) {
	for level, want := range map[string][]string{
		"error": nil,
		"":      {`"CNI command"`, `"Nothing recorded for the container: nothing to detach"`, `"CNI command succeeded"`},
		"INFO":  {`"CNI command"`, `"Nothing recorded for the container: nothing to detach"`, `"CNI command succeeded"`},
		"debug": {`"CNI command"`, `"Nothing recorded for the container: nothing to detach"`, `"CNI command succeeded"`},
	} {
		t.Run(level, func(t *testing.T) {
			dir := t.TempDir()
			logFile := filepath.Join(dir, "netop-cni.log")
			args := podCall(netconf(t, filepath.Join(dir, "records"), map[string]any{"logFile": logFile, "logLevel": level}), "c-lvl")
			stderr, err := invoke(t, "DEL", cmdDel, args)
			if err != nil || stderr != "" {
				t.Fatalf("DEL of nothing: %v, stderr %q", err, stderr)
			}
			log, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			got := lines(string(log))
			if len(got) != len(want) {
				t.Fatalf("want %d lines, got:\n%s", len(want), log)
			}
			for i, w := range want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], `containerID="c-lvl"`) {
					t.Errorf("line %d: want %s with the container, got %s", i, w, got[i])
				}
			}
		})
	}
	// Debug adds the steps: CHECK's with nothing recorded.
	dir := t.TempDir()
	logFile := filepath.Join(dir, "netop-cni.log")
	for _, level := range []string{"info", "debug"} {
		args := podCall(netconf(t, filepath.Join(dir, "records"), map[string]any{"logFile": logFile, "logLevel": level}), "c-"+level)
		if _, err := invoke(t, "CHECK", cmdCheck, args); err != nil {
			t.Fatal(err)
		}
	}
	log, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "nothing to check"); n != 1 || !strings.Contains(string(log), `"Nothing recorded for the container: nothing to check" command="CHECK" containerID="c-debug"`) {
		t.Errorf("want the step at debug only, got:\n%s", log)
	}
}

// A logLevel or logFile that means nothing is refused, naming the key,
// on stderr too; no file is written.
func TestLoggingConfigRefused(t *testing.T) {
	for key, value := range map[string]string{"logLevel": "verbose", "logFile": "relative/netop-cni.log"} {
		t.Run(key, func(t *testing.T) {
			dir := t.TempDir()
			extra := map[string]any{"logFile": filepath.Join(dir, "netop-cni.log"), key: value}
			stderr, err := invoke(t, "ADD", cmdAdd, podCall(netconf(t, filepath.Join(dir, "records"), extra), "c-conf"))
			if err == nil || !strings.Contains(err.Error(), key+": ") || !strings.Contains(err.Error(), value) {
				t.Fatalf("%s %q: %v", key, value, err)
			}
			failureLine(t, "stderr", stderr, "c-conf", err)
			if _, err := os.Stat(filepath.Join(dir, "netop-cni.log")); !os.IsNotExist(err) {
				t.Errorf("log file written: %v", err)
			}
		})
	}
}

// A log file that cannot be opened does not stop the command; stderr says
// why.
func TestLogFileUnusable(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	args := podCall(netconf(t, filepath.Join(dir, "records"), map[string]any{"logFile": filepath.Join(notDir, "netop-cni.log")}), "c-nolog")
	stderr, err := invoke(t, "DEL", cmdDel, args)
	if err != nil {
		t.Fatalf("DEL failed for want of its log: %v", err)
	}
	if got := lines(stderr); len(got) != 1 || !strings.Contains(got[0], `"Not logging to the file"`) || !strings.Contains(got[0], "logFile: ") {
		t.Errorf("stderr: %q", stderr)
	}
}

// The plugin runs once per pod and Network: it links no Kubernetes client,
// whose packages' initialisation alone cost more than a whole ADD now
// takes.
func TestPluginLinksNoKubernetesClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/netop-dev/netop/cmd/netop-cni").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range lines(string(out)) {
		if strings.HasPrefix(dep, "k8s.io/client-go/") || dep == "github.com/netop-dev/netop/internal/kubeclient" {
			t.Errorf("netop-cni links %s", dep)
		}
	}
}
