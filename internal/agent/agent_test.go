package agent

import (
	"strings"
	"testing"
)

// An agent that installs the CNI plugin is ready only once it is in place:
// before, pods on its node cannot be attached.
func TestReadyWaitsForCNIInstall(t *testing.T) {
	if err := (&Agent{}).Ready(); err != nil {
		t.Errorf("agent without --install-cni: %v, want ready", err)
	}
	if err := (&Agent{cni: &CNIInstall{}}).Ready(); err == nil || !strings.Contains(err.Error(), "CNI plugin") {
		t.Errorf("agent before the install: %v, want an error naming the CNI plugin", err)
	}
}
