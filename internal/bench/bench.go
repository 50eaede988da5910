// Package bench measures the outbox against the physical limits of the
// machine it runs on, in one process and one run: what an enqueue costs the
// business transaction, how fast a backlog drains compared with raw MQTT
// publishing, latency, catch-up after an outage, memory, binary size, a
// baseline (the polling dispatcher of the articles), what durable before
// publish costs, a drain over a slow cellular link beside that link's
// limit, what the outbox writes to the flash, and how it does on a slow
// card, and NATS JetStream: the drain beside raw nats.go publishing, and
// consumers into PostgreSQL. outboxlab bench runs it.
//
// Absolute numbers on shared machines move from run to run; the ratios,
// measured side by side with interleaved rounds, are what the targets are
// about.
package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the driver, for sqlite_version()
)

// Mode chooses the workload sizes.
type Mode string

const (
	Quick Mode = "quick" // the default: about 4 minutes on 2 cores
	Full  Mode = "full"  // the sizes the issue names
	Smoke Mode = "smoke" // tiny, for a test that the command works
)

// Config says what to run.
type Config struct {
	Mode Mode
	// Sections to run, 1..11; empty means all.
	Sections []int
	// Self is the command line that runs this program's child entry point
	// (Child): the sidecar writer and the relay whose memory is measured
	// run as processes of their own.
	Self []string
	// Mosquitto is the path of the mosquitto binary; empty looks in PATH
	// and /usr/sbin; "none" skips it.
	Mosquitto string
	// Windows, if not empty, are the windows section 2 drains at instead of
	// 1, 16, 64 and 256: one cell of its table measured in minutes.
	Windows []int
	// SrcDir is the module's root, for the size builds; empty means the
	// current directory.
	SrcDir string
	// Progress gets one line per step; nil means none.
	Progress io.Writer
}

// sizes are the workload sizes of a mode.
type sizes struct {
	enqRounds, enqFullTx, enqNormalTx int
	// Turns of section 1's steps, one transaction per step each turn.
	enqStepsFull, enqStepsNormal  int
	drainBacklog, drainBacklogW1  int
	drainRounds                   int
	drainWindows                  []int
	drainMosquitto                bool
	latN, latRate                 int
	catchBacklog, catchRate       int
	memBacklog                    int
	sizeBuild                     bool
	baseSteady                    time.Duration
	baseRate                      int
	basePre, baseOutage, basePost time.Duration
	durBacklog, durTrickle        int
	// The link profile (section 9): events per count of bytes, seconds
	// each drain is sized for at its link's limit, whether every window
	// and encoding drains (else window 64 only) and whether the day
	// offline drains whole.
	linkBytesEvents  int
	linkDrainSeconds float64
	linkAllDrains    bool
	linkDay          bool
	// linkPrioBacklog is the backlog of priority 0 ahead of a priority-9
	// event after an outage.
	linkPrioBacklog int
	// The order events on the link: events per count of bytes, whether
	// the day drains whole batched with zstd (else estimated from a
	// drain of linkDrainSeconds), and how long compression is timed.
	linkOrdersBytesEvents int
	linkOrdersDay         bool
	compressTime          time.Duration
	// Section 10: events of each enqueue and of the drain whose writes
	// are counted, transactions of the enqueue on a slow card, and
	// whether every delay of the slow card runs (else 10 ms only).
	flashEnqueue, flashDrain, flashSlowTx int
	flashSlowAll                          bool
	// Section 11: the backlog of each drain to JetStream, the windows,
	// the rounds (drains and consumers), and the events the consumers
	// apply.
	jsBacklog        int
	jsWindows        []int
	jsRounds         int
	jsConsumerEvents int
}

