package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/edgeoutbox/outbox"
)

// IdleConfig describes the idle measurement: every relay connected, with
// the library's defaults, and nothing to send. Zero fields take the
// defaults given.
type IdleConfig struct {
	Devices int           // default 500
	Settle  time.Duration // after the last relay connected, before measuring; default 5 s
	Measure time.Duration // the measured window; default 60 s
	// Broker is an MQTT broker URL; empty starts an embedded one, in this
	// process, whose CPU is then counted with the relays'.
	Broker string
	// Dir holds the databases; empty means a temporary directory.
	Dir string
	// CPUProfile, if set, receives a CPU profile of the measured window,
	// for the breakdown (go tool pprof -top).
	CPUProfile io.Writer
	Progress   func(format string, args ...any)
}

// IdleReport is what the idle measurement saw in its window.
type IdleReport struct {
	Devices int     `json:"devices"`
	Window  Seconds `json:"window_s"`
	// CPU of the whole process (user + system), and as a fraction of one
	// core: 0.05 is 5 % of one core for all the relays together.
	CPUSeconds   float64 `json:"cpu_s"`
	UserSeconds  float64 `json:"user_s"`
	SysSeconds   float64 `json:"sys_s"`
	CoreFraction float64 `json:"core_fraction"`
	// What the relays did in the window: lease renewals (each a write
	// transaction), from the lease tokens; garbage collections.
	LeaseRenewalsPerS float64 `json:"lease_renewals_per_s"`
	GCPerS            float64 `json:"gc_per_s"`
	Goroutines        int     `json:"goroutines"`
	ExternalBroker    bool    `json:"external_broker"`
}

// RunIdle opens cfg.Devices devices with their relays on the library's
// defaults (a WAL watch where the OS has one, polling otherwise), waits
// until every relay is connected, and measures the CPU the process spends
// while none has anything to send.
func RunIdle(ctx context.Context, cfg IdleConfig) (rep IdleReport, err error) {
	if cfg.Devices == 0 {
		cfg.Devices = 500
	}
	if cfg.Devices < 1 || cfg.Devices > 10000 {
		return rep, fmt.Errorf("devices %d outside 1..10000", cfg.Devices)
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 5 * time.Second
	}
	if cfg.Measure <= 0 {
		cfg.Measure = time.Minute
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	rep.Devices = cfg.Devices
	rep.ExternalBroker = cfg.Broker != ""
	dir, cleanup, err := workDir(cfg.Dir, "outbox-idle-")
	if err != nil {
		return rep, err
	}
	defer cleanup()
	run := outbox.NewID()[24:]
	brokerURL, stopBroker, err := brokerOrEmbedded(ctx, cfg.Broker, "", "", nil)
	if err != nil {
		return rep, err
	}
	defer stopBroker()

	cfg.Progress("opening %d devices in %s", cfg.Devices, dir)
	devs, closeDevs, err := startDevices(cfg.Devices, func(i int) (*device, error) {
		return openDeviceWith(dir, "idle/"+run, run, brokerURL, i, outbox.RelayOptions{})
	})
	defer closeDevs()
	if err != nil {
		return rep, err
	}
	connected := func() int {
		n := 0
		for _, d := range devs {
			if st, err := d.relay.Stats(ctx); err == nil && st.Connected {
				n++
			}
		}
		return n
	}
	if err := waitFor(ctx, 2*time.Minute, func() bool { return connected() == cfg.Devices }); err != nil {
		return rep, fmt.Errorf("connecting: %d of %d connected: %w", connected(), cfg.Devices, err)
	}
	cfg.Progress("all %d connected; settling for %s", cfg.Devices, cfg.Settle)
	if !sleep(ctx, cfg.Settle) {
		return rep, ctx.Err()
	}

	tokens := func() (int64, error) {
		var sum int64
		for _, d := range devs {
			var t int64
			if err := d.ob.DB().QueryRowContext(ctx, `SELECT coalesce(sum(token), 0) FROM outbox_lease WHERE name = 'relay'`).Scan(&t); err != nil {
				return 0, err
			}
			sum += t
		}
		return sum, nil
	}
	tokens0, err := tokens()
	if err != nil {
		return rep, err
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	if cfg.CPUProfile != nil {
		if err := pprof.StartCPUProfile(cfg.CPUProfile); err != nil {
			return rep, err
		}
	}
	cfg.Progress("measuring for %s", cfg.Measure)
	user0, sys0, ok := processCPU()
	if !ok {
		if cfg.CPUProfile != nil {
			pprof.StopCPUProfile()
		}
		return rep, errors.New("this OS does not say what CPU the process used")
	}
	start := time.Now()
	slept := sleep(ctx, cfg.Measure)
	user1, sys1, _ := processCPU()
	window := time.Since(start)
	if cfg.CPUProfile != nil {
		pprof.StopCPUProfile()
	}
	if !slept {
		return rep, ctx.Err()
	}
	runtime.ReadMemStats(&ms1)
	tokens1, err := tokens()
	if err != nil {
		return rep, err
	}
	rep.Window = Seconds(window)
	rep.UserSeconds = (user1 - user0).Seconds()
	rep.SysSeconds = (sys1 - sys0).Seconds()
	rep.CPUSeconds = rep.UserSeconds + rep.SysSeconds
	rep.CoreFraction = rep.CPUSeconds / window.Seconds()
	rep.LeaseRenewalsPerS = float64(tokens1-tokens0) / window.Seconds()
	rep.GCPerS = float64(ms1.NumGC-ms0.NumGC) / window.Seconds()
	rep.Goroutines = runtime.NumGoroutine()
	for _, d := range devs {
		if st, err := d.relay.Stats(ctx); err != nil || !st.Connected {
			return rep, fmt.Errorf("device %s lost its connection while idle", d.name)
		}
	}
	return rep, nil
}
