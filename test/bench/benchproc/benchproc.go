// Package benchproc runs the processes a bench measures (netop's
// controller, agents, operator) and reads what they cost: their metrics,
// readiness, CPU and memory.
package benchproc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// Proc is a process and the address of its /metrics and /readyz.
type Proc struct {
	cmd     *exec.Cmd
	Metrics string
}

// Start runs args with its output in logPath; it dies with the bench.
func Start(args []string, metrics, logPath string) (*Proc, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Proc{cmd: cmd, Metrics: metrics}, nil
}

// SaveProfile saves the /debug/pprof profile name (with its query, as
// "profile?seconds=10") of the process serving addr to path.
func SaveProfile(addr, name, path string) error {
	resp, err := http.Get("http://" + addr + "/debug/pprof/" + name)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/%s: %s", name, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// Stop stops the process with SIGTERM and waits for it.
func (p *Proc) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
}

// Metric sums the samples of a metric family on the process's /metrics;
// -1 if it cannot be read.
func (p *Proc) Metric(name string) float64 {
	families, err := Scrape(p.Metrics)
	if err != nil {
		return -1
	}
	return Sum(families[name], "", "")
}

// Sum is the sum of a counter or gauge family's samples whose label has
// value (all of them if label is "").
func Sum(family *dto.MetricFamily, label, value string) float64 {
	sum := 0.0
	for _, m := range family.GetMetric() {
		if label == "" || Label(m, label) == value {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return sum
}

// Scrape reads the metrics served at addr's /metrics, by family name.
func Scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// Histogram is the sum and count of a histogram's samples whose labels
// have the values in labels.
func Histogram(families map[string]*dto.MetricFamily, name string, labels map[string]string) (sum, count float64) {
	for _, m := range families[name].GetMetric() {
		matches := true
		for label, value := range labels {
			matches = matches && Label(m, label) == value
		}
		if matches {
			sum += m.GetHistogram().GetSampleSum()
			count += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, count
}

// Ready reports whether the process's /readyz answers 200.
func (p *Proc) Ready() bool {
	resp, err := http.Get("http://" + p.Metrics + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Usage is the process's CPU seconds and resident memory in MiB.
func (p *Proc) Usage() (cpu, rssMiB float64) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err == nil {
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		cpu = (utime + stime) / 100 // USER_HZ
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err == nil {
		for line := range strings.SplitSeq(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				rssMiB = kb / 1024
			}
		}
	}
	return cpu, rssMiB
}

// FreePort is a free TCP address on 127.0.0.1.
func FreePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// APIServerMetrics are the API server's own metrics, by family name.
func APIServerMetrics(ctx context.Context, kube kubernetes.Interface) (map[string]*dto.MetricFamily, error) {
	raw, err := kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("the API server's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(bytes.NewReader(raw))
}

// Label is the value of a metric's label, or "".
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
