package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox"
)

// Child is the entry point of the processes the benchmark starts (through
// Config.Self): "writer", a program that inserts orders and outbox rows with
// plain SQL (the sidecar case), and "relay", a relay whose memory is
// measured on its own. Each prints one JSON object on stdout.
func Child(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("bench child: want writer or relay")
	}
	fs := flag.NewFlagSet("bench child "+args[0], flag.ContinueOnError)
	db := fs.String("db", "", "database path")
	n := fs.Int("n", 0, "events")
	rate := fs.Int("rate", 1000, "events per second")
	warmup := fs.Int("warmup", 0, "untracked events first")
	brokerURL := fs.String("broker", "", "broker URL")
	window := fs.Int("window", 64, "relay window")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "writer":
		return childWriter(ctx, *db, *n, *rate, *warmup, stdout)
	case "relay":
		return childRelay(ctx, *db, *brokerURL, *window, stdout)
	}
	return fmt.Errorf("bench child: unknown %q", args[0])
}

// childWriter inserts n orders with their events at rate per second, each
// in its own transaction, with plain SQL as a program in another language
// would, and prints when each committed.
func childWriter(ctx context.Context, path string, n, rate, warmup int, stdout io.Writer) error {
	db, err := outbox.OpenDB(path, outbox.DBOptions{MustExist: true})
	if err != nil {
		return err
	}
	defer db.Close()
	commit := func(i int) (int64, error) {
		tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (OpenDB)
		if err != nil {
			return 0, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (item, total_cents) VALUES (?, ?)`, "coffee", 100+i%900); err != nil {
			tx.Rollback()
			return 0, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox (topic, type, payload) VALUES (?, ?, ?)`, benchTopic, benchType, payload(i, payloadLen)); err != nil {
			tx.Rollback()
			return 0, err
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
		return time.Now().UnixNano(), nil
	}
	for i := 0; i < warmup; i++ {
		if _, err := commit(n + i); err != nil {
			return err
		}
	}
	time.Sleep(200 * time.Millisecond)
	res := writerResult{Commits: make([]int64, n)}
	err = pace(ctx, n, rate, func(i int) error {
		at, err := commit(i)
		res.Commits[i] = at
		return err
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

// relayResult is what the relay process prints.
type relayResult struct {
	PeakHeapBytes  uint64  `json:"peak_heap_bytes"`
	PeakInuseBytes uint64  `json:"peak_heap_inuse_bytes"`
	PeakRSSBytes   uint64  `json:"peak_rss_bytes"`
	Seconds        float64 `json:"seconds"`
	Sent           int64   `json:"sent"`
}

// childRelay drains the outbox at path to the broker, as the sidecar relay
// does, sampling the Go heap every millisecond, and prints the peaks once
// nothing is pending.
func childRelay(ctx context.Context, path, brokerURL string, window int, stdout io.Writer) error {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: logger, MustExist: true, ReserveBytes: -1})
	if err != nil {
		return err
	}
	defer ob.Close()
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: brokerURL, ClientID: "bench-memory-relay"})
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{Window: window, Source: benchSource})
	if err != nil {
		return err
	}
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
	var res relayResult
	sample := func() {
		metrics.Read(samples)
		objects, unused := samples[0].Value.Uint64(), samples[1].Value.Uint64()
		res.PeakHeapBytes = max(res.PeakHeapBytes, objects)
		res.PeakInuseBytes = max(res.PeakInuseBytes, objects+unused)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- relay.Run(rctx) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	check := time.NewTicker(20 * time.Millisecond)
	defer check.Stop()
	deadline := time.After(30 * time.Minute)
	for drained := false; !drained; {
		select {
		case <-tick.C:
			sample()
		case <-check.C:
			st, err := relay.Stats(ctx)
			if err != nil {
				return err
			}
			drained = st.Pending == 0
		case err := <-done:
			return fmt.Errorf("relay stopped: %v", err)
		case <-deadline:
			return errors.New("not drained within 30 minutes")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	res.Seconds = time.Since(start).Seconds()
	sample()
	cancel()
	if err := <-done; err != nil {
		return err
	}
	// Counted once Run has returned: a mark's rows leave Pending when it
	// commits, a moment before the relay counts them sent.
	res.Sent = relay.Metrics().Published
	res.PeakRSSBytes = vmHWM()
	return json.NewEncoder(stdout).Encode(res)
}

// vmHWM is this process's peak resident set size, from /proc.
func vmHWM() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, _ := strconv.ParseUint(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
