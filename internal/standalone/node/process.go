package node

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// process is a child process whose output goes to a log file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// startProcess runs name with args, its output appended to logPath. The
// child gets deathSignal if the standalone dies without stopping it.
func startProcess(name, logPath string, args []string, deathSignal syscall.Signal) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group: the terminal's Ctrl-C reaches the
	// standalone alone, which stops the node in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: deathSignal, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		p.mu.Lock()
		p.err = err
		if err == nil {
			p.err = fmt.Errorf("%s exited", name)
		}
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// exited returns why the process ended, or nil while it runs.
func (p *process) exited() error {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.err
	default:
		return nil
	}
}

// stop sends SIGTERM and waits for the process, killing it after timeout.
func (p *process) stop(timeout time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// isDynamic reports whether an ELF binary needs a dynamic loader: such a
// binary cannot be the only file of an image.
func isDynamic(binary []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(binary))
	if err != nil {
		return true
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}
