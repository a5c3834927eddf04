package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/atomicfile"
	"github.com/netop-dev/netop/internal/cni/plugin"
)

// CNIInstall puts netop's CNI plugin on the agent's host, as Multus,
// Calico and Cilium agents do for theirs: the plugin binary in the
// runtime's CNI bin directory, and a kubeconfig for it. The plugin's
// credentials are not the agent's: they are tokens of a service account
// of their own that may only read pods, requested with the TokenRequest
// API and renewed before they expire, so that a file left on the host
// grants little and not for long.
type CNIInstall struct {
	// Executable is the plugin binary to install: the agent's own, which
	// runs as the plugin when called netop-cni.
	Executable string
	// BinDir is the host's CNI plugin directory (/opt/cni/bin).
	BinDir string
	// Kubeconfig is where the plugin's kubeconfig goes, the path the
	// plugin's configurations name; its token is written beside it.
	Kubeconfig string
	// Server and CAData are how the plugin reaches the API server: the
	// agent's own address of it (in a pod, the kubernetes Service).
	Server string
	CAData []byte
	// Namespace and ServiceAccount name the plugin's identity.
	Namespace, ServiceAccount string
	// Node, if set, is the node the tokens are bound to: they carry its
	// name (the claim authentication.kubernetes.io/node-name, which audit
	// logs and admission policies see) and stop working once its Node
	// object is deleted. (A token cannot be bound to the agent's pod: it
	// runs as another service account.)
	Node string
	// TokenLifetime is how long each token is requested for.
	TokenLifetime time.Duration
	Kube          kubernetes.Interface

	// installed is set once the plugin and its first token are in place.
	installed atomic.Bool
}

// Installed reports whether the plugin, its kubeconfig and a token are in
// place: before that, pods on the node cannot be attached, and the agent
// is not ready.
func (c *CNIInstall) Installed() bool { return c.installed.Load() }

// TokenPath is the file holding the plugin's current token, which the
// kubeconfig names.
func (c *CNIInstall) TokenPath() string {
	return filepath.Join(filepath.Dir(c.Kubeconfig), plugin.Type+".token")
}

// Run installs the plugin and its kubeconfig, then keeps its token fresh
// until ctx is done. A failure to install is returned at once (the agent
// is then not of use to pods on its node); a failure to renew is retried
// while the current token lasts.
func (c *CNIInstall) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("binDir", c.BinDir, "kubeconfig", c.Kubeconfig)
	if err := c.installBinary(); err != nil {
		return err
	}
	if err := c.writeKubeconfig(); err != nil {
		return err
	}
	expires, err := c.renewToken(ctx)
	if err != nil {
		return err
	}
	c.installed.Store(true)
	logger.Info("Installed the CNI plugin and its credentials", "serviceAccount", c.Namespace+"/"+c.ServiceAccount, "tokenExpires", expires)
	for {
		// Renewed at 80% of its life, as the kubelet renews projected
		// tokens; retried with backoff while the old one still holds.
		next := time.Until(expires) * 4 / 5
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(next):
		}
		backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: 1 << 30}
		err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
			e, err := c.renewToken(ctx)
			if err != nil {
				logger.Error(err, "Could not renew the CNI plugin's token; retrying", "expires", expires)
				return false, nil
			}
			expires = e
			return true, nil
		})
		if err != nil {
			return nil // ctx done
		}
	}
}

// installBinary copies Executable to BinDir/netop-cni unless it is there
// already, through a rename so that the runtime never runs half a file.
// The comparison streams both files: an agent's start should not hold two
// copies of its own binary in memory to find that nothing changed.
func (c *CNIInstall) installBinary() error {
	dst := filepath.Join(c.BinDir, plugin.Type)
	if same, err := sameContent(c.Executable, dst); err == nil && same {
		return nil
	}
	src, err := os.ReadFile(c.Executable)
	if err != nil {
		return fmt.Errorf("read the CNI plugin %s: %w", c.Executable, err)
	}
	if err := writeFile(dst, src, 0o755); err != nil {
		return fmt.Errorf("install the CNI plugin: %w", err)
	}
	return nil
}

// sameContent reports whether the files a and b hold the same bytes,
// comparing sizes first, then 64 KiB at a time.
func sameContent(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer func() { _ = fa.Close() }()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer func() { _ = fb.Close() }()
	sa, err := fa.Stat()
	if err != nil {
		return false, err
	}
	sb, err := fb.Stat()
	if err != nil {
		return false, err
	}
	if sa.Size() != sb.Size() {
		return false, nil
	}
	bufA, bufB := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, errA := io.ReadFull(fa, bufA)
		nb, errB := io.ReadFull(fb, bufB)
		if na != nb || !bytes.Equal(bufA[:na], bufB[:nb]) {
			return false, nil
		}
		if errA == io.EOF || errA == io.ErrUnexpectedEOF {
			return errB == errA, nil
		}
		if errA != nil {
			return false, errA
		}
		if errB != nil {
			return false, errB
		}
	}
}

// writeKubeconfig writes the plugin's kubeconfig, which reads its token
// from TokenPath at each use.
func (c *CNIInstall) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos[plugin.Type] = &clientcmdapi.AuthInfo{TokenFile: c.TokenPath()}
	cfg.Contexts[plugin.Type] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: plugin.Type}
	cfg.CurrentContext = plugin.Type
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode the CNI plugin's kubeconfig: %w", err)
	}
	if err := writeFile(c.Kubeconfig, data, 0o600); err != nil {
		return fmt.Errorf("write the CNI plugin's kubeconfig: %w", err)
	}
	return nil
}

// renewToken requests a new token for the plugin's service account and
// writes it; it returns when the token expires.
func (c *CNIInstall) renewToken(ctx context.Context) (time.Time, error) {
	seconds := int64(c.TokenLifetime.Seconds())
	spec := authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}
	if c.Node != "" {
		node, err := c.Kube.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
		if err != nil {
			return time.Time{}, fmt.Errorf("reading node %s to bind the CNI plugin's token to: %w", c.Node, err)
		}
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID}
	}
	tr, err := c.Kube.CoreV1().ServiceAccounts(c.Namespace).CreateToken(ctx, c.ServiceAccount, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("request a token for service account %s/%s: %w", c.Namespace, c.ServiceAccount, err)
	}
	if tr.Status.Token == "" {
		return time.Time{}, errors.New("the API server returned an empty token")
	}
	if err := writeFile(c.TokenPath(), []byte(tr.Status.Token), 0o600); err != nil {
		return time.Time{}, fmt.Errorf("write the CNI plugin's token: %w", err)
	}
	return tr.Status.ExpirationTimestamp.Time, nil
}

// writeFile writes path whole, making its directory if need be.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, data, mode)
}
