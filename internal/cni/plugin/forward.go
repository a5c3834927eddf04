package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/go-logr/logr"
)

// Request is a command the plugin forwards to netop's node side: the
// runtime's call as skel read it (its environment and stdin), whole, so
// that the node side reads the same configuration.
type Request struct {
	// Protocol is the version of Request and Response the plugin speaks:
	// Call sets it.
	Protocol int           `json:"protocol"`
	Command  string        `json:"command"`
	Args     *skel.CmdArgs `json:"args"`
	// Files names the files passed along the request (SCM_RIGHTS), in
	// their order: FilePodNetns, FileDataDir, FileNodeNetns.
	Files []string `json:"files,omitempty"`
}

// Protocol is the version of Request and Response. The node side refuses
// a request of another: a plugin and a node side of netop versions that
// read them differently would attach from a half-understood request. (A
// node side older than the field serves any.) An agent with --install-cni
// installs the plugin of its own version when it starts; a plugin put in
// place by hand is replaced by hand.
const Protocol = 1

// The files ADD passes along its request, opened by the plugin: the paths
// in the runtime's call and the configuration are the plugin's view of
// the node, which the node side may not share (a runtime's own mounts, a
// container's file system), and an open file means the same wherever it
// goes.
const (
	// FilePodNetns is the pod's network namespace (CNI_NETNS).
	FilePodNetns = "podNetns"
	// FileDataDir is the directory of the attachment records (dataDir).
	FileDataDir = "dataDir"
	// FileNodeNetns is the bridges' network namespace: the
	// configuration's nodeNetns, or the plugin's own.
	FileNodeNetns = "nodeNetns"
)

// Response is the node side's answer: the result to print, in the
// configuration's CNI version, or why not.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *types.Error    `json:"error,omitempty"`
}

// answerMargin is how much longer than ADD's own timeout the plugin waits
// for the node side's answer: the node side times out first and says why.
const answerMargin = 5 * time.Second

// cmdAdd has netop's node side attach the pod, and prints its result.
func cmdAdd(ctx context.Context, conf *Config, args *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	timeout, err := conf.AddTimeout()
	if err != nil {
		return err
	}
	req := Request{Command: "ADD", Args: args}
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	if err := os.MkdirAll(conf.DataDir, 0o700); err != nil {
		return fmt.Errorf("attachment records: %w", err)
	}
	nodeNetns := conf.NodeNetns
	if nodeNetns == "" {
		// The bridges are in the namespace the runtime runs its plugins
		// in, which need not be the node side's.
		nodeNetns = "/proc/self/ns/net"
	}
	for _, p := range []struct{ name, path, what string }{
		{FilePodNetns, args.Netns, "CNI_NETNS"}, {FileDataDir, conf.DataDir, "network configuration: dataDir"}, {FileNodeNetns, nodeNetns, "network configuration: nodeNetns"},
	} {
		f, err := os.Open(p.path)
		if err != nil {
			return fmt.Errorf("%s: %w", p.what, err)
		}
		files = append(files, f)
		req.Files = append(req.Files, p.name)
	}
	resp, err := Call(ctx, conf.Socket, req, files, timeout+answerMargin)
	if err != nil {
		// The runtime retries the sandbox: the agent may be starting.
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("netop's node agent did not answer at %s: %v", conf.Socket, err),
			"is netop's agent running on this node?")
	}
	if resp.Error != nil {
		return resp.Error
	}
	log.V(vInfo).Info("Attached by the node agent", "result", string(resp.Result))
	_, err = os.Stdout.Write(resp.Result)
	return err
}

// Call sends one request to the node side listening at socket, with files
// passed along (SCM_RIGHTS), and reads its answer, within timeout.
func Call(ctx context.Context, socket string, req Request, files []*os.File, timeout time.Duration) (*Response, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	defer func() { _ = conn.Close() }()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	req.Protocol = Protocol
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	n, _, err := conn.WriteMsgUnix(data, syscall.UnixRights(fds...), nil)
	if err == nil && n < len(data) {
		_, err = conn.Write(data[n:])
	}
	if err == nil {
		// The request is whole: the node side reads to its end.
		err = conn.CloseWrite()
	}
	if err != nil {
		return nil, fmt.Errorf("sending the request: %w", err)
	}
	resp := &Response{}
	if err := json.NewDecoder(conn).Decode(resp); err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	return resp, nil
}
