package backend

import (
	"strings"
	"testing"
)

func TestRecordRoundTripAndTruncation(t *testing.T) {
	o := Owner{Namespace: "ns", Name: "example-network", UID: "9ec99581-a593-4fcf-a774-4ded5666c744"}
	if got, ok := ParseRecord(o.Record(255)); !ok || got != o {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	long := Owner{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("x", 253), UID: o.UID}
	rec := long.Record(255)
	got, ok := ParseRecord(rec)
	if len(rec) != 255 || !ok || got.UID != o.UID || got.Namespace != long.Namespace || !strings.HasPrefix(long.Name, got.Name) {
		t.Fatalf("truncated record %q (%d bytes) parsed as %+v %v", rec, len(rec), got, ok)
	}
	for _, bad := range []string{"", "netop:", "netop:a/b", "other:a/b/c", "netop:a/b/"} {
		if _, ok := ParseRecord(bad); ok {
			t.Errorf("ParseRecord(%q) accepted", bad)
		}
	}
}
