// Command netop is the Network operator for any Kubernetes cluster. It is
// built on client-go alone, so that its image stays small.
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

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/cni/plugin"
	"github.com/netop-dev/netop/internal/logging"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/version"
)

func main() {
	// Installed on a node under the plugin's name, netop is its CNI
	// plugin: one image carries the operator and the plugin.
	if filepath.Base(os.Args[0]) == plugin.Type {
		plugin.Main()
		return
	}
	if err := newRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "netop",
		Short:         "netop manages Networks (samplecrd.k8s.io/v1) declaratively",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	logOpts := logging.NewOptions()
	logOpts.AddFlags(root.PersistentFlags())

	root.AddCommand(newRunCommand(logOpts), &cobra.Command{
		Use:   "version",
		Short: "Print netop's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	}, &cobra.Command{
		Use:   "manifests",
		Short: "Print the CRD, RBAC and Deployment manifests, for kubectl apply -f -",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			_, _ = cmd.OutOrStdout().Write(config.All())
		},
	})
	return root
}

func newRunCommand(logOpts *logging.Options) *cobra.Command {
	clientFlags := &operator.ClientConfigFlags{}
	opts := operator.NewOptions()
	// In a cluster there may be several replicas, as Kubernetes' own
	// controllers default to.
	opts.LeaderElect = true
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the operator against a cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := logOpts.Apply()
			if err != nil {
				return err
			}
			defer logging.Flush()
			cfg, err := clientFlags.RESTConfig()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return operator.Run(klog.NewContext(ctx, logger), cfg, opts)
		},
	}
	clientFlags.AddFlags(cmd.Flags())
	opts.AddFlags(cmd.Flags())
	return cmd
}
