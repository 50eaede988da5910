package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
	"github.com/edgeoutbox/outbox/internal/fleet"
)

type fleetFlags struct {
	devices, payload int
	rate             float64
	steady, outage   time.Duration
	jitter           string
	broker, dir      string
	initial, maxWait time.Duration
	asJSON, quiet    bool
	idle, settle     time.Duration
	cpuProfile       string
}

func fleetCmd(a *cli.App) *cobra.Command {
	var f fleetFlags
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Simulate a fleet of devices through a broker outage and measure the recovery",
		Long: `fleet runs N simulated devices in this process, each with its own SQLite
file, writer, relay, client id and topic prefix, against one broker: an
embedded one unless --broker is given. Every device commits --rate events a
second; after --steady the broker goes away for --outage while they keep
committing; then it comes back.

Between the devices and the broker stands a gate that counts every
connection attempt and, during the outage, cuts every connection and turns
each new one away. A consumer subscribed straight to the broker checks that
every committed event arrives.

It reports connection attempts at the broker during the recovery (peak in
any 1 s and 100 ms window, and the 99th percentile of 100 ms buckets), time
until every device reconnected and until every backlog was delivered,
events lost (must be 0), duplicates, and memory per device. By default it
runs the scenario twice — the library's reconnection policy with jitter,
then the same without — and prints the two side by side with the ratio of
their peaks.

The exit status is 1 if any event was lost or phantom, or the recovery did
not finish in time.

With --idle it measures instead what the devices' relays cost while there is
nothing to send: every relay on the library's defaults (watching its WAL
where the OS can), connected, and the process's CPU (user and system) over
the window, with lease renewals and garbage collections per second;
--cpuprofile writes a CPU profile of the window for the breakdown; --settle
is the wait before the window (past a minute, the window leaves out each
relay's first purge, which prepares its statements once).`,
		Example: `  outboxlab fleet
  outboxlab fleet --devices 100 --outage 10s --jitter on
  outboxlab fleet --broker tcp://127.0.0.1:1883 --json
  outboxlab fleet --idle 60s --broker tcp://127.0.0.1:1883 --cpuprofile idle.pprof
  outboxlab fleet --idle 60s --settle 70s --broker tcp://127.0.0.1:1883`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.devices < 1 || f.devices > 10000 {
				return cli.Usagef("--devices %d: give 1 to 10000", f.devices)
			}
			if f.rate <= 0 || f.rate > 1000 {
				return cli.Usagef("--rate %g: give more than 0 and at most 1000 events per device per second", f.rate)
			}
			if f.payload < 40 || f.payload > 256<<10 {
				return cli.Usagef("--payload %d: give 40 to 262144 bytes", f.payload)
			}
			if f.steady < 0 || f.outage <= 0 || f.initial <= 0 || f.maxWait < f.initial {
				return cli.Usagef("--steady must not be negative, --outage and --reconnect-initial positive, --reconnect-max at least --reconnect-initial")
			}
			var jitters []float64
			switch f.jitter {
			case "both":
				jitters = []float64{0, -1}
			case "on":
				jitters = []float64{0}
			case "off":
				jitters = []float64{-1}
			default:
				return cli.Usagef("--jitter %q: give on, off or both", f.jitter)
			}
			if f.broker != "" {
				if _, err := outbox.ParseBrokerURL(f.broker); err != nil {
					return cli.UsageError{Err: err}
				}
			}
			if f.idle != 0 || f.cpuProfile != "" || cmd.Flags().Changed("settle") {
				return fleetIdle(cmd, a, f)
			}
			var reports []fleet.Report
			for _, j := range jitters {
				cfg := fleet.Config{
					Devices: f.devices, Rate: f.rate, Steady: f.steady, Outage: f.outage, PayloadBytes: f.payload,
					Reconnect: outbox.Backoff{Initial: f.initial, Max: f.maxWait, Jitter: j},
					Broker:    f.broker, Dir: f.dir,
				}
				if !f.quiet {
					label := "jitter on"
					if j < 0 {
						label = "jitter off"
					}
					cfg.Progress = func(format string, args ...any) {
						fmt.Fprintf(a.Stderr, "fleet (%s): "+format+"\n", append([]any{label}, args...)...)
					}
				}
				rep, err := fleet.Run(cmd.Context(), cfg)
				if err != nil {
					return err
				}
				reports = append(reports, rep)
			}
			if f.asJSON {
				enc := json.NewEncoder(a.Stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(map[string]any{"runs": reports}); err != nil {
					return err
				}
			} else {
				printFleet(a.Stdout, f, reports)
			}
			for _, r := range reports {
				if r.Lost > 0 || r.Phantom > 0 || r.DeliveryTimeout {
					return fmt.Errorf("FAILED: %d lost, %d phantom, recovery timed out: %v", r.Lost, r.Phantom, r.DeliveryTimeout)
				}
			}
			return nil
		},
	}
	def := outbox.Backoff{}
	cmd.Flags().IntVar(&f.devices, "devices", 500, "simulated devices")
	cmd.Flags().Float64Var(&f.rate, "rate", 1, "events per device per second")
	cmd.Flags().IntVar(&f.payload, "payload", 200, "bytes of each event's payload")
	cmd.Flags().DurationVar(&f.steady, "steady", 5*time.Second, "traffic before the outage")
	cmd.Flags().DurationVar(&f.outage, "outage", 30*time.Second, "how long the broker is away")
	cmd.Flags().StringVar(&f.jitter, "jitter", "both", "reconnect jitter: on (the library's default), off, or both to compare")
	cmd.Flags().StringVar(&f.broker, "broker", "", "MQTT broker URL (tcp://); default: an embedded broker")
	cmd.Flags().StringVar(&f.dir, "dir", "", "directory for the devices' databases (default: a temporary one, removed)")
	cmd.Flags().DurationVar(&f.initial, "reconnect-initial", or(def.Initial, 500*time.Millisecond), "first reconnection wait")
	cmd.Flags().DurationVar(&f.maxWait, "reconnect-max", or(def.Max, 30*time.Second), "cap on one reconnection wait")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print the reports as JSON")
	cmd.Flags().BoolVarP(&f.quiet, "quiet", "q", false, "no progress on stderr")
	cmd.Flags().DurationVar(&f.idle, "idle", 0, "measure the CPU of idle relays over this window instead of the outage scenario")
	cmd.Flags().StringVar(&f.cpuProfile, "cpuprofile", "", "with --idle: write a CPU profile of the window to this file")
	cmd.Flags().DurationVar(&f.settle, "settle", 5*time.Second, "with --idle: wait this long after the last relay connected before measuring (past 1m the window leaves out the first purge, which prepares its statements)")
	return cmd
}

