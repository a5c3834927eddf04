package neutron

import (
	"errors"
	"net/http"
	"testing"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/netop-dev/netop/internal/backend"
)

// Only Neutron's 400 is an error no retry can fix; the controller reports
// it as Invalid instead of retrying it forever.
func TestBadRequestIsInvalid(t *testing.T) {
	for code, invalid := range map[int]bool{
		http.StatusBadRequest:          true,
		http.StatusConflict:            false,
		http.StatusNotFound:            false,
		http.StatusInternalServerError: false,
		http.StatusServiceUnavailable:  false,
	} {
		err := wrap(gophercloud.ErrUnexpectedResponseCode{Actual: code,
			Body: []byte(`{"NeutronError": {"type": "HTTPBadRequest", "message": "Invalid input for cidr.", "detail": ""}}`)}, "create subnet")
		if got := errors.Is(err, backend.ErrInvalid); got != invalid {
			t.Errorf("%d: errors.Is(ErrInvalid) = %v, want %v (%v)", code, got, invalid, err)
		}
	}
}
