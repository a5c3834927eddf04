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
	prevBusy, prevTotal, err := cpuTicks()
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
		b, total, err := cpuTicks()
		if err != nil {
			return time.Since(start), err
		}
		if total > prevTotal {
			busy = float64(b-prevBusy) / float64(total-prevTotal)
			if busy < busyBelow {
				return time.Since(start), nil
			}
		}
		prevBusy, prevTotal = b, total
	}
	return time.Since(start), fmt.Errorf("the CPUs still %.0f %% busy after %s", busy*100, within)
}

// cpuTicks reads the machine's busy and total CPU time from /proc/stat,
// in clock ticks; waiting for I/O counts as idle.
func cpuTicks() (busy, total uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		// user nice system idle iowait irq softirq steal guest guest_nice:
		// guest time is already counted in user and nice.
		if i >= 8 {
			break
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total, nil
}
