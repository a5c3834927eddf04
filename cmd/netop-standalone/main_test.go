package main

import (
	"testing"

	"github.com/netop-dev/netop/internal/testing/flagdocs"
)

func TestFlagsDocumented(t *testing.T) {
	flagdocs.Check(t, newCommand(), "../../docs")
}
