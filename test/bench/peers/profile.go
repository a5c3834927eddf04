package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/google/pprof/profile"
)

// The bench process is both the driver and the embedded control plane, so
// its rusage cannot tell them apart. The driver's goroutines carry this
// label (goroutines they start inherit it); a CPU profile over the scenario
// then says which share of the process's CPU was the driver's. The
// reader goroutines of the client's connections, opened before the
// scenario, and the runtime's background GC count as the control plane's.
const (
	partLabel  = "part"
	partDriver = "driver"
)

// asDriver runs f with the driver's label.
func asDriver(ctx context.Context, f func(context.Context)) {
	pprof.Do(ctx, pprof.Labels(partLabel, partDriver), f)
}

// cpuProfile is the bench process's CPU profile over one scenario.
type cpuProfile struct{ buf bytes.Buffer }

func startCPUProfile() (*cpuProfile, error) {
	p := &cpuProfile{}
	if err := pprof.StartCPUProfile(&p.buf); err != nil {
		return nil, fmt.Errorf("profiling the bench process: %w", err)
	}
	return p, nil
}

// stop ends the profile, saves it at path unless path is empty, and
// returns the driver's share of the CPU it sampled.
func (p *cpuProfile) stop(path string) (float64, error) {
	pprof.StopCPUProfile()
	if path != "" {
		if err := os.WriteFile(path, p.buf.Bytes(), 0o644); err != nil {
			return 0, fmt.Errorf("saving the bench's CPU profile: %w", err)
		}
	}
	prof, err := profile.Parse(bytes.NewReader(p.buf.Bytes()))
	if err != nil {
		return 0, fmt.Errorf("reading the bench's CPU profile: %w", err)
	}
	cpu := -1
	for i, st := range prof.SampleType {
		if st.Type == "cpu" {
			cpu = i
		}
	}
	if cpu < 0 {
		return 0, fmt.Errorf("the bench's CPU profile has no cpu samples")
	}
	var driver, total int64
	for _, s := range prof.Sample {
		total += s.Value[cpu]
		if len(s.Label[partLabel]) > 0 && s.Label[partLabel][0] == partDriver {
			driver += s.Value[cpu]
		}
	}
	if total == 0 {
		return 0, nil
	}
	return float64(driver) / float64(total), nil
}
