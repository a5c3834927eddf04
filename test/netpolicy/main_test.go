// Package netpolicy tests MultiNetworkPolicy against a real API server:
// the CRD's validation, its installation beside another project's, and
// what netop reports on each policy.
package netpolicy

import (
	"os"
	"testing"

	"github.com/netop-dev/netop/internal/testing/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
