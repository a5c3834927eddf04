package benchproc

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Settle waits until the machine's CPUs are busy less than busyBelow (a
// share, 0 to 1) over half a second, for at most within, and returns how
// long it waited. What a round leaves to the kernel and the control plane
// (network namespaces torn down asynchronously, pods and leases collected)
// would otherwise be paid by whichever round comes next. Not settled
// within, it says so; the caller decides whether to go on.
func Settle(ctx context.Context, busyBelow float64, within time.Duration) (time.Duration, error) {
	start := time.Now()
	prev, err := ReadCPU()
	if err != nil {
		return 0, err
	}
	var busy float64
	for time.Since(start) < within {
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		now, err := ReadCPU()
		if err != nil {
			return time.Since(start), err
		}
		if now.Total > prev.Total {
			busy = float64(now.Busy-prev.Busy) / float64(now.Total-prev.Total)
			if busy < busyBelow {
				return time.Since(start), nil
			}
		}
		prev = now
	}
	return time.Since(start), fmt.Errorf("the CPUs still %.0f %% busy after %s", busy*100, within)
}

// CPUTicks is the machine's CPU time from /proc/stat, in clock ticks:
// busy, stolen by the hypervisor (steal), and all.
type CPUTicks struct{ Busy, Steal, Total uint64 }

// ReadCPU reads the machine's CPU time; waiting for I/O counts as idle.
func ReadCPU() (CPUTicks, error) {
	var t CPUTicks
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return t, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return t, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return t, fmt.Errorf("/proc/stat: %w", err)
		}
		// user nice system idle iowait irq softirq steal guest guest_nice:
		// guest time is already counted in user and nice.
		if i >= 8 {
			break
		}
		t.Total += n
		switch i {
		case 3, 4:
		case 7:
			t.Steal += n
		default:
			t.Busy += n
		}
	}
	return t, nil
}

// StealShare is the share of the machine's time the hypervisor took
// between before and t: when it is high, everything measured then was
// slower, whatever ran.
func (t CPUTicks) StealShare(before CPUTicks) float64 {
	if t.Total <= before.Total {
		return 0
	}
	return float64(t.Steal-before.Steal) / float64(t.Total-before.Total)
}
