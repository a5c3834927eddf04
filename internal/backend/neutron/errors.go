package neutron

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/netop-dev/netop/internal/backend"
)

// APIError is a request that Neutron answered with an error status. Its
// message is Neutron's own explanation (the NeutronError body), which is
// what a person reading the Network's status needs; the gophercloud error
// it wraps has the full request and response.
type APIError struct {
	StatusCode int
	// Type is Neutron's name for the error, e.g. "NetworkInUse" or
	// "GatewayConflictWithAllocationPools"; empty if the body was not a
	// NeutronError.
	Type    string
	Message string
	err     error
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "neutron answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Type != "" {
		fmt.Fprintf(&b, " (%s)", e.Type)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

func (e *APIError) Unwrap() error { return e.err }

// Is makes a 400 Bad Request match backend.ErrInvalid: Neutron refuses the
// request as written (an invalid cidr, a gateway it will not take), and
// sending it again cannot help. Conflicts, quota and server errors stay
// retryable.
func (e *APIError) Is(target error) bool {
	return target == backend.ErrInvalid && e.StatusCode == http.StatusBadRequest
}

// maxBodyInMessage bounds how much of a body that is not a NeutronError
// (a proxy's HTML page, say) goes into an error message.
const maxBodyInMessage = 300

// wrap adds what netop was doing to err and, for an error status, replaces
// gophercloud's message (which dumps the whole body) by Neutron's own.
func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	what := fmt.Sprintf(format, args...)
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) {
		return fmt.Errorf("%s: %w", what, apiError(code, err))
	}
	return fmt.Errorf("%s: %w", what, err)
}

func apiError(code gophercloud.ErrUnexpectedResponseCode, err error) *APIError {
	e := &APIError{StatusCode: code.Actual, err: err}
	var body struct {
		NeutronError *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			Detail  string `json:"detail"`
		} `json:"NeutronError"`
	}
	if json.Unmarshal(code.Body, &body) == nil && body.NeutronError != nil {
		e.Type = body.NeutronError.Type
		e.Message = body.NeutronError.Message
		if d := body.NeutronError.Detail; d != "" && !strings.Contains(e.Message, d) {
			e.Message += " (" + d + ")"
		}
		return e
	}
	msg := strings.Join(strings.Fields(string(code.Body)), " ")
	if len(msg) > maxBodyInMessage {
		msg = msg[:maxBodyInMessage] + "..."
	}
	e.Message = msg
	return e
}

// isNotFound reports whether err is Neutron's 404 for a missing resource.
func isNotFound(err error) bool {
	return gophercloud.ResponseCodeIs(err, http.StatusNotFound)
}
