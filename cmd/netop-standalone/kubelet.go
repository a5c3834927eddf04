package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the kubelet's JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // the kubelet's client metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the kubelet's version metric
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
)

// kubeletCommand is how the standalone runs its node's kubelet: the same
// binary, re-executed as `netop-standalone kubelet FLAGS`, a process of its
// own, as the kubelet expects to be.
const kubeletCommand = "kubelet"

// runKubelet runs the kubelet with args and exits with its status.
func runKubelet(args []string) {
	cmd := kubeletapp.NewKubeletCommand(context.Background())
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}
