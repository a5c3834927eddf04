package cniapi

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
)

// The plugin's request arrives whole with the files it passed, which are
// the plugin's files wherever their paths lead here; the answer goes back.
// (The node side end to end, with a real API server and netlink, is
// test/podnet's.)
func TestRequestCarriesFiles(t *testing.T) {
	dir := t.TempDir()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "cni.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	var files []*os.File
	for _, name := range []string{"netns", "records", "node"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = f.Close() }()
		files = append(files, f)
	}
	big := make([]byte, 200<<10) // longer than one read
	for i := range big {
		big[i] = 'x'
	}
	stdin, _ := json.Marshal(map[string]string{"padding": string(big)})
	sent := Request{Command: "ADD", Args: &skel.CmdArgs{ContainerID: "c1", StdinData: stdin}, Files: []string{FilePodNetns, FileDataDir, FileNodeNetns}}

	type received struct {
		req   Request
		files []*os.File
		err   error
	}
	got := make(chan received, 1)
	go func() {
		conn, err := l.AcceptUnix()
		if err != nil {
			got <- received{err: err}
			return
		}
		defer func() { _ = conn.Close() }()
		req, files, err := ReadRequest(conn)
		got <- received{req, files, err}
		_ = json.NewEncoder(conn).Encode(Response{Result: json.RawMessage(`{"cniVersion":"1.1.0"}`)})
	}()
	resp, err := Call(t.Context(), filepath.Join(dir, "cni.sock"), sent, files, 10*time.Second)
	if err != nil {
		t.Fatalf("Call: %v", err)
	}
	if string(resp.Result) != `{"cniVersion":"1.1.0"}` {
		t.Errorf("answer %s", resp.Result)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("ReadRequest: %v", r.err)
	}
	if err := Servable(r.req, r.files); err != nil {
		t.Errorf("the plugin's request is not served: %v", err)
	}
	if r.req.Args.ContainerID != "c1" || string(r.req.Args.StdinData) != string(stdin) || len(r.req.Files) != 3 {
		t.Errorf("request: container %q, %d bytes of stdin (sent %d), files %v", r.req.Args.ContainerID, len(r.req.Args.StdinData), len(stdin), r.req.Files)
	}
	if len(r.files) != len(files) {
		t.Fatalf("%d files received, %d sent", len(r.files), len(files))
	}
	for i, f := range r.files {
		defer func() { _ = f.Close() }()
		a, errA := f.Stat()
		b, errB := files[i].Stat()
		if errA != nil || errB != nil || !os.SameFile(a, b) {
			t.Errorf("file %d received is not the one sent (%v %v)", i, errA, errB)
		}
	}
}

// A request of another version of the protocol, from a plugin of another
// netop version, is refused, saying so, and so is one that does not pass
// each file an ADD acts on; a whole request of this one is served.
func TestServable(t *testing.T) {
	whole := func() Request {
		return Request{Protocol: Protocol, Command: "ADD", Args: &skel.CmdArgs{ContainerID: "c1"},
			Files: []string{FilePodNetns, FileDataDir, FileNodeNetns}}
	}
	if err := Servable(whole(), make([]*os.File, 3)); err != nil {
		t.Fatalf("this protocol's ADD: %v", err)
	}
	for _, protocol := range []int{0, Protocol + 1} {
		req := whole()
		req.Protocol = protocol
		err := Servable(req, make([]*os.File, 3))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("protocol %d", protocol)) || !strings.Contains(err.Error(), fmt.Sprintf("speaks %d", Protocol)) ||
			!strings.Contains(err.Error(), "different netop versions") {
			t.Errorf("protocol %d: %v, want a refusal naming both versions", protocol, err)
		}
	}
	for i, name := range whole().Files {
		req := whole()
		req.Files = slices.Delete(req.Files, i, i+1)
		if err := Servable(req, make([]*os.File, 2)); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("no file %q", name)) {
			t.Errorf("without %s: %v, want a refusal naming it", name, err)
		}
	}
}
