// Package powerfs gives a test a directory that loses power: a FUSE mount
// over a backing directory that remembers every write and size change since
// each file's last fsync (and every name change since its directory's), and
// on a cut throws them away, so that the files are left as they were at
// their last sync. A torn cut keeps a random subset of the unsynced 4 KiB
// pages instead. It is LazyFS's idea (the FUSE file system Jepsen uses to
// find lost writes), for SQLite's files. README.md says what it models and
// what it does not.
//
// The file system runs in a helper process of its own
// (internal/powerfs/cmd/powerfs, built by Start), outside the -race test
// binary; this package starts it and drives it over a pipe. Like
// internal/harness it does not import "testing": it takes a TB.
//
// Where it cannot run (not Linux, GOARCH=arm, no /dev/fuse, a mount that
// fails, -short), Start skips the test with a line saying why. A program
// (outboxlab bench) uses Mount instead, and counts what its database asks
// of the storage with Counts; Options.FsyncDelay makes the storage slow to
// sync, as an SD card is.
package powerfs

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// TB is the part of testing.TB that powerfs uses.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Skipf(format string, args ...any)
	Failed() bool
	TempDir() string
}

// EnvBin, if set, names a powerfs binary already built (go build
// ./internal/powerfs/cmd/powerfs); otherwise Start builds one.
const EnvBin = "OUTBOX_POWERFS_BIN"

// EnvDebug, if set, has the helper log every FUSE request to its log.
const EnvDebug = "OUTBOX_POWERFS_DEBUG"

const helperPkg = "github.com/edgeoutbox/outbox/internal/powerfs/cmd/powerfs"

// replyTimeout bounds how long a mount, a cut or an unmount may take: long
// only if the helper hangs.
const replyTimeout = time.Minute

// ErrUnavailable is what Mount returns where powerfs cannot run (and why):
// not Linux, GOARCH=arm, no /dev/fuse, or the mount failed.
var ErrUnavailable = errors.New("powerfs cannot run here")

// Options are a file system's settings.
type Options struct {
	// FsyncDelay makes every fsync, fdatasync and directory fsync through
	// the mount take at least this long, as on an SD card, whose
	// controller takes milliseconds to program its flash; the caller
	// waits, other requests go on meanwhile. Zero: a sync is instant.
	FsyncDelay time.Duration
}

// FileCounts is what went through the mount to the files of one name
// (relative to the mountpoint; "." is its root directory) since it was
// first mounted.
type FileCounts struct {
	Writes int64 `json:"writes"` // write requests
	Bytes  int64 `json:"bytes"`  // bytes written
	// Pages is how many 4 KiB pages syncs made durable: those written
	// since the file's previous sync, each once however often it was
	// written, as a file system writes its dirty pages back at an fsync.
	Pages  int64 `json:"pages"`
	Fsyncs int64 `json:"fsyncs"` // fsync and fdatasync; fsyncdir for a directory
	// Dirty is how many pages are written and not synced now: what a file
	// system would write back later on its own.
	Dirty int64 `json:"dirty"`
}

// FS is a running power-loss file system.
type FS struct {
	tb         TB
	mountpoint string
	logFile    string
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	replies    chan string // the helper's lines; closed when it exits
	exited     chan struct{}
	closed     bool
	dropped    int64
	cuts       int
}

// Start mounts a power-loss file system over backingDir (which must exist)
// and returns it; Mountpoint says where. It is closed when tb ends. It
// skips tb where it cannot run.
func Start(tb TB, backingDir string) *FS {
	tb.Helper()
	return StartOptions(tb, backingDir, Options{})
}

// StartOptions is Start with options.
func StartOptions(tb TB, backingDir string, opts Options) *FS {
	tb.Helper()
	if err := available(); err != nil {
		tb.Skipf("%v", err)
	}
	bin, err := helperBinary(tb.TempDir())
	if err != nil {
		tb.Fatalf("%v", err)
	}
	f, err := launch(bin, backingDir, tb.TempDir(), opts)
	if errors.Is(err, ErrUnavailable) {
		tb.Skipf("%v", err)
	}
	if err != nil {
		tb.Fatalf("%v", err)
	}
	f.tb = tb
	tb.Cleanup(f.Close)
	return f
}

