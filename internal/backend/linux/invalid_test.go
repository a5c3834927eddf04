package linux

import (
	"errors"
	"testing"

	"github.com/netop-dev/netop/internal/backend"
)

// Addresses the kernel never assigns to a bridge fail Ensure with an error
// that wraps backend.ErrInvalid, which the controller does not retry;
// netspec refuses them earlier, so only a caller that bypasses it gets here.
func TestEnsureWrapsErrInvalid(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct{ name, cidr, gateway string }{
		{"loopback6", "::/96", "::1"},
		{"multicast6", "ff02::/64", "ff02::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := network(t, tc.name, tc.cidr, tc.gateway)
			_, err := e.b.Ensure(testContext(t), want, nil)
			if !errors.Is(err, backend.ErrInvalid) {
				t.Fatalf("Ensure(%s gw %s) = %v, want an error wrapping backend.ErrInvalid", tc.cidr, tc.gateway, err)
			}
			t.Logf("Ensure(%s gw %s): %v", tc.cidr, tc.gateway, err)
		})
	}
}
