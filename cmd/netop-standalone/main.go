// Command netop-standalone runs a whole single-node Kubernetes (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler in process; a
// private containerd and a kubelet as child processes) and the netop
// operator, so that a newcomer can kubectl apply a Network and kubectl run
// a pod within seconds, offline.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni/plugin"
	"github.com/netop-dev/netop/internal/controlplane"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/logging"
	"github.com/netop-dev/netop/internal/node"
	"github.com/netop-dev/netop/internal/operator"
)

func main() {
	// The node's runtime runs this binary as netop's CNI plugin, by the
	// plugin's name.
	if filepath.Base(os.Args[0]) == plugin.Type {
		plugin.Main()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == kubeletCommand {
		runKubelet(os.Args[2:])
	}
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var (
		dataDir  string
		port     int
		nodeOpts nodeOptions
	)
	logOpts := logging.NewOptions()
	opts := operator.NewOptions()
	// Standalone is for a developer's machine: bridges go into their own
	// network namespace, so that 192.168.0.0/16 never shadows the host's
	// routes, and metrics listen on loopback only.
	opts.Netns = "netop"
	opts.MetricsAddr = "127.0.0.1:8080"
	opts.WebhookAddr = "127.0.0.1:9443"
	opts.WebhookLocal = true
	cmd := &cobra.Command{
		Use:          "netop-standalone [--data-dir DIR]",
		Short:        "Run an embedded Kubernetes control plane with the netop operator",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The embedded Kubernetes components log through klog's
			// process-wide logger into DATA_DIR/logs; the operator's own
			// logs go to stderr.
			logger, err := logOpts.Logger(os.Stderr)
			if err != nil {
				return err
			}
			ctx = klog.NewContext(ctx, logger)
			err = run(ctx, cmd, dataDir, port, nodeOpts, opts)
			if err != nil && ctx.Err() != nil {
				// Ctrl-C while starting: whatever step it cut short
				// fails with the cancelled context, but stopping is
				// what was asked for, and everything started was stopped.
				logger.Info("Stopped while starting", "step", err.Error())
				return nil
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", ".netop", "Directory for the control plane's state, certificates, kubeconfig and logs. Reused on restart.")
	cmd.Flags().IntVar(&port, "apiserver-port", 0, "Port of the API server on 127.0.0.1 when the data directory has none recorded yet (0: any free port).")
	hostname, _ := os.Hostname()
	cmd.Flags().BoolVar(&nodeOpts.enabled, "node", true, "Run a node (containerd and a kubelet) so that pods run. Where it cannot run, the standalone says what is missing and runs without one.")
	cmd.Flags().StringVar(&nodeOpts.name, "node-name", strings.ToLower(hostname), "Name of the node.")
	cmd.Flags().StringSliceVar(&nodeOpts.archives, "image-archive", nil, "Image tarballs (such as `make image` writes to bin/netop-image.tar) the node serves as if pulled from their registries; repeatable. Tarballs in DIR/images are served too.")
	cmd.Flags().BoolVar(&nodeOpts.operator, "operator", true, "Run netop's operator in this process. Off, the cluster is bare, to install netop as on any cluster: netop manifests --image REF | kubectl apply -f -.")
	logOpts.AddFlags(cmd.Flags())
	opts.AddFlags(cmd.Flags())
	return cmd
}

type nodeOptions struct {
	enabled  bool
	name     string
	archives []string
	// operator runs netop's operator in this process; off, netop is
	// installed like on any cluster (netop manifests).
	operator bool
}

func run(ctx context.Context, cmd *cobra.Command, dataDir string, port int, nodeOpts nodeOptions, opts *operator.Options) error {
	logger := klog.FromContext(ctx)
	started := time.Now()
	if nodeOpts.enabled {
		if err := node.Check(); err != nil {
			logger.Info("Running without a node: pods will be stored but not run", "reason", err.Error())
			nodeOpts.enabled = false
		}
	}
	if nodeOpts.enabled && nodeOpts.name == "" {
		return errors.New("--node-name: the host has no name; give one")
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	// The backend first: missing privileges should stop us before the
	// control plane starts, not after.
	var be backend.Backend
	if nodeOpts.operator {
		var closeBackend func()
		var err error
		if be, closeBackend, err = operator.NewBackend(ctx, opts); err != nil {
			return err
		}
		defer closeBackend()
	} else if opts.Netns != "" {
		// The node's pod bridge lives there, made by the backend otherwise.
		if err := linux.EnsureNetns(opts.Netns); err != nil {
			return err
		}
	}
	cpConfig := controlplane.Config{DataDir: dataDir, APIServerPort: port}
	if nodeOpts.enabled {
		cpConfig.NodeName = nodeOpts.name
	}
	cp, err := controlplane.Start(ctx, cpConfig)
	if err != nil {
		return err
	}
	defer func() {
		logger.Info("Stopping the control plane")
		cp.Stop()
	}()
	if err := install.CRDs(ctx, cp.AdminConfig()); err != nil {
		return err
	}
	if err := install.Namespace(ctx, cp.AdminConfig(), opts.OperatorNamespace); err != nil {
		return err
	}
	if opts.WebhookCertDir == "" {
		opts.WebhookCertDir = filepath.Join(cp.DataDir, "webhook")
	}
	logger.Info("Control plane ready", "server", cp.URL, "logs", cp.DataDir+"/logs", "after", time.Since(started).Round(time.Millisecond))
	if nodeOpts.enabled {
		n, err := startNode(ctx, cp, nodeOpts, opts.Netns, started)
		if err != nil {
			logger.Error(err, "Running without a node: pods will be stored but not run")
		} else {
			defer func() {
				logger.Info("Stopping the node")
				n.Stop(context.WithoutCancel(ctx))
			}()
		}
	}
	if _, err := fmt.Fprintf(cmd.OutOrStdout(), "export KUBECONFIG=%s\n", cp.KubeconfigPath); err != nil {
		return fmt.Errorf("printing the kubeconfig line: %w", err)
	}
	if !nodeOpts.operator {
		logger.Info("Running without netop's operator: install it with netop manifests")
		<-ctx.Done()
		return nil
	}
	op, err := operator.New(ctx, cp.AdminConfig(), opts, be)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}

// startNode runs containerd and the kubelet and waits for the Node to be
// Ready.
func startNode(ctx context.Context, cp *controlplane.ControlPlane, o nodeOptions, netns string, started time.Time) (*node.Node, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program to run the kubelet: %w", err)
	}
	n, err := node.Start(ctx, node.Config{DataDir: cp.DataDir, Name: o.name, Kubeconfig: cp.NodeKubeconfigPath,
		ClientCAFile: cp.CACertPath, Netns: netns, Executable: self, ImageArchives: o.archives})
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		n.Stop(ctx)
		return nil, err
	}
	ready, err := n.WaitReady(ctx, kube, 2*time.Minute)
	if err != nil {
		n.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	klog.FromContext(ctx).Info("Node ready", "node", ready.Name, "containerRuntime", ready.Status.NodeInfo.ContainerRuntimeVersion,
		"kubelet", ready.Status.NodeInfo.KubeletVersion, "after", time.Since(started).Round(time.Millisecond))
	return n, nil
}
