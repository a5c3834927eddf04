// Package install tests netop as `netop manifests` installs it, against a
// real API server: the RBAC of the manifests is all the operator needs and
// no more (checked with SubjectAccessReviews, and by running the operator
// as its service account), and the admission webhook configurations go
// away when netop runs with its webhooks off.
package install

import (
	"os"
	"testing"

	"github.com/netop-dev/netop/internal/testing/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