// fleetIdle runs the idle measurement (--idle).
func fleetIdle(cmd *cobra.Command, a *cli.App, f fleetFlags) error {
	if f.idle < time.Second {
		return cli.Usagef("--idle %s: give a window of at least 1s", f.idle)
	}
	if f.settle < 0 {
		return cli.Usagef("--settle %s: must not be negative", f.settle)
	}
	cfg := fleet.IdleConfig{Devices: f.devices, Settle: f.settle, Measure: f.idle, Broker: f.broker, Dir: f.dir}
	if f.cpuProfile != "" {
		file, err := os.Create(f.cpuProfile)
		if err != nil {
			return err
		}
		defer file.Close()
		cfg.CPUProfile = file
	}
	if !f.quiet {
		cfg.Progress = func(format string, args ...any) { fmt.Fprintf(a.Stderr, "fleet (idle): "+format+"\n", args...) }
	}
	rep, err := fleet.RunIdle(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	if f.asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	broker := "an embedded broker in this process (its CPU counted)"
	if f.broker != "" {
		broker = "broker " + f.broker
	}
	fmt.Fprintf(a.Stdout, "fleet idle: %d relays, library defaults, %s, %d CPUs, window %s\n\n", rep.Devices, broker, runtime.NumCPU(), rep.Window)
	tw := tabwriter.NewWriter(a.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "CPU, all relays\t%.1f %% of one core\t\n", rep.CoreFraction*100)
	fmt.Fprintf(tw, "user / system\t%.2f s / %.2f s\t\n", rep.UserSeconds, rep.SysSeconds)
	fmt.Fprintf(tw, "per relay\t%.1f µs/s\t\n", rep.CPUSeconds/time.Duration(rep.Window).Seconds()/float64(rep.Devices)*1e6)
	fmt.Fprintf(tw, "lease renewals\t%.1f /s\t\n", rep.LeaseRenewalsPerS)
	fmt.Fprintf(tw, "garbage collections\t%.2f /s\t\n", rep.GCPerS)
	fmt.Fprintf(tw, "goroutines\t%d\t\n", rep.Goroutines)
	return tw.Flush()
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func printFleet(w io.Writer, f fleetFlags, reports []fleet.Report) {
	broker := "embedded broker"
	if f.broker != "" {
		broker = "broker " + f.broker
	}
	fmt.Fprintf(w, "fleet: %d devices, %g events/s each of %d bytes, %s steady, %s outage, %s, %d CPUs\n\n",
		f.devices, f.rate, f.payload, f.steady, f.outage, broker, runtime.NumCPU())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, val func(r fleet.Report) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range reports {
			fmt.Fprintf(tw, "%s\t", val(r))
		}
		fmt.Fprintln(tw)
	}
	row("", func(r fleet.Report) string {
		if r.Jitter == 0 {
			return "jitter off"
		}
		return fmt.Sprintf("jitter ±%.0f%%", r.Jitter*100)
	})
	itoa := func(n int) string { return fmt.Sprint(n) }
	row("committed", func(r fleet.Report) string { return itoa(r.Committed) })
	row("delivered", func(r fleet.Report) string { return itoa(r.Delivered) })
	row("lost", func(r fleet.Report) string { return itoa(r.Lost) })
	row("phantom", func(r fleet.Report) string { return itoa(r.Phantom) })
	row("duplicates", func(r fleet.Report) string { return itoa(r.Duplicates) })
	row("commit errors", func(r fleet.Report) string { return itoa(r.CommitErrors) })
	row("backlog when the broker came back", func(r fleet.Report) string { return itoa(r.PeakBacklog) })
	row("attempts turned away during the outage", func(r fleet.Report) string { return itoa(r.OutageAttempts) })
	row("attempts during the recovery", func(r fleet.Report) string { return itoa(r.RecoveryAttempts) })
	row("peak attempts/s (any 1 s)", func(r fleet.Report) string { return itoa(r.PeakPerSecond) })
	row("peak attempts/s (any 100 ms)", func(r fleet.Report) string { return fmt.Sprintf("%.0f", r.Peak100msPerSec) })
	row("p99 attempts/s (100 ms buckets)", func(r fleet.Report) string { return fmt.Sprintf("%.0f", r.P99PerSecond) })
	row("every device reconnected after", func(r fleet.Report) string { return timedOut(r, r.ReconnectedAfter) })
	row("every backlog delivered after", func(r fleet.Report) string { return timedOut(r, r.DrainedAfter) })
	row("disk per pending event", func(r fleet.Report) string { return fmt.Sprintf("%.0f B", r.DiskPerPendingEvent) })
	row("disk per device at the return (db + WAL)", func(r fleet.Report) string { return kib(r.DiskPerDevice) })
	row("Go heap per device", func(r fleet.Report) string { return kib(r.HeapPerDevice) })
	row("RSS per device", func(r fleet.Report) string { return kib(r.RSSPerDevice) })
	row("goroutines per device", func(r fleet.Report) string { return fmt.Sprintf("%.1f", r.GoroutinesPerDev) })
	row("setup (open and connect all)", func(r fleet.Report) string { return r.SetupTime.String() })
	tw.Flush()
	if len(reports) == 2 && reports[0].PeakPerSecond > 0 {
		on, off := reports[0], reports[1]
		fmt.Fprintf(w, "\npeak reconnect rate without jitter ÷ with: %.1f× (any 1 s), %.1f× (any 100 ms); target ≥ 5×\n",
			float64(off.PeakPerSecond)/float64(on.PeakPerSecond), off.Peak100msPerSec/on.Peak100msPerSec)
	}
	if f.broker == "" {
		fmt.Fprintln(w, "\nMemory per device includes its share of the embedded broker and of the gate; heap and stacks after a GC.")
	} else {
		fmt.Fprintln(w, "\nMemory per device includes its share of the gate; heap and stacks after a GC.")
	}
}

func timedOut(r fleet.Report, d fleet.Seconds) string {
	if r.DeliveryTimeout {
		return fmt.Sprintf("TIMED OUT (%d devices left)", r.DevicesNotDrained)
	}
	return d.String()
}

func kib(b uint64) string { return fmt.Sprintf("%.0f KiB", float64(b)/1024) }
