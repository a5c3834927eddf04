package plugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/go-logr/logr"
	"k8s.io/klog/v2/textlogger"

	"github.com/netop-dev/netop/internal/cni/cniapi"
)

// openLog opens the log file for one command; close releases it. With no
// logFile the logger discards.
//
// Appending, every entry is one write(2) (the text logger writes each
// whole), so the plugins the runtime runs at once for different pods do
// not interleave within lines.
func openLog(c *cniapi.Config) (log logr.Logger, closeLog func(), err error) {
	if c.LogFile == "" {
		return logr.Discard(), func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(c.LogFile), 0o700); err != nil {
		return logr.Discard(), func() {}, fmt.Errorf("logFile: %w", err)
	}
	f, err := os.OpenFile(c.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return logr.Discard(), func() {}, fmt.Errorf("logFile: %w", err)
	}
	log = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(f), textlogger.Verbosity(c.Verbosity())))
	// Unbuffered: nothing is lost if closing fails.
	return log, func() { _ = f.Close() }, nil
}

// command is one CNI command's work. Its logger is in ctx.
type command func(ctx context.Context, conf *cniapi.Config, args *skel.CmdArgs) error

// runner runs the commands as skel calls them, with logging.
type runner struct {
	// stderr gets each failure, one line: stdout is the result's (the
	// CNI error JSON on failure), and stderr is where a person running
	// the plugin by hand looks, and what libcni reports when the plugin
	// printed no result.
	stderr io.Writer
}

// cmd is the skel function of a command.
func (r runner) cmd(name string, fn command) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error { return r.run(name, fn, args) }
}

// run runs one command: it logs its start and outcome to the file and its
// failure to stderr too, and returns its error as it is, for skel to
// print.
func (r runner) run(name string, fn command, args *skel.CmdArgs) error {
	start := time.Now()
	kv := cniapi.Invocation(name, args)
	stderr := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(r.stderr))).WithValues(kv...)
	conf, err := cniapi.LoadConfig(args.StdinData)
	if err != nil {
		stderr.Error(oneLine{err}, "CNI command failed")
		return err
	}
	log, closeLog, err := openLog(conf)
	if err != nil {
		// The command goes on: a pod needs its network more than the
		// plugin needs its log.
		stderr.Error(oneLine{err}, "Not logging to the file")
	}
	defer closeLog()
	log = log.WithValues(kv...)
	// containerd asks for STATUS each time the kubelet asks it for its
	// status, every few seconds: at info it would be most of the file.
	level := cniapi.LogInfo
	if name == "STATUS" {
		level = cniapi.LogDebug
	}
	log.V(level).Info("CNI command")
	if err := fn(logr.NewContext(context.Background(), log), conf, args); err != nil {
		log.Error(oneLine{err}, "CNI command failed", "duration", time.Since(start))
		stderr.Error(oneLine{err}, "CNI command failed", "duration", time.Since(start))
		return err
	}
	log.V(level).Info("CNI command succeeded", "duration", time.Since(start))
	return nil
}

// oneLine is err on one line (joined errors take several), so that a
// failure is one line of the log to grep for, as on stderr.
type oneLine struct{ error }

func (e oneLine) Error() string { return strings.ReplaceAll(e.error.Error(), "\n", "; ") }

func (e oneLine) Unwrap() error { return e.error }
