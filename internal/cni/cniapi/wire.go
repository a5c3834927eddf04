package cniapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
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

// Servable says why req, with files passed along it, is not served, or
// nil.
func Servable(req Request, files []*os.File) error {
	switch {
	case req.Protocol != Protocol:
		return fmt.Errorf("the plugin speaks protocol %d to netop's node side, which speaks %d: they are of different netop versions; "+
			"install the netop-cni of the node side's version (an agent with --install-cni does when it starts)", req.Protocol, Protocol)
	case req.Command != "ADD" || req.Args == nil:
		return fmt.Errorf("command %q: only ADD is served (the plugin runs the others itself)", req.Command)
	case len(files) != len(req.Files):
		return fmt.Errorf("the request names %d files (%v) and passes %d", len(req.Files), req.Files, len(files))
	}
	// Each one, or the ADD would act on a path of the plugin's view of the
	// node here (the node namespace: this process's own).
	for _, name := range []string{FilePodNetns, FileDataDir, FileNodeNetns} {
		if !slices.Contains(req.Files, name) {
			return fmt.Errorf("the request passes no file %q (it passes %v)", name, req.Files)
		}
	}
	return nil
}

// maxRequest bounds a request: a network configuration with the previous
// plugins' result, a few kilobytes; maxFiles the files passed along it.
const (
	maxRequest = 1 << 20
	maxFiles   = 3
)

// ReadRequest reads a request to its end, with the files passed along it.
func ReadRequest(conn *net.UnixConn) (req Request, files []*os.File, err error) {
	var data []byte
	buf := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(4*maxFiles))
	for len(data) <= maxRequest {
		n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
		data = append(data, buf[:n]...)
		if oobn > 0 {
			received, perr := receivedFiles(oob[:oobn])
			files = append(files, received...)
			if perr != nil {
				return req, files, perr
			}
		}
		if errors.Is(err, io.EOF) || err == nil && n == 0 && oobn == 0 {
			return req, files, json.Unmarshal(data, &req)
		}
		if err != nil {
			return req, files, err
		}
	}
	return req, files, fmt.Errorf("longer than %d bytes", maxRequest)
}

// receivedFiles are the files of a control message (SCM_RIGHTS).
func receivedFiles(oob []byte) ([]*os.File, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "passed"))
		}
	}
	return files, nil
}
