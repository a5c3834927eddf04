package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parse(t *testing.T, args ...string) *Options {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestJSONFormat(t *testing.T) {
	var out bytes.Buffer
	logger, err := parse(t, "--logging-format=json", "-v=2").Logger(&out)
	if err != nil {
		t.Fatal(err)
	}
	logger.V(2).Info("Reconciled", "network", "ns/n")
	logger.V(3).Info("Too verbose")
	var line map[string]any
	if err := json.Unmarshal(out.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %q: %v", out.String(), err)
	}
	if line["msg"] != "Reconciled" || line["network"] != "ns/n" || line["v"] != float64(2) {
		t.Errorf("JSON line %v", line)
	}
}

func TestTextFormatVerbosity(t *testing.T) {
	var out bytes.Buffer
	logger, err := parse(t, "-v=1").Logger(&out)
	if err != nil {
		t.Fatal(err)
	}
	logger.V(1).Info("Shown")
	logger.V(2).Info("Hidden")
	if s := out.String(); !strings.Contains(s, `"Shown"`) || strings.Contains(s, "Hidden") {
		t.Errorf("text output %q", s)
	}
}

func TestUnknownFormat(t *testing.T) {
	if _, err := parse(t, "--logging-format=xml").Logger(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "xml") {
		t.Errorf("--logging-format=xml: %v", err)
	}
}
