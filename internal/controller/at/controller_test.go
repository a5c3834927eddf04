package at

import (
	"testing"
	"time"
)

// The CRD's date-time format accepts RFC 3339 in either case; so does the
// controller, and it names the field of a schedule it cannot read.
func TestParseSchedule(t *testing.T) {
	want := time.Date(2019, 7, 3, 2, 0, 0, 0, time.UTC)
	for _, s := range []string{"2019-07-03T02:00:00Z", "2019-07-03t02:00:00z", "2019-07-03T04:00:00+02:00"} {
		if got, err := ParseSchedule(s); err != nil || !got.Equal(want) {
			t.Errorf("ParseSchedule(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := ParseSchedule("tomorrow"); err == nil || err.Error()[:14] != "spec.schedule " {
		t.Errorf("ParseSchedule(tomorrow) = %v, want an error naming spec.schedule", err)
	}
}
