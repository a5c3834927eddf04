package benchplot

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// wellFormedSVG parses path as XML to its end and returns the root
// element's name and the text of every text element.
func wellFormedSVG(t *testing.T, path string) (root string, text string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	d := xml.NewDecoder(f)
	var texts strings.Builder
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
		case xml.CharData:
			texts.Write(tok)
		}
	}
	return root, texts.String()
}

func TestDrawWritesAWellFormedSVG(t *testing.T) {
	dir := t.TempDir()
	out := &Output{Dir: filepath.Join(dir, "plots"), Machine: "a test machine"}
	err := out.Draw("ratio", Chart{
		Title: "ratio to the floor", Conditions: "N = 10, 20, 40", XLabel: "Networks", YLabel: "ratio",
		Marks: true, LogX: true,
		Series: []Series{{Name: "netop", X: []float64{10, 20, 40}, Y: []float64{0.9, 1.0, 1.1}},
			Cumulative("attached", []float64{30, 10, 20}, 3)},
		Goals: []Goal{{Name: "goal", Y: 1.05}},
	})
	if err != nil {
		t.Fatal(err)
	}
	root, text := wellFormedSVG(t, filepath.Join(dir, "plots", "ratio.svg"))
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	for _, want := range []string{"ratio to the floor", "N = 10, 20, 40; a test machine;", "netop", "attached", "goal"} {
		if !strings.Contains(text, want) {
			t.Errorf("the SVG's text has no %q", want)
		}
	}
}

func TestDrawWithoutADirectoryDrawsNothing(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := (&Output{}).Draw("none", Chart{Title: "none"}); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("drew %v without a directory", entries)
	}
}

func TestSaveRefusesUnevenSeries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uneven.svg")
	err := Chart{Title: "uneven", Series: []Series{{Name: "s", X: []float64{1, 2}, Y: []float64{1}}}}.Save(path)
	if err == nil {
		t.Fatal("a series of 2 X and 1 Y was drawn")
	}
}

func TestWrapBreaksConditionsAtTheirSeparator(t *testing.T) {
	got := wrap("N = 100; 4 workers; a machine of a long name; 2026-11-28", 20)
	want := []string{"N = 100; 4 workers", "a machine of a long name", "2026-11-28"}
	if !slices.Equal(got, want) {
		t.Errorf("wrap = %q, want %q", got, want)
	}
	if got := wrap("", 20); len(got) != 0 {
		t.Errorf("wrap of nothing = %q", got)
	}
}

func TestCumulative(t *testing.T) {
	s := Cumulative("pods", []float64{3, 1, 2, 4}, 1)
	if !slices.Equal(s.X, []float64{1, 2, 3, 4}) || !slices.Equal(s.Y, []float64{0.25, 0.5, 0.75, 1}) {
		t.Errorf("Cumulative = %v, %v", s.X, s.Y)
	}
}