func sizesFor(m Mode) sizes {
	switch m {
	case Full:
		return sizes{
			enqRounds: 61, enqFullTx: 100, enqNormalTx: 500, enqStepsFull: 1000, enqStepsNormal: 10_000,
			drainBacklog: 100_000, drainBacklogW1: 20_000, drainRounds: 3, drainWindows: []int{1, 16, 64, 256}, drainMosquitto: true,
			latN: 10_000, latRate: 1000,
			catchBacklog: 100_000, catchRate: 1000,
			memBacklog: 1_000_000,
			sizeBuild:  true,
			baseSteady: 10 * time.Second, baseRate: 10,
			basePre: 5 * time.Second, baseOutage: 30 * time.Second, basePost: 5 * time.Second,
			durBacklog: 50_000, durTrickle: 1000,
			linkBytesEvents: 1000, linkDrainSeconds: 12, linkAllDrains: true, linkDay: true, linkPrioBacklog: linkDayEvents,
			linkOrdersBytesEvents: 3000, linkOrdersDay: true, compressTime: 2 * time.Second,
			flashEnqueue: 5000, flashDrain: 30_000, flashSlowTx: 200, flashSlowAll: true,
			jsBacklog: 50_000, jsWindows: []int{64, 256}, jsRounds: 3, jsConsumerEvents: 20_000,
		}
	case Smoke:
		return sizes{
			enqRounds: 3, enqFullTx: 5, enqNormalTx: 20, enqStepsFull: 10, enqStepsNormal: 20,
			drainBacklog: 500, drainBacklogW1: 200, drainRounds: 1, drainWindows: []int{1, 16, 64, 256},
			latN: 200, latRate: 1000,
			catchBacklog: 1000, catchRate: 200,
			memBacklog: 2000,
			baseSteady: 500 * time.Millisecond, baseRate: 10,
			basePre: 500 * time.Millisecond, baseOutage: 2 * time.Second, basePost: 500 * time.Millisecond,
			durBacklog: 500, durTrickle: 30,
			linkBytesEvents: 50, linkDrainSeconds: 0.5, linkPrioBacklog: 500,
			linkOrdersBytesEvents: 300, compressTime: 50 * time.Millisecond,
			flashEnqueue: 100, flashDrain: 500, flashSlowTx: 10,
			jsBacklog: 300, jsWindows: []int{64}, jsRounds: 1, jsConsumerEvents: 200,
		}
	}
	return sizes{
		enqRounds: 21, enqFullTx: 40, enqNormalTx: 200, enqStepsFull: 200, enqStepsNormal: 2000,
		drainBacklog: 20_000, drainBacklogW1: 5_000, drainRounds: 1, drainWindows: []int{1, 16, 64, 256}, drainMosquitto: true,
		latN: 2000, latRate: 1000,
		catchBacklog: 20_000, catchRate: 1000,
		memBacklog: 100_000,
		sizeBuild:  true,
		baseSteady: 3 * time.Second, baseRate: 10,
		basePre: 3 * time.Second, baseOutage: 10 * time.Second, basePost: 3 * time.Second,
		durBacklog: 10_000, durTrickle: 300,
		linkBytesEvents: 300, linkDrainSeconds: 4, linkAllDrains: true, linkPrioBacklog: 10_000,
		linkOrdersBytesEvents: 1000, linkOrdersDay: true, compressTime: 500 * time.Millisecond,
		flashEnqueue: 2000, flashDrain: 10_000, flashSlowTx: 50, flashSlowAll: true,
		jsBacklog: 10_000, jsWindows: []int{64, 256}, jsRounds: 3, jsConsumerEvents: 5000,
	}
}

// runner carries one run's state.
type runner struct {
	cfg  Config
	sz   sizes
	rep  *Report
	dir  string
	mosq string // mosquitto binary, "" if none
	log  *slog.Logger
}

// Run runs the selected sections and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Mode == "" {
		cfg.Mode = Quick
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	dir, err := os.MkdirTemp("", "outboxlab-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r := &runner{
		cfg: cfg, sz: sizesFor(cfg.Mode), dir: dir,
		rep: newReport(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if len(cfg.Windows) > 0 {
		r.sz.drainWindows = cfg.Windows
	}
	if cfg.Mosquitto != "none" {
		r.mosq = mosquittoBinary(cfg.Mosquitto)
	}
	r.fillMeta(ctx)
	start := time.Now()
	sections := []struct {
		n   int
		run func(context.Context) error
	}{
		{1, r.enqueue}, {2, r.drain}, {3, r.latency}, {4, r.catchup}, {5, r.memory}, {6, r.size}, {7, r.baseline},
		{8, r.durable}, {9, r.link}, {10, r.flash}, {11, r.jetstream},
	}
	for _, s := range sections {
		if !r.selected(s.n) {
			continue
		}
		if ctx.Err() != nil {
			return r.rep, ctx.Err()
		}
		t := time.Now()
		r.progress("section %d: %s", s.n, sectionTitles[s.n])
		if err := s.run(ctx); err != nil {
			return r.rep, fmt.Errorf("section %d (%s): %w", s.n, sectionTitles[s.n], err)
		}
		r.rep.Meta.SectionSeconds[fmt.Sprint(s.n)] = round2(time.Since(t).Seconds())
		r.progress("section %d done in %.1f s", s.n, time.Since(t).Seconds())
		runtime.GC()
	}
	r.rep.Meta.Seconds = round2(time.Since(start).Seconds())
	r.rep.Meta.LoadEnd = loadAvg()
	return r.rep, nil
}

func (r *runner) selected(n int) bool {
	if len(r.cfg.Sections) == 0 {
		return true
	}
	for _, s := range r.cfg.Sections {
		if s == n {
			return true
		}
	}
	return false
}

func (r *runner) progress(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, "bench: "+format+"\n", args...)
}

func (r *runner) fillMeta(ctx context.Context) {
	m := &r.rep.Meta
	m.Mode = string(r.cfg.Mode)
	m.Date = time.Now().UTC().Format(time.RFC3339)
	m.GoVersion = runtime.Version()
	m.OSArch = runtime.GOOS + "/" + runtime.GOARCH
	m.NumCPU = runtime.NumCPU()
	m.GOMAXPROCS = runtime.GOMAXPROCS(0)
	m.CPU = cpuModel()
	m.LoadStart = loadAvg()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if db, err := sql.Open("sqlite", ":memory:"); err == nil {
		db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&m.SQLiteVersion)
		db.Close()
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "modernc.org/sqlite":
				m.SQLiteDriver = d.Path + " " + d.Version
			case "github.com/eclipse/paho.mqtt.golang":
				m.Paho = d.Version
			case "github.com/mochi-mqtt/server/v2":
				m.Mochi = d.Version
			}
		}
	}
	if r.mosq != "" {
		m.Mosquitto = mosquittoVersion(r.mosq)
	}
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// loadAvg is the machine's load average (1, 5 and 15 minutes): on a shared
// machine, other work running at the same time shows here.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
