package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the kubelet's JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // the kubelet's client metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the kubelet's version metric
	kubeproxyapp "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
)

// The node's components are the same binary, re-executed as
// `netop-standalone kubelet FLAGS` and `netop-standalone kube-proxy FLAGS`:
// each a process of its own, in the node's network namespace, as they
// expect to be (their own signal handling, flags and global state).
const (
	kubeletCommand   = "kubelet"
	kubeProxyCommand = "kube-proxy"
)

// runNodeComponent runs the component the arguments name, if they name
// one, and exits with its status.
func runNodeComponent(args []string) {
	if len(args) == 0 {
		return
	}
	switch args[0] {
	case kubeletCommand:
		c := kubeletapp.NewKubeletCommand(context.Background())
		c.SetArgs(args[1:])
		os.Exit(cli.Run(c))
	case kubeProxyCommand:
		c := kubeproxyapp.NewProxyCommand()
		c.SetArgs(args[1:])
		os.Exit(cli.Run(c))
	}
}
