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

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/cni/plugin"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/logging"
	"github.com/netop-dev/netop/internal/migrate"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/version"
)

func main() {
	// Installed on a node under the plugin's name, netop is its CNI
	// plugin: one image carries the operator and the plugin.
	if filepath.Base(os.Args[0]) == cniapi.Type {
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

	root.AddCommand(
		newRunCommand(logOpts, operator.RoleAll, "run", "Run all of netop in one process: controllers, webhooks and the bridges of the node it runs on"),
		newRunCommand(logOpts, operator.RoleController, "controller", "Run the cluster-wide controller: Network status, admission webhooks, address allocation, Neutron; the bridges are the agents'"),
		newRunCommand(logOpts, operator.RoleAgent, "agent", "Run the node agent: this node's bridges, their repair and sweeping, and its report to the controller"),
		&cobra.Command{
			Use:   "version",
			Short: "Print netop's version",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
				return err
			},
		}, newManifestsCommand(), newMigrateStorageCommand(logOpts))
	return root
}

func newManifestsCommand() *cobra.Command {
	o := config.Options{Image: config.DefaultImage, CNIBinDir: config.DefaultCNIBinDir}
	cmd := &cobra.Command{
		Use:   "manifests",
		Short: "Print the manifests that install netop on a cluster, for kubectl apply -f -: CRDs, RBAC, the controller Deployment and the agent DaemonSet",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := name.ParseReference(o.Image, name.StrictValidation); err != nil {
				return fmt.Errorf("--image %q: %w", o.Image, err)
			}
			if dir := o.CNIBinDir; !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
				return fmt.Errorf("--cni-bin-dir %q: must be a clean absolute path on the nodes", dir)
			}
			_, err := cmd.OutOrStdout().Write(config.All(o))
			return err
		},
	}
	cmd.Flags().StringVar(&o.Image, "image", o.Image, "The netop image the controller and the agents run, as `make image` prints it.")
	cmd.Flags().StringVar(&o.CNIBinDir, "cni-bin-dir", o.CNIBinDir, "The nodes' CNI plugin directory (their container runtime's), where the agents install netop-cni.")
	cmd.Flags().BoolVar(&o.WithoutSharedCRDs, "without-multi-networkpolicy-crd", o.WithoutSharedCRDs, "Leave out the MultiNetworkPolicy CRD (k8s.cni.cncf.io), where another project (multi-networkpolicy) installed it: applying netop's would replace its definition. netop works with either.")
	return cmd
}

func newMigrateStorageCommand(logOpts *logging.Options) *cobra.Command {
	clientFlags := &kubeclient.ConfigFlags{}
	crd := admission.NetworkCRD
	cmd := &cobra.Command{
		Use:   "migrate-storage",
		Short: "Rewrite every stored object of a CRD (Networks) in its storage version, then drop the other versions from its status.storedVersions, as kube-storage-version-migrator does",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withCluster(logOpts, clientFlags, func(ctx context.Context, cfg *rest.Config) error {
				crds, err := apiextensionsclient.NewForConfig(cfg)
				if err != nil {
					return err
				}
				dyn, err := dynamic.NewForConfig(cfg)
				if err != nil {
					return err
				}
				res, err := migrate.Storage(ctx, crds, dyn, crd)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %d objects stored in %s (%d changed by others meanwhile); storedVersions %v -> [%s]\n",
					crd, res.Rewritten+res.Changed, res.StorageVersion, res.Changed, res.StoredVersions, res.StorageVersion)
				return err
			})
		},
	}
	clientFlags.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&crd, "crd", crd, "The CustomResourceDefinition whose objects to migrate.")
	return cmd
}

// withCluster sets up logging, reads the client configuration and runs f
// until it returns or SIGINT or SIGTERM arrives.
func withCluster(logOpts *logging.Options, clientFlags *kubeclient.ConfigFlags, f func(context.Context, *rest.Config) error) error {
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
	return f(klog.NewContext(ctx, logger), cfg)
}

func newRunCommand(logOpts *logging.Options, role operator.Role, use, short string) *cobra.Command {
	clientFlags := &kubeclient.ConfigFlags{}
	opts := operator.NewOptions()
	opts.Role = role
	// A controller may have several replicas, as Kubernetes' own
	// controllers default to; there is one agent per node.
	opts.Leader.Elect = role != operator.RoleAgent
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return withCluster(logOpts, clientFlags, func(ctx context.Context, cfg *rest.Config) error {
				op, err := operator.New(ctx, cfg, opts, nil)
				if err != nil {
					return err
				}
				return op.Run(ctx)
			})
		},
	}
	clientFlags.AddFlags(cmd.Flags())
	opts.AddFlags(cmd.Flags(), role)
	return cmd
}
