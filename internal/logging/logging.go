// Package logging sets up logging the same way for both binaries, with
// Kubernetes' own logging flags (k8s.io/component-base/logs): -v, --vmodule
// and --logging-format=text|json, so that netop's logs read and parse like
// every other component's.
package logging

import (
	"fmt"
	"io"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	logsjson "k8s.io/component-base/logs/json"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	// Registers the json format with logsapi.
	_ "k8s.io/component-base/logs/json/register"
)

// Options are the logging flags.
type Options struct {
	config *logsapi.LoggingConfiguration
}

// NewOptions returns the defaults: text, verbosity 0.
func NewOptions() *Options { return &Options{config: logsapi.NewLoggingConfiguration()} }

// AddFlags adds -v, --vmodule, --logging-format and their companions.
func (o *Options) AddFlags(fs *pflag.FlagSet) { logsapi.AddFlags(o.config, fs) }

// Apply makes the flags klog's process-wide configuration, so that every
// log line of the process (client-go's included) follows them, and returns
// the logger to put into the root context.
func (o *Options) Apply() (logr.Logger, error) {
	if err := logsapi.ValidateAndApply(o.config, nil); err != nil {
		return logr.Logger{}, fmt.Errorf("logging flags: %w", err)
	}
	return klog.Background(), nil
}

// Logger returns a logger that follows the flags and writes to w, without
// touching klog's process-wide configuration: netop-standalone keeps the
// embedded Kubernetes components' klog output in its log file and gives
// the operator this logger.
func (o *Options) Logger(w io.Writer) (logr.Logger, error) {
	if errs := logsapi.Validate(o.config, nil, nil); len(errs) > 0 {
		return logr.Logger{}, fmt.Errorf("logging flags: %w", errs.ToAggregate())
	}
	if o.config.Format == logsapi.JSONLogFormat {
		sync := logsjson.AddNopSync(w)
		logger, _ := logsjson.NewJSONLogger(o.config.Verbosity, sync, sync, nil)
		return logger, nil
	}
	cfg := textlogger.NewConfig(textlogger.Verbosity(int(o.config.Verbosity)), textlogger.Output(w))
	for _, m := range o.config.VModule {
		if err := cfg.VModule().Set(fmt.Sprintf("%s=%d", m.FilePattern, m.Verbosity)); err != nil {
			return logr.Logger{}, fmt.Errorf("--vmodule: %w", err)
		}
	}
	return textlogger.NewLogger(cfg), nil
}

// Flush writes buffered log lines out; call it before the process exits.
func Flush() { klog.Flush() }
