// Package capability reads the Linux capabilities this process has, from
// /proc/self/status: what the linux backend (CAP_NET_ADMIN) and the
// standalone's node (CAP_SYS_RESOURCE) need to know before they start.
package capability

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Capabilities' bits in the capability sets.
const (
	NetAdmin    = 12
	SysResource = 24
)

// Has reports whether this process has capability c in its effective set.
func Has(c uint) (bool, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, fmt.Errorf("read capabilities: %w", err)
	}
	caps, err := parseEffective(string(status))
	if err != nil {
		return false, fmt.Errorf("read capabilities: %w", err)
	}
	return caps&(1<<c) != 0, nil
}

// parseEffective returns the effective capability set from the text of
// /proc/<pid>/status.
func parseEffective(status string) (uint64, error) {
	for line := range strings.Lines(status) {
		key, value, ok := strings.Cut(line, ":")
		if !ok || key != "CapEff" {
			continue
		}
		value = strings.TrimSpace(value)
		caps, err := strconv.ParseUint(value, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("parse CapEff %q: %w", value, err)
		}
		return caps, nil
	}
	return 0, errors.New("no CapEff line in process status")
}
