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
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// The file's verbosities. A logr logger always writes errors and V(0), so
// the levels start at 1 to let logLevel "error" leave out the rest.
const (
	// vInfo: each command, its outcome, what it attached or detached.
	vInfo = 1
	// vDebug: the steps on the way.
	vDebug = 2
)

// logLevels are logLevel's values (Multus's names where they mean the
// same) and the verbosity each writes.
var logLevels = map[string]int{"error": 0, "info": vInfo, "debug": vDebug}

// defaultLogLevel: a log file someone configured should say what each
// command did, without the steps.
const defaultLogLevel = "info"

// parseLogging checks logFile and logLevel and sets the verbosity.
func (c *Config) parseLogging() error {
	if c.LogFile != "" && !filepath.IsAbs(c.LogFile) {
		// Relative to the runtime's working directory is nowhere anyone
		// would look.
		return fmt.Errorf("network configuration: logFile: %q: must be an absolute path", c.LogFile)
	}
	level := strings.ToLower(c.LogLevel)
	if level == "" {
		level = defaultLogLevel
	}
	v, ok := logLevels[level]
	if !ok {
		return fmt.Errorf("network configuration: logLevel: %q: must be error, info or debug", c.LogLevel)
	}
	c.verbosity = v
	return nil
}

// openLog opens the log file for one command; close releases it. With no
// logFile the logger discards.
//
// Appending, every entry is one write(2) (the text logger writes each
// whole), so the plugins the runtime runs at once for different pods do
// not interleave within lines.
func (c *Config) openLog() (log logr.Logger, closeLog func(), err error) {
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
	log = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(f), textlogger.Verbosity(c.verbosity)))
	// Unbuffered: nothing is lost if closing fails.
	return log, func() { _ = f.Close() }, nil
}

// Invocation is what every line of a command says about it, here and on
// the node side: the command, and the container and pod it is for (GC and
// STATUS have neither).
func Invocation(command string, args *skel.CmdArgs) []any {
	kv := []any{"command", command}
	for _, f := range []struct{ key, value string }{
		{"containerID", args.ContainerID}, {"netns", args.Netns}, {"ifname", args.IfName},
	} {
		if f.value != "" {
			kv = append(kv, f.key, f.value)
		}
	}
	if pa, err := LoadPodArgs(args.Args); err == nil && pa.K8S_POD_NAME != "" {
		// A malformed CNI_ARGS is ADD's error to report, not the log's.
		kv = append(kv, "pod", klog.KRef(string(pa.K8S_POD_NAMESPACE), string(pa.K8S_POD_NAME)))
	}
	return kv
}

// command is one CNI command's work. Its logger is in ctx.
type command func(ctx context.Context, conf *Config, args *skel.CmdArgs) error

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
	kv := Invocation(name, args)
	stderr := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(r.stderr))).WithValues(kv...)
	conf, err := LoadConfig(args.StdinData)
	if err != nil {
		stderr.Error(oneLine{err}, "CNI command failed")
		return err
	}
	log, closeLog, err := conf.openLog()
	if err != nil {
		// The command goes on: a pod needs its network more than the
		// plugin needs its log.
		stderr.Error(oneLine{err}, "Not logging to the file")
	}
	defer closeLog()
	log = log.WithValues(kv...)
	// containerd asks for STATUS each time the kubelet asks it for its
	// status, every few seconds: at info it would be most of the file.
	level := vInfo
	if name == "STATUS" {
		level = vDebug
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
