// Package benchplot draws the curves the benches measure as SVG files
// (gonum.org/v1/plot), which BENCHMARKS.md shows. Each bench registers
// its flags with Flags and draws through Output.Draw, which names the
// machine and the date under the chart's title.
package benchplot

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Series is one curve, its points in the order they are joined.
type Series struct {
	Name string
	X, Y []float64
}

// Goal is a target drawn as a dashed horizontal line.
type Goal struct {
	Name string
	Y    float64
}

// Chart is a line chart of one or more series.
type Chart struct {
	Title string
	// Conditions say what was run (N, concurrency); Output.Draw adds the
	// machine and the date. They are printed under the title.
	Conditions     string
	XLabel, YLabel string
	// LogX puts X on a logarithmic scale, for curves whose X spans
	// decades (one IPAM 20 times slower than the other).
	LogX bool
	// Marks draws each point, for series of a few measured points.
	Marks  bool
	Series []Series
	Goals  []Goal
}

// width and height are every chart's size without its legend, which
// goes under it, out of the curves' way.
const width, height = 7 * vg.Inch, 4.5 * vg.Inch

// Save draws the chart at path, in the format its extension names (.svg
// for BENCHMARKS.md, .png to look at).
func (c Chart) Save(path string) error {
	if len(c.Series) == 0 {
		return fmt.Errorf("chart %q has no series", c.Title)
	}
	p := plot.New()
	p.Title.Text = strings.Join(append([]string{c.Title}, wrap(c.Conditions, conditionsWidth)...), "\n")
	p.X.Label.Text, p.Y.Label.Text = c.XLabel, c.YLabel
	p.Add(plotter.NewGrid())
	if c.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	for i, s := range c.Series {
		if len(s.X) != len(s.Y) || len(s.X) == 0 {
			return fmt.Errorf("chart %q, series %q: %d X and %d Y", c.Title, s.Name, len(s.X), len(s.Y))
		}
		xys := make(plotter.XYs, len(s.X))
		for k := range s.X {
			xys[k].X, xys[k].Y = s.X[k], s.Y[k]
		}
		line, marks, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("chart %q, series %q: %w", c.Title, s.Name, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		p.Add(line)
		if c.Marks {
			marks.Color, marks.Shape = line.Color, plotutil.Shape(i)
			p.Add(marks)
			legend.Add(s.Name, line, marks)
		} else {
			legend.Add(s.Name, line)
		}
	}
	for _, g := range c.Goals {
		goal := plotter.NewFunction(func(float64) float64 { return g.Y })
		goal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(goal)
		legend.Add(g.Name, goal)
		p.Y.Max = math.Max(p.Y.Max, g.Y)
		p.Y.Min = math.Min(p.Y.Min, g.Y)
	}
	// A little room above the highest curve or goal, which would
	// otherwise run along the frame.
	p.Y.Max += (p.Y.Max - p.Y.Min) * 0.05
	legendHeight := legend.Rectangle(draw.Canvas{}).Size().Y + vg.Points(8)
	canvas, err := draw.NewFormattedCanvas(width, height+legendHeight, strings.TrimPrefix(filepath.Ext(path), "."))
	if err != nil {
		return fmt.Errorf("drawing %s: %w", path, err)
	}
	whole := draw.New(canvas)
	p.Draw(draw.Crop(whole, 0, 0, legendHeight, 0))
	legend.XOffs = vg.Points(10)
	legend.Draw(draw.Crop(whole, 0, 0, 0, -height))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// conditionsWidth is the most characters of conditions on one line under
// the title: a longer line would run off the chart.
const conditionsWidth = 100

// wrap breaks text into lines of at most width characters at "; ", the
// separator of conditions; a part longer than width stays whole.
func wrap(text string, width int) []string {
	var lines []string
	for _, part := range strings.Split(text, "; ") {
		if part == "" {
			continue
		}
		if n := len(lines) - 1; n >= 0 && len(lines[n])+len("; ")+len(part) <= width {
			lines[n] += "; " + part
			continue
		}
		lines = append(lines, part)
	}
	return lines
}

// Cumulative is the curve of how many of values are at most each of them:
// values sorted, against 1..n scaled so that the last point is total (n
// for a count of pods, 1 for a share).
func Cumulative(name string, values []float64, total float64) Series {
	s := Series{Name: name, X: slices.Sorted(slices.Values(values)), Y: make([]float64, len(values))}
	for k := range s.Y {
		s.Y[k] = float64(k+1) * total / float64(len(values))
	}
	return s
}

// Output is where a bench draws its charts and the machine it names.
type Output struct {
	Dir     string
	Machine string
}

// Flags registers --plot-dir and --plot-machine on fs.
func Flags(fs *flag.FlagSet) *Output {
	o := &Output{}
	fs.StringVar(&o.Dir, "plot-dir", "", "draw the bench's curves as SVG files in this directory (BENCHMARKS.md's are in docs/benchmarks); empty: none")
	fs.StringVar(&o.Machine, "plot-machine", Machine(), "the machine the charts name under their titles")
	return o
}

// Draw saves c as DIR/name.svg, its conditions followed by the machine,
// its load and today's date (UTC); without a directory it draws nothing.
func (o *Output) Draw(name string, c Chart) error {
	if o == nil || o.Dir == "" {
		return nil
	}
	var conditions []string
	for _, s := range []string{c.Conditions, o.Machine, load(), time.Now().UTC().Format(time.DateOnly)} {
		if s != "" {
			conditions = append(conditions, s)
		}
	}
	c.Conditions = strings.Join(conditions, "; ")
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return fmt.Errorf("--plot-dir: %w", err)
	}
	path := filepath.Join(o.Dir, name+".svg")
	if err := c.Save(path); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "drew %s\n", path)
	return nil
}

// load is the machine's load average over the last 15 minutes, the bench
// included (/proc/loadavg): on a shared machine it says how shared.
func load() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(raw))
	if len(fields) < 3 {
		return ""
	}
	return "load average " + fields[2] + " over 15 min"
}

// Machine names the CPU by its model (/proc/cpuinfo) and its cores.
func Machine() string {
	model := runtime.GOARCH
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer func() { _ = f.Close() }()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores", model, runtime.NumCPU())
}
