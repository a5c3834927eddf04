// Package admission tests netop's webhooks registered for real with a real
// API server: every request below goes through kube-apiserver, which calls
// the webhooks the operator registered, as kubectl's would.
package admission

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

const operatorNamespace = "netop-system"

// webhookAddr is where the operator's webhook server listens.
var webhookAddr string

// operatorNetns is the network namespace of the operator's bridges.
var operatorNetns string

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, startOperator)) }

// startOperator runs one operator, with its webhooks registered, for the
// whole test binary. Without root there is no backend, and every test skips.
func startOperator(env *testenv.Env) (func(), error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	logFile, err := os.CreateTemp("", "netop-admission-test-*.log")
	if err != nil {
		cancel()
		return nil, err
	}
	ctx = klog.NewContext(ctx, textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(2))))
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}, metav1.CreateOptions{}); err != nil {
		cancel()
		return nil, err
	}
	netns := nettest.NetnsName("netop-a-")
	operatorNetns = netns
	certDir, err := os.MkdirTemp("", "netop-webhook-")
	if err != nil {
		cancel()
		return nil, err
	}
	opts := operator.NewOptions()
	opts.Backend.Netns = netns
	opts.Metrics.Addr = "0"
	opts.Webhooks.Addr = "127.0.0.1:0"
	opts.Webhooks.Local = true
	opts.Webhooks.CertDir = certDir
	opts.OperatorNamespace = operatorNamespace
	opts.Client.QPS, opts.Client.Burst = 500, 1000
	op, err := operator.New(ctx, env.Config, opts, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- op.Run(ctx) }()
	teardown := func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintf(os.Stderr, "netop stopped with an error: %v\n", err)
		}
		_ = nettest.DeleteNetns(netns)
		_ = os.RemoveAll(certDir)
		_ = logFile.Close()
		_ = os.Remove(logFile.Name())
	}
	// Registered and answering: the operator probes the API server.
	select {
	case <-op.AdmissionInForce():
	case <-time.After(60 * time.Second):
		teardown()
		logs, _ := os.ReadFile(logFile.Name())
		return nil, fmt.Errorf("webhooks never answered\n%s", logs)
	}
	vwc, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "netop", metav1.GetOptions{})
	if err != nil {
		teardown()
		return nil, err
	}
	u, err := url.Parse(*vwc.Webhooks[0].ClientConfig.URL)
	if err != nil {
		teardown()
		return nil, err
	}
	webhookAddr = u.Host
	return teardown, nil
}
