// Package cri is the container runtime's CRI as netop's node side asks it:
// which network namespace a running pod's sandbox has, from the runtime
// the kubelet uses (containerd's socket), the way the kubelet's own
// runtime reports it. Attaching a Network to a pod that already runs
// (hot-plug) starts there, since no CNI call names the namespace then.
package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podUIDLabel is the label the kubelet puts on every sandbox it makes.
const podUIDLabel = "io.kubernetes.pod.uid"

// ErrNoSandbox says the pod has no ready sandbox on this node's runtime:
// it does not run here (yet, or any more).
var ErrNoSandbox = errors.New("no ready pod sandbox")

// Runtime is a connection to a CRI runtime service.
type Runtime struct {
	conn    *grpc.ClientConn
	Service runtimeapi.RuntimeServiceClient
}

// Dial connects to the runtime listening on the unix socket path. The
// connection is made on first use; a runtime that is not there fails then.
func Dial(socket string) (*Runtime, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("container runtime at %s: %w", socket, err)
	}
	return &Runtime{conn: conn, Service: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection.
func (r *Runtime) Close() error { return r.conn.Close() }

// Version asks the runtime for its name and version, within 2 s.
func (r *Runtime) Version(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return r.Service.Version(ctx, &runtimeapi.VersionRequest{})
}

// Sandbox is a pod's running sandbox: its ID, which the runtime gives CNI
// plugins as the container ID (the key of the plugin's records), and its
// network namespace's path.
type Sandbox struct {
	ID    string
	Netns string
}

// PodSandbox returns the ready sandbox of the pod whose UID is uid, or
// ErrNoSandbox.
func (r *Runtime) PodSandbox(ctx context.Context, uid string) (Sandbox, error) {
	list, err := r.Service.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{podUIDLabel: uid},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		return Sandbox{}, fmt.Errorf("listing the sandboxes of pod %s: %w", uid, err)
	}
	if len(list.Items) == 0 {
		return Sandbox{}, fmt.Errorf("pod %s: %w", uid, ErrNoSandbox)
	}
	// The newest, should a restarted sandbox's predecessor still be
	// reported ready for a moment.
	sandbox := list.Items[0]
	for _, s := range list.Items[1:] {
		if s.CreatedAt > sandbox.CreatedAt {
			sandbox = s
		}
	}
	status, err := r.Service.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandbox.Id, Verbose: true})
	if err != nil {
		return Sandbox{}, fmt.Errorf("status of pod %s's sandbox %s: %w", uid, sandbox.Id, err)
	}
	path, err := netnsOf(status.Info)
	if err != nil {
		return Sandbox{}, fmt.Errorf("pod %s's sandbox %s: %w", uid, sandbox.Id, err)
	}
	return Sandbox{ID: sandbox.Id, Netns: path}, nil
}

// SandboxReady says whether the sandbox with that ID is still ready; one
// the runtime no longer has is not.
func (r *Runtime) SandboxReady(ctx context.Context, id string) (bool, error) {
	status, err := r.Service.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if grpcstatus.Code(err) == codes.NotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("status of sandbox %s: %w", id, err)
	}
	return status.Status.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY, nil
}

// netnsOf reads the network namespace from a sandbox's verbose status:
// containerd reports the sandbox's OCI runtime spec under "info", whose
// namespaces name the network namespace's path.
func netnsOf(info map[string]string) (string, error) {
	var verbose struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	raw, ok := info["info"]
	if !ok {
		return "", errors.New("the runtime's verbose status has no info (a runtime other than containerd?)")
	}
	if err := json.Unmarshal([]byte(raw), &verbose); err != nil {
		return "", fmt.Errorf("reading the runtime's verbose status: %w", err)
	}
	for _, ns := range verbose.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			if ns.Path == "" {
				return "", errors.New("the sandbox shares the host's network namespace (hostNetwork)")
			}
			return ns.Path, nil
		}
	}
	return "", errors.New("the sandbox's runtime spec names no network namespace")
}
