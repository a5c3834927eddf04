// Command netop-standalone runs a whole Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager) and the netop operator in one
// process, so that a newcomer can kubectl apply a Network within seconds.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/controlplane"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/logging"
	"github.com/netop-dev/netop/internal/operator"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var (
		dataDir string
		port    int
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
			return run(ctx, cmd, dataDir, port, opts)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", ".netop", "Directory for the control plane's state, certificates, kubeconfig and logs. Reused on restart.")
	cmd.Flags().IntVar(&port, "apiserver-port", 0, "Port of the API server on 127.0.0.1 when the data directory has none recorded yet (0: any free port).")
	logOpts.AddFlags(cmd.Flags())
	opts.AddFlags(cmd.Flags())
	return cmd
}

func run(ctx context.Context, cmd *cobra.Command, dataDir string, port int, opts *operator.Options) error {
	logger := klog.FromContext(ctx)
	if err := opts.Validate(); err != nil {
		return err
	}
	// The backend first: missing privileges should stop us before the
	// control plane starts, not after.
	be, closeBackend, err := operator.NewBackend(ctx, opts)
	if err != nil {
		return err
	}
	defer closeBackend()
	cp, err := controlplane.Start(ctx, controlplane.Config{DataDir: dataDir, APIServerPort: port})
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
	logger.Info("Control plane ready", "server", cp.URL, "logs", cp.DataDir+"/logs")
	if _, err := fmt.Fprintf(cmd.OutOrStdout(), "export KUBECONFIG=%s\n", cp.KubeconfigPath); err != nil {
		return fmt.Errorf("printing the kubeconfig line: %w", err)
	}
	op, err := operator.New(ctx, cp.AdminConfig(), opts, be)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}
