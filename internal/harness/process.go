package harness

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is one run of a broker's binary (or of epmd), started by the
// harness and stopped by its PID.
type process struct {
	name    string
	logFile string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been reaped
}

// spawn starts argv with its output appended to logFile, in dir (if set)
// with env (if set). On Linux, if the test binary dies without cleaning
// up, so does the child (childAttr).
func spawn(name, logFile, dir string, env []string, argv ...string) (*process, error) {
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logFile: logFile, cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(p.exited) }()
	return p, nil
}

// hasExited says whether the process is gone.
func (p *process) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, then SIGKILL if the process has not exited within
// wait; it says whether SIGKILL was needed.
func (p *process) stop(wait time.Duration) (killed bool) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return false
	case <-time.After(wait):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	return true
}

// startProcess spawns a process that lives as long as tb: when tb ends it
// is stopped (SIGTERM, then SIGKILL after stopWait), and if tb failed the
// end of its log is logged. Cleanups run last-in first-out, so a process
// started later is stopped first.
func startProcess(tb TB, name, logFile, dir string, env []string, stopWait time.Duration, argv ...string) *process {
	tb.Helper()
	p, err := spawn(name, logFile, dir, env, argv...)
	must(tb, err, name)
	tb.Cleanup(func() {
		if p.stop(stopWait) {
			tb.Logf("%s did not stop within %s of SIGTERM: SIGKILL", name, stopWait)
		}
		if tb.Failed() {
			tb.Logf("%s log (%s), last lines:\n%s", name, logFile, tail(logFile, 150))
		}
	})
	return p
}

// waitReady polls ready (given the process's log so far) until it holds;
// it fails tb if the process exits first or timeout passes.
func (p *process) waitReady(tb TB, timeout time.Duration, ready func(log []byte) bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p.hasExited() {
			tb.Fatalf("%s exited during start-up:\n%s", p.name, tail(p.logFile, 80))
		}
		b, _ := os.ReadFile(p.logFile)
		if ready(b) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not ready after %s:\n%s", p.name, timeout, tail(p.logFile, 80))
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by the deadline
	}
}

// Program is a program a test runs as a child process (one of the
// repository's example programs or commands, as a user would run it),
// known by its PID, its output appended to a log file.
type Program struct{ p *process }

// StartProgram starts argv with its output appended to logFile, in this
// process's environment. When tb ends it is stopped (SIGTERM, then SIGKILL
// after 10 s), and if tb failed the end of its log is logged.
func StartProgram(tb TB, name, logFile string, argv ...string) *Program {
	tb.Helper()
	return &Program{startProcess(tb, name, logFile, "", nil, 10*time.Second, argv...)}
}

// Kill kills the program with SIGKILL, as a crash or a power cut would,
// and waits until it is reaped.
func (p *Program) Kill() {
	_ = p.p.cmd.Process.Kill()
	<-p.p.exited
}

// Exited says whether the program has ended.
func (p *Program) Exited() bool { return p.p.hasExited() }

// Pid is the program's process id.
func (p *Program) Pid() int { return p.p.cmd.Process.Pid }
