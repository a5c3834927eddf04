package main

import (
	"testing"

	"github.com/netop-dev/netop/internal/testing/flagdocs"
)

// Each role shows the flags of what it runs, and nothing else.
func TestRolesTakeTheirOwnFlags(t *testing.T) {
	root := newRootCommand()
	for _, tc := range []struct {
		command string
		has     []string
		lacks   []string
	}{
		{"agent", []string{"node-name", "install-cni", "netns", "kube-api-qps", "metrics-addr", "cri-socket", "cni-data-dir"},
			[]string{"webhook-addr", "ats", "initialize-workloads", "leader-elect", "backend", "deployment-networks"}},
		{"controller", []string{"webhook-addr", "ats", "leader-elect", "backend", "neutron-endpoint"},
			[]string{"node-name", "install-cni", "cni-bin-dir", "netns", "cri-socket"}},
		{"run", []string{"webhook-addr", "ats", "backend", "netns"},
			[]string{"node-name", "install-cni"}},
	} {
		cmd, _, err := root.Find([]string{tc.command})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range tc.has {
			if cmd.Flags().Lookup(name) == nil {
				t.Errorf("netop %s has no --%s", tc.command, name)
			}
		}
		for _, name := range tc.lacks {
			if cmd.Flags().Lookup(name) != nil {
				t.Errorf("netop %s takes --%s, which nothing it runs uses", tc.command, name)
			}
		}
	}
}

func TestFlagsDocumented(t *testing.T) {
	flagdocs.Check(t, newRootCommand(), "../../docs")
}
