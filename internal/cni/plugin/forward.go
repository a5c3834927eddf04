package plugin

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/go-logr/logr"

	"github.com/netop-dev/netop/internal/cni/cniapi"
)

// answerMargin is how much longer than ADD's own timeout the plugin waits
// for the node side's answer: the node side times out first and says why.
const answerMargin = 5 * time.Second

// cmdAdd has netop's node side attach the pod, and prints its result.
func cmdAdd(ctx context.Context, conf *cniapi.Config, args *skel.CmdArgs) error {
	log := logr.FromContextOrDiscard(ctx)
	timeout, err := conf.AddTimeout()
	if err != nil {
		return err
	}
	req := cniapi.Request{Command: "ADD", Args: args}
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
		{cniapi.FilePodNetns, args.Netns, "CNI_NETNS"}, {cniapi.FileDataDir, conf.DataDir, "network configuration: dataDir"}, {cniapi.FileNodeNetns, nodeNetns, "network configuration: nodeNetns"},
	} {
		f, err := os.Open(p.path)
		if err != nil {
			return fmt.Errorf("%s: %w", p.what, err)
		}
		files = append(files, f)
		req.Files = append(req.Files, p.name)
	}
	resp, err := cniapi.Call(ctx, conf.Socket, req, files, timeout+answerMargin)
	if err != nil {
		// The runtime retries the sandbox: the agent may be starting.
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("netop's node agent did not answer at %s: %v", conf.Socket, err),
			"is netop's agent running on this node?")
	}
	if resp.Error != nil {
		return resp.Error
	}
	log.V(cniapi.LogInfo).Info("Attached by the node agent", "result", string(resp.Result))
	_, err = os.Stdout.Write(resp.Result)
	return err
}