// Mount is Start for a program: it mounts over backingDir, keeping its
// mountpoint, log and helper binary in dir, and the caller closes it. Cut
// and CutTorn are for tests (Start). Where it cannot run, the error is
// ErrUnavailable, saying why: so is a helper that cannot be built (no Go
// toolchain, or not run from the module).
func Mount(backingDir, dir string, opts Options) (*FS, error) {
	if err := available(); err != nil {
		return nil, err
	}
	bin, err := helperBinary(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return launch(bin, backingDir, dir, opts)
}

// available says why powerfs cannot run here, if it cannot.
func available() error {
	if runtime.GOOS != "linux" || runtime.GOARCH == "arm" {
		return fmt.Errorf("%w: no FUSE file system on %s/%s (go-fuse does not build for arm)", ErrUnavailable, runtime.GOOS, runtime.GOARCH)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("%w: no /dev/fuse on this host (%v)", ErrUnavailable, err)
	}
	return nil
}

// launch starts the helper bin over backingDir, with its mountpoint and
// log in dir.
func launch(bin, backingDir, dir string, opts Options) (*FS, error) {
	f := &FS{
		mountpoint: filepath.Join(dir, "mnt"),
		logFile:    filepath.Join(dir, "powerfs.log"),
		// Buffered: a reply that comes after its request gave up
		// must not block the helper's exit.
		replies: make(chan string, 16),
		exited:  make(chan struct{}),
	}
	if err := os.Mkdir(f.mountpoint, 0o755); err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	logf, err := os.Create(f.logFile)
	if err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	defer logf.Close() // the helper has its own copy
	args := []string{"-backing", backingDir, "-mount", f.mountpoint}
	if os.Getenv(EnvDebug) != "" {
		args = append(args, "-debug")
	}
	if opts.FsyncDelay > 0 {
		args = append(args, "-fsync-delay", opts.FsyncDelay.String())
	}
	f.cmd = exec.Command(bin, args...)
	f.cmd.Stderr = logf
	f.cmd.SysProcAttr = childAttr()
	if f.stdin, err = f.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	stdout, err := f.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	if err := f.cmd.Start(); err != nil {
		return nil, fmt.Errorf("powerfs: start %s: %w", bin, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f.replies <- sc.Text()
		}
		close(f.replies)
		f.cmd.Wait() // once stdout is drained, as Wait closes it
		close(f.exited)
	}()
	first, err := f.reply()
	if err != nil || first != "ready" {
		f.closed = true
		f.stop()
		return nil, fmt.Errorf("%w: mounting failed (%s %v); log:\n%s", ErrUnavailable, first, err, f.log())
	}
	return f, nil
}

// SyncDir fsyncs the directory dir, so that the names in it survive a
// cut: a file created and synced is not durable until its directory is.
func SyncDir(tb TB, dir string) {
	tb.Helper()
	d, err := os.Open(dir)
	if err != nil {
		tb.Fatalf("powerfs: %v", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		tb.Fatalf("powerfs: syncing %s: %v", dir, err)
	}
}

// Mountpoint is the directory the file system is mounted on. It stays the
// same across cuts.
func (f *FS) Mountpoint() string { return f.mountpoint }

// Cut is a power cut. The caller must first kill the processes that use
// the mount (and wait for them). The file system then drops everything not
// synced, and mounts again at the same place, with nothing of the kernel's
// page cache of the old mount left. It returns how many unsynced bytes this
// cut dropped.
func (f *FS) Cut() int64 {
	f.tb.Helper()
	return f.cut("cut")
}

// CutTorn is a torn power cut: like Cut, except that each unsynced page
// (and each unsynced size change) is kept or dropped at random, from seed.
func (f *FS) CutTorn(seed uint64) int64 {
	f.tb.Helper()
	return f.cut("torn " + strconv.FormatUint(seed, 10))
}

// Counts returns what went through the mount so far, by file name.
func (f *FS) Counts() (map[string]FileCounts, error) {
	rep, err := f.request("counts")
	if err != nil {
		return nil, fmt.Errorf("powerfs: counts: %w", err)
	}
	var c map[string]FileCounts
	if err := json.Unmarshal([]byte(rep), &c); err != nil {
		return nil, fmt.Errorf("powerfs: counts: %w", err)
	}
	return c, nil
}

// SetFsyncDelay changes Options.FsyncDelay from now on.
func (f *FS) SetFsyncDelay(d time.Duration) error {
	if _, err := f.request("delay " + d.String()); err != nil {
		return fmt.Errorf("powerfs: delay: %w", err)
	}
	return nil
}

// DroppedBytes is how many unsynced bytes all cuts so far dropped.
func (f *FS) DroppedBytes() int64 { return f.dropped }

// Cuts is how many cuts there have been.
func (f *FS) Cuts() int { return f.cuts }

func (f *FS) cut(req string) int64 {
	f.tb.Helper()
	rep, err := f.request(req)
	if err != nil {
		f.tb.Fatalf("powerfs: %s: %v; log:\n%s", req, err, f.log())
	}
	n, err := strconv.ParseInt(rep, 10, 64)
	if err != nil {
		f.tb.Fatalf("powerfs: %s: reply %q", req, rep)
	}
	f.dropped += n
	f.cuts++
	return n
}

// Close unmounts, leaving the backing directory as the processes left it
// (synced or not), and stops the helper. Start arranges it for the end of
// the test; calling it earlier is fine.
func (f *FS) Close() {
	if f.closed {
		return
	}
	f.closed = true
	if _, err := f.request("close"); err != nil && f.tb != nil {
		f.tb.Logf("powerfs: close: %v; log:\n%s", err, f.log())
	}
	f.stop()
}

// stop ends the helper and makes sure nothing stays mounted.
func (f *FS) stop() {
	f.stdin.Close()
	select {
	case <-f.exited:
	case <-time.After(replyTimeout):
		f.cmd.Process.Kill()
		<-f.exited
	}
	detach(f.mountpoint)
	if f.tb != nil && f.tb.Failed() {
		f.tb.Logf("powerfs log (%s):\n%s", f.logFile, f.log())
	}
}

// request sends req and returns the reply's text after "ok ".
func (f *FS) request(req string) (string, error) {
	if _, err := fmt.Fprintln(f.stdin, req); err != nil {
		return "", fmt.Errorf("the helper is gone: %w", err)
	}
	rep, err := f.reply()
	if err != nil {
		return "", err
	}
	if r, ok := strings.CutPrefix(rep, "ok "); ok {
		return r, nil
	}
	return "", fmt.Errorf("%s", rep)
}

func (f *FS) reply() (string, error) {
	select {
	case rep, ok := <-f.replies:
		if !ok {
			return "", fmt.Errorf("the helper exited")
		}
		return rep, nil
	case <-time.After(replyTimeout):
		return "", fmt.Errorf("no reply from the helper within %s", replyTimeout)
	}
}

func (f *FS) log() string {
	b, _ := os.ReadFile(f.logFile)
	const max = 8 << 10
	if len(b) > max {
		b = append([]byte("..."), b[len(b)-max:]...)
	}
	return string(b)
}

// helperBinary is $OUTBOX_POWERFS_BIN, or the helper built (without -race,
// which is the point) into dir: the Go build cache makes that quick after
// the first time.
func helperBinary(dir string) (string, error) {
	if bin := os.Getenv(EnvBin); bin != "" {
		return bin, nil
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "powerfs")
	cmd := exec.Command(gobin, "build", "-o", out, helperPkg)
	// In this module, wherever the test runs from.
	if _, src, _, ok := runtime.Caller(0); ok {
		if _, err := os.Stat(src); err == nil {
			cmd.Dir = filepath.Dir(src)
		}
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("powerfs: go build %s: %w\n%s", helperPkg, err, b)
	}
	return out, nil
}
