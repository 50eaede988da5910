package main

import (
	"encoding/json"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/bench"
	"github.com/edgeoutbox/outbox/internal/cli"
)

func benchCmd(a *cli.App) *cobra.Command {
	var full, smoke, asJSON, quiet, keys bool
	var sections, windows, mosquitto, src, cpuProfile string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the outbox against this machine's limits and print the results",
		Long: `bench measures, in one run on this machine, what the outbox costs and how
fast it empties, each beside the physical limit measured the same way:

  1. enqueue overhead: the business transaction alone, with a raw SQL outbox
     insert, and through Enqueue (synchronous FULL and NORMAL; 1 and 10
     messages per transaction), in interleaved rounds
  2. drain rate of a backlog at QoS 1, windows 1, 16, 64 and 256, beside raw
     paho publishing of the same messages with the same window and no
     database, to the in-process broker and to a local Mosquitto if installed;
     the same backlog at priority 9, and spread over priorities 0, 5 and 9
  3. latency while connected: commit → PUBACK and commit → subscriber, for
     commits through the library and for rows inserted by another process
  4. catch-up after an outage while new orders keep arriving, and what the
     draining does to their transactions
  5. peak heap and RSS of a relay process draining a large backlog
  6. stripped sizes of outboxctl (what a till runs), outboxlab, a minimal
     program using the library and the floor (SQLite, paho and backoff
     alone), for amd64, arm64 and armv7, each beside the floor (needs the
     Go toolchain and the module's source: run it from the repository)
  7. the articles' polling dispatcher, ported, beside ours: latency, and what
     a broker outage does to its messages
  8. durable before publish: the relay's fsyncs of the WAL per 1,000 events
     of a backlog and per event of a trickle, at FULL and NORMAL, with the
     drain rate and commit → PUBACK latency
  9. a slow link used to its limit: 150 ms round trip and 2 Mbit/s each way
     (the test harness's shaped proxy); MQTT bytes per event for structured
     JSON, MQTT 5 binary mode and raw; the drain rate beside the link's
     limit at windows 16, 64 and 256; how long a day offline (30,000
     events) takes to drain; how soon a priority-9 event goes after the
     outage, ahead of that backlog (10,000 events; --full 30,000)
  10. what the outbox writes to the flash, counted by powerfs (the
     project's FUSE file system; needs /dev/fuse and the Go toolchain, which
     builds its helper: skipped, saying why, without): bytes, 4 KiB pages
     and fsyncs per event, for enqueue at FULL and NORMAL and for a drain
     (one event per message, then batches of 100) with its marks,
     checkpoints and purge; then a slow card (every fsync 10 ms, then
     50 ms): enqueue at FULL and the drain over section 9's link
  11. NATS JetStream (needs nats-server; skipped, saying why, without): the
     drain into a stream of one replica on one server and of three on a
     3-node cluster, beside raw nats.go publishing of the same messages with
     the same window of PubAcks; then 1, 2 and 4 members of one durable pull
     consumer applying a stream's events into a PostgreSQL inbox (needs
     PostgreSQL), with the CPU each program used

It prints Markdown tables (with --json, one JSON object with one key per
figure, listed by --keys), with the machine, Go and SQLite versions. Each
target is marked met or MISSED. Quick by default (about 4 minutes on 2 cores; workloads
scaled down and labelled so); --full runs the full sizes (about 21 minutes on 2 cores).
Progress goes to stderr. Everything runs on loopback and in a temporary
directory. bench compare compares the JSON reports of runs.`,
		Example: `  outboxlab bench
  outboxlab bench --full > BENCHMARKS-run.md
  outboxlab bench --json --sections 1,2
  outboxlab bench --full --sections 2 --windows 16 --mosquitto none
  outboxlab bench --keys
  outboxlab bench compare docs/bench/2026-12-04-before-1.json docs/bench/2026-12-04-after-1.json`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keys {
				bench.KeysMarkdown(a.Stdout)
				return nil
			}
			if full && smoke {
				return cli.Usagef("--full and --smoke exclude each other")
			}
			cfg := bench.Config{Mode: bench.Quick, Mosquitto: mosquitto, SrcDir: src, Progress: a.Stderr}
			if quiet {
				cfg.Progress = nil
			}
			switch {
			case full:
				cfg.Mode = bench.Full
			case smoke:
				cfg.Mode = bench.Smoke
			}
			var err error
			if cfg.Sections, err = intList("--sections", "a section number", sections, 11); err != nil {
				return err
			}
			if cfg.Windows, err = intList("--windows", "a window", windows, 65535); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Self = []string{exe, "bench", "child"}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			rep, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			rep.Markdown(a.Stdout)
			return nil
		},
	}
	cmd.Flags().BoolVar(&full, "full", false, "the full sizes: 100,000-message backlogs, 10,000 latency events, a 1,000,000-message memory run, a 30 s outage, a 30,000-event day over the slow link, 50,000-message drains to JetStream (about 21 minutes on 2 cores)")
	cmd.Flags().BoolVar(&smoke, "smoke", false, "tiny sizes, only to check that everything runs (seconds)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of Markdown")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress lines on stderr")
	cmd.Flags().BoolVar(&keys, "keys", false, "print the JSON keys with their meaning, unit and target, and exit")
	cmd.Flags().StringVar(&sections, "sections", "", "comma-separated sections to run, 1..11 (default all)")
	cmd.Flags().StringVar(&windows, "windows", "", "comma-separated windows section 2 drains at (default 1,16,64,256)")
	cmd.Flags().StringVar(&mosquitto, "mosquitto", "", `path of the mosquitto binary (default: PATH, then /usr/sbin); "none" skips it`)
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run (this process only) to this file, for go tool pprof")
	cmd.Flags().StringVar(&src, "src", "", "the module's root directory, for the size builds (default: the current directory)")
	cmd.AddCommand(benchCompareCmd(a), &cobra.Command{
		Use:                "child",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.Child(cmd.Context(), args, a.Stdout)
		},
	})
	return cmd
}

// intList reads a flag's comma-separated numbers, each 1..most.
func intList(flag, what, list string, most int) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > most {
			return nil, cli.Usagef("%s: %q is not %s 1..%d", flag, s, what, most)
		}
		out = append(out, n)
	}
	return out, nil
}
