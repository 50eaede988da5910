//go:build linux && !arm

// Command powerfs serves the power-loss file system (internal/powerfs/fusefs)
// for a test, in a process of its own so that its I/O runs at full speed
// outside the -race test binary. internal/powerfs starts it and drives it
// over its standard input and output, one line each way:
//
//	(powerfs)  ready                 mounted
//	cut        ok DROPPED            a cut, and the mount is back
//	torn SEED  ok DROPPED            a torn cut, seeded
//	counts     ok JSON               fusefs.Counts by file name, since the start
//	delay D    ok 0                  every fsync takes at least D from now on
//	close      ok 0                  unmounted, unsynced data left as it is
//	           error MESSAGE         and powerfs exits
//
// End of input is close. Its log goes to standard error.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgeoutbox/outbox/internal/powerfs/fusefs"
)

func main() {
	backing := flag.String("backing", "", "the backing directory")
	mountpoint := flag.String("mount", "", "where to mount")
	debug := flag.Bool("debug", false, "log every FUSE request")
	fsyncDelay := flag.Duration("fsync-delay", 0, "the least time every fsync takes")
	flag.Parse()
	if *backing == "" || *mountpoint == "" {
		fmt.Println("error: -backing and -mount are required")
		os.Exit(2)
	}
	opts := fusefs.Options{Debug: *debug, FsyncDelay: *fsyncDelay, Counter: fusefs.NewCounter()}
	m, err := fusefs.Start(*backing, *mountpoint, opts)
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	fail := func(err error) {
		fmt.Printf("error %v\n", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	// A test that ends early sends SIGTERM: unmount before going.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	fmt.Println("ready")
	for {
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case s := <-sig:
			log.Printf("powerfs: %v: unmounting", s)
		}
		cmd, arg, _ := strings.Cut(line, " ")
		switch {
		case !ok || cmd == "close":
			if err := m.Close(); err != nil {
				fail(err)
			}
			fmt.Println("ok 0")
			return
		case cmd == "cut" || cmd == "torn":
			var rng *rand.Rand
			if cmd == "torn" {
				seed, err := strconv.ParseUint(arg, 10, 64)
				if err != nil {
					fail(fmt.Errorf("torn %q: %w", arg, err))
				}
				rng = rand.New(rand.NewPCG(seed, 0x70f5))
			}
			dropped, err := m.Cut(rng)
			if err != nil {
				fail(fmt.Errorf("cut: %w", err))
			}
			if m, err = fusefs.Start(*backing, *mountpoint, opts); err != nil {
				fail(fmt.Errorf("mount after the cut: %w", err))
			}
			fmt.Printf("ok %d\n", dropped)
		case cmd == "delay":
			d, err := time.ParseDuration(arg)
			if err != nil {
				fail(fmt.Errorf("delay %q: %w", arg, err))
			}
			opts.FsyncDelay = d // for the mounts after a cut too
			m.SetFsyncDelay(d)
			fmt.Println("ok 0")
		case cmd == "counts":
			b, err := json.Marshal(opts.Counter.Snapshot(m.Dirty()))
			if err != nil {
				fail(err)
			}
			fmt.Printf("ok %s\n", b)
		default:
			fail(fmt.Errorf("unknown command %q", line))
		}
	}
}
