// Package fleet simulates a fleet of devices in one process — each with its
// own SQLite file, writer, relay, client id and topic prefix — against one
// broker, takes the broker away while every device keeps committing, and
// measures the recovery: how hard the fleet hits the broker when it comes
// back, how long until every backlog is delivered, and that nothing was
// lost.
package fleet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// Config describes one scenario. Zero fields take the defaults given.
type Config struct {
	Devices int           // default 500
	Rate    float64       // events per device per second; default 1
	Steady  time.Duration // traffic before the outage; default 5 s
	Outage  time.Duration // how long the broker is away; default 30 s
	// PayloadBytes is the size of each event's payload; default 200.
	PayloadBytes int
	// Reconnect is every relay's reconnection policy; the zero value is
	// the library's default (jitter on). Jitter -1 turns jitter off.
	Reconnect outbox.Backoff
	// Broker is an MQTT broker URL; empty starts an embedded one.
	Broker string
	// Dir holds the devices' databases; empty means a temporary directory
	// removed at the end.
	Dir string
	// Timeout bounds the recovery (every device reconnected and its backlog
	// delivered). Default: 2 × Reconnect.Max + 60 s.
	Timeout time.Duration
	// Progress, if set, receives a line at each phase.
	Progress func(format string, args ...any)
}

func (c Config) withDefaults() (Config, error) {
	if c.Devices == 0 {
		c.Devices = 500
	}
	if c.Rate == 0 {
		c.Rate = 1
	}
	if c.Steady == 0 {
		c.Steady = 5 * time.Second
	}
	if c.Outage == 0 {
		c.Outage = 30 * time.Second
	}
	if c.PayloadBytes == 0 {
		c.PayloadBytes = 200
	}
	switch {
	case c.Devices < 1 || c.Devices > 10000:
		return c, fmt.Errorf("devices %d outside 1..10000", c.Devices)
	case c.Rate <= 0 || c.Rate > 1000:
		return c, fmt.Errorf("rate %g outside (0, 1000] events per device per second", c.Rate)
	case c.PayloadBytes < 40 || c.PayloadBytes > 256<<10:
		return c, fmt.Errorf("payload %d bytes outside 40..262144", c.PayloadBytes)
	case c.Steady < 0 || c.Outage < 0:
		return c, errors.New("steady and outage durations must not be negative")
	}
	if c.Timeout <= 0 {
		maxWait := c.Reconnect.Max
		if maxWait <= 0 {
			maxWait = 30 * time.Second
		}
		c.Timeout = 2*maxWait + time.Minute
	}
	if c.Progress == nil {
		c.Progress = func(string, ...any) {}
	}
	return c, nil
}

// Report is what one scenario measured.
type Report struct {
	Devices int     `json:"devices"`
	Jitter  float64 `json:"jitter"` // the reconnect policy's jitter fraction; 0 = none

	Committed    int `json:"committed"`     // events whose transaction committed
	CommitErrors int `json:"commit_errors"` // transactions that failed
	Delivered    int `json:"delivered"`     // distinct events the consumer received
	Duplicates   int `json:"duplicates"`    // deliveries beyond the first
	Lost         int `json:"lost"`          // committed, never delivered
	Phantom      int `json:"phantom"`       // delivered, never committed
	PeakBacklog  int `json:"peak_backlog"`  // events waiting when the broker came back
	PayloadBytes int `json:"payload_bytes"` // each event's payload

	// Disk: what a pending event costs in the database file (after a
	// checkpoint), and the database and its WAL per device when the broker
	// came back.
	DiskPerPendingEvent float64 `json:"disk_bytes_per_pending_event"`
	DiskPerDevice       uint64  `json:"disk_bytes_per_device"`

	// Connection attempts at the broker from its return until the fleet
	// had reconnected and delivered its backlog.
	RecoveryAttempts  int     `json:"recovery_attempts"`
	PeakPerSecond     int     `json:"peak_attempts_per_s"`       // most in any 1 s window
	Peak100msPerSec   float64 `json:"peak_attempts_per_s_100ms"` // most in any 100 ms window, per second
	P99PerSecond      float64 `json:"p99_attempts_per_s"`        // 99th percentile of 100 ms buckets, per second
	OutageAttempts    int     `json:"outage_attempts"`           // turned away while the broker was down
	ReconnectedAfter  Seconds `json:"reconnected_after_s"`       // broker back → every device connected
	DrainedAfter      Seconds `json:"drained_after_s"`           // broker back → every backlog delivered
	HeapPerDevice     uint64  `json:"heap_bytes_per_device"`     // Go heap and stacks, broker and gate included
	RSSPerDevice      uint64  `json:"rss_bytes_per_device"`      // resident memory (Linux), SQLite's included
	GoroutinesPerDev  float64 `json:"goroutines_per_device"`
	SetupTime         Seconds `json:"setup_s"` // opening every device and connecting it
	ExternalBroker    bool    `json:"external_broker"`
	DeliveryTimeout   bool    `json:"delivery_timeout,omitempty"` // recovery did not finish within Timeout
	DevicesNotDrained int     `json:"devices_not_drained,omitempty"`
}

// Seconds is a duration that marshals as seconds.
type Seconds time.Duration

// MarshalJSON writes the duration in seconds, to the millisecond.
func (s Seconds) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, time.Duration(s).Seconds(), 'f', 3, 64), nil
}

// String rounds to 10 ms.
func (s Seconds) String() string { return time.Duration(s).Round(10 * time.Millisecond).String() }

// device is one simulated terminal.
type device struct {
	name  string
	path  string
	topic string
	ob    *outbox.Outbox
	pub   *outbox.MQTTPublisher
	relay *outbox.Relay
}

// ledger is the consumer's and the writers' shared record.
type ledger struct {
	mu        sync.Mutex
	committed map[string]int // event id → device
	seen      map[string]int // event id → deliveries
	phantom   int
	// After the broker returns: what each device still has to deliver of
	// what it committed before, and when it was done.
	backlog   []map[string]bool
	remaining int
	drainedAt time.Time
}

func (l *ledger) commit(id string, dev int) {
	l.mu.Lock()
	l.committed[id] = dev
	l.mu.Unlock()
}

func (l *ledger) deliver(payload []byte) {
	ev, err := outbox.DecodeEvent(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.phantom++
		return
	}
	l.seen[ev.ID]++
	if l.backlog == nil || l.seen[ev.ID] > 1 {
		return
	}
	if dev, ok := l.committed[ev.ID]; ok && l.backlog[dev][ev.ID] {
		delete(l.backlog[dev], ev.ID)
		if len(l.backlog[dev]) == 0 {
			l.remaining--
			if l.remaining == 0 {
				l.drainedAt = time.Now()
			}
		}
	}
}

// snapshot records, at the broker's return, what every device has yet to
// deliver; it returns the total.
func (l *ledger) snapshot(devices int, at time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.backlog = make([]map[string]bool, devices)
	for i := range l.backlog {
		l.backlog[i] = map[string]bool{}
	}
	total := 0
	for id, dev := range l.committed {
		if l.seen[id] == 0 {
			l.backlog[dev][id] = true
			total++
		}
	}
	for _, b := range l.backlog {
		if len(b) > 0 {
			l.remaining++
		}
	}
	if l.remaining == 0 {
		l.drainedAt = at
	}
	return total
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.committed)
}

func (l *ledger) drained() (time.Time, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.drainedAt, l.remaining
}

// missing is how many committed events were not delivered yet.
func (l *ledger) missing() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id := range l.committed {
		if l.seen[id] == 0 {
			n++
		}
	}
	return n
}

// Run runs one scenario and reports what it measured. An error means the
// simulation itself could not run; loss is reported, not returned.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return rep, err
	}
	rep.Devices = cfg.Devices
	rep.PayloadBytes = cfg.PayloadBytes
	rep.Jitter = max(cfg.Reconnect.Jitter, 0)
	if cfg.Reconnect.Jitter == 0 {
		rep.Jitter = 0.5 // the library's default
	}
	rep.ExternalBroker = cfg.Broker != ""

	dir, cleanup, err := workDir(cfg.Dir, "outbox-fleet-")
	if err != nil {
		return rep, err
	}
	defer cleanup()
	run := outbox.NewID()[24:] // keeps topics and client ids of runs apart
	prefix := "fleet/" + run

	before := memory()

	led := &ledger{committed: map[string]int{}, seen: map[string]int{}}
	brokerURL, stopBroker, err := brokerOrEmbedded(ctx, cfg.Broker, "fleet-consumer-"+run, prefix+"/#", led.deliver)
	if err != nil {
		return rep, err
	}
	defer stopBroker()
	target, err := outbox.ParseBrokerURL(brokerURL)
	if err != nil {
		return rep, err
	}
	if target.Scheme != "tcp" && target.Scheme != "mqtt" {
		return rep, fmt.Errorf("broker %s: the fleet simulation speaks plain MQTT (tcp://) only", target.Redacted())
	}
	g, err := startGate(target.Host)
	if err != nil {
		return rep, err
	}
	defer g.close()

	// Devices: opened a few at a time, each with its relay and its writer.
	setupStart := time.Now()
	cfg.Progress("opening %d devices in %s", cfg.Devices, dir)
	devs, closeDevs, err := startDevices(cfg.Devices, func(i int) (*device, error) {
		return openDevice(dir, prefix, run, g.url(), i, cfg)
	})
	defer closeDevs()
	if err != nil {
		return rep, err
	}
	if err := waitFor(ctx, 2*time.Minute, func() bool { return g.connected() == cfg.Devices }); err != nil {
		return rep, fmt.Errorf("connecting the fleet: %d of %d connected: %w", g.connected(), cfg.Devices, err)
	}
	rep.SetupTime = Seconds(time.Since(setupStart))

	writeCtx, stopWriters := context.WithCancel(ctx)
	var writers sync.WaitGroup
	var commitErrs atomic.Int64
	for i, d := range devs {
		writers.Add(1)
		go func() {
			defer writers.Done()
			commitErrs.Add(int64(d.write(writeCtx, cfg.Rate, cfg.PayloadBytes, i, led)))
		}()
	}
	defer func() { stopWriters(); writers.Wait() }()

	cfg.Progress("steady traffic for %s (%g events/s per device)", cfg.Steady, cfg.Rate)
	if !sleep(ctx, cfg.Steady) {
		return rep, ctx.Err()
	}
	after := memory()
	rep.HeapPerDevice = (after.heap - min(before.heap, after.heap)) / uint64(cfg.Devices)
	rep.RSSPerDevice = (after.rss - min(before.rss, after.rss)) / uint64(cfg.Devices)
	rep.GoroutinesPerDev = float64(after.goroutines-before.goroutines) / float64(cfg.Devices)

	cfg.Progress("broker away for %s while every device keeps committing", cfg.Outage)
	cutAt := time.Now()
	g.cut()
	dbAtCut, _ := diskUse(devs)
	committedAtCut := led.count()
	if !sleep(ctx, cfg.Outage) {
		return rep, ctx.Err()
	}
	dbAtBack, walAtBack := diskUse(devs)
	if n := led.count() - committedAtCut; n > 0 {
		rep.DiskPerPendingEvent = float64(int64(dbAtBack)-int64(dbAtCut)) / float64(n)
	}
	rep.DiskPerDevice = (dbAtBack + walAtBack) / uint64(cfg.Devices)
	back := time.Now()
	g.restore()
	rep.OutageAttempts = len(g.attemptsSince(cutAt)) // all before back so far
	rep.PeakBacklog = led.snapshot(cfg.Devices, back)
	cfg.Progress("broker back; %d events waiting", rep.PeakBacklog)

	var reconnectedAt time.Time
	err = waitFor(ctx, cfg.Timeout, func() bool {
		if reconnectedAt.IsZero() && g.connected() == cfg.Devices {
			reconnectedAt = time.Now()
		}
		at, _ := led.drained()
		return !reconnectedAt.IsZero() && !at.IsZero()
	})
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	drainedAt, left := led.drained()
	end := time.Now()
	if err != nil {
		rep.DeliveryTimeout = true
		rep.DevicesNotDrained = left
	} else {
		end = maxTime(reconnectedAt, drainedAt)
		rep.ReconnectedAfter = Seconds(reconnectedAt.Sub(back))
		rep.DrainedAfter = Seconds(drainedAt.Sub(back))
	}
	var recovery []time.Time
	for _, a := range g.attemptsSince(back) {
		if !a.After(end) {
			recovery = append(recovery, a)
		}
	}
	rep.RecoveryAttempts = len(recovery)
	rep.PeakPerSecond = peakInWindow(recovery, time.Second)
	rep.Peak100msPerSec = float64(peakInWindow(recovery, 100*time.Millisecond)) * 10
	rep.P99PerSecond = p99Buckets(recovery, back, end, 100*time.Millisecond) * 10

	// The end: writers stop, every relay empties its outbox, the consumer
	// must have every committed event.
	stopWriters()
	writers.Wait()
	rep.CommitErrors = int(commitErrs.Load())
	cfg.Progress("writers stopped; waiting for the last deliveries")
	waitFor(ctx, 30*time.Second, func() bool { return led.missing() == 0 })

	led.mu.Lock()
	rep.Committed = len(led.committed)
	for id, n := range led.seen {
		if _, ok := led.committed[id]; !ok {
			rep.Phantom++
			continue
		}
		rep.Delivered++
		rep.Duplicates += n - 1
	}
	rep.Phantom += led.phantom
	rep.Lost = rep.Committed - rep.Delivered
	led.mu.Unlock()
	return rep, nil
}

func openDevice(dir, prefix, run, broker string, i int, cfg Config) (*device, error) {
	// Commits from this process wake the relay at once; the poll is for
	// other processes where the WAL cannot be watched, and hundreds of
	// relays polling every 2 ms would take this machine's CPU.
	return openDeviceWith(dir, prefix, run, broker, i, outbox.RelayOptions{
		Reconnect: cfg.Reconnect, PollInterval: 250 * time.Millisecond, Retention: -1})
}

// startDevices opens n devices with open and runs their relays; stop ends
// the relays and closes every device opened, also after an error.
func startDevices(n int, open func(i int) (*device, error)) (devs []*device, stop func(), err error) {
	devs = make([]*device, 0, n)
	relayCtx, stopRelays := context.WithCancel(context.Background())
	var relays sync.WaitGroup
	stop = func() {
		stopRelays()
		relays.Wait()
		for _, d := range devs {
			d.ob.Close()
			d.pub.Close()
		}
	}
	for i := range n {
		d, err := open(i)
		if err != nil {
			return devs, stop, err
		}
		devs = append(devs, d)
		relays.Add(1)
		go func() { defer relays.Done(); d.relay.Run(relayCtx) }()
	}
	return devs, stop, nil
}

// openDeviceWith opens device i with its relay on ro (its Source,
// TopicPrefix and Owner are the device's).
func openDeviceWith(dir, prefix, run, broker string, i int, ro outbox.RelayOptions) (*device, error) {
	name := fmt.Sprintf("dev-%04d", i)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// NORMAL: hundreds of simulated devices share this one disk, where a
	// real fleet has a disk each; the simulation measures the network side.
	path := filepath.Join(dir, name+".db")
	own := prefix + "/" + name + "/" // what the broker's ACL would allow
	ob, err := outbox.Open(context.Background(), path, outbox.Options{
		TopicPrefix:  own,
		Synchronous:  outbox.SyncNormal,
		ReserveBytes: -1,
		Logger:       quiet,
	})
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	// Half the fleet speaks MQTT 5 and half 3.1.1, as a fleet mid-upgrade
	// would, so that both go through every run's checks.
	proto := []outbox.MQTTProtocol{outbox.Protocol5, outbox.Protocol311}[i%2]
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: broker, ClientID: "fleet-" + run + "-" + name, Protocol: proto, Logger: quiet})
	if err != nil {
		ob.Close()
		return nil, err
	}
	ro.Source, ro.TopicPrefix, ro.Owner = "/fleet/"+name, own, name
	relay, err := ob.NewRelay(pub, ro)
	if err != nil {
		ob.Close()
		pub.Close()
		return nil, err
	}
	return &device{name: name, path: path, topic: own + "sales", ob: ob, pub: pub, relay: relay}, nil
}

// write commits rate events per second until ctx ends; it returns how many
// transactions failed.
func (d *device) write(ctx context.Context, rate float64, size, dev int, led *ledger) int {
	interval := time.Duration(float64(time.Second) / rate)
	// Devices do not sell in lockstep.
	if !sleep(ctx, rand.N(interval)) {
		return 0
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failed := 0
	for n := 0; ; n++ {
		id := outbox.NewID()
		payload := fmt.Appendf(make([]byte, 0, size), `{"device":%q,"n":%d,"pad":"`, d.name, n)
		for len(payload) < size-2 {
			payload = append(payload, 'x')
		}
		payload = append(payload, `"}`...)
		err := d.ob.Transact(ctx, func(tx *sql.Tx) error {
			return d.ob.Enqueue(ctx, tx, outbox.Message{Topic: d.topic, Payload: payload, ID: id, Type: "com.example.sale"})
		})
		// A commit that returned nil counts even if ctx ended just after:
		// its event will be delivered.
		switch {
		case err == nil:
			led.commit(id, dev)
		case ctx.Err() == nil:
			failed++
		}
		if ctx.Err() != nil {
			return failed
		}
		select {
		case <-ctx.Done():
			return failed
		case <-t.C:
		}
	}
}

// subscribe is the consumer on an external broker: a clean QoS 1
// subscription, straight to the broker (not through the gate).
func subscribe(ctx context.Context, broker, clientID, filter string, deliver func([]byte)) (func(), error) {
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(clientID).SetCleanSession(true).
		SetAutoReconnect(false).SetOrderMatters(false).SetConnectTimeout(10 * time.Second)
	c := mqtt.NewClient(o)
	if t := c.Connect(); !t.WaitTimeout(15*time.Second) || t.Error() != nil {
		return nil, fmt.Errorf("consumer: connect to %s: %v", broker, t.Error())
	}
	t := c.Subscribe(filter, 1, func(_ mqtt.Client, m mqtt.Message) { deliver(m.Payload()) })
	if !t.WaitTimeout(15*time.Second) || t.Error() != nil {
		c.Disconnect(0)
		return nil, fmt.Errorf("consumer: subscribe %s: %v", filter, t.Error())
	}
	return func() { c.Disconnect(250) }, nil
}

// diskUse checkpoints every device's WAL into its database (passively: the
// relays are idle while the broker is away) and returns the bytes of the
// databases' pages in use and the WALs' total size.
func diskUse(devs []*device) (db, wal uint64) {
	for _, d := range devs {
		d.ob.DB().Exec(`PRAGMA wal_checkpoint(PASSIVE)`)
		// The pages in use, as the database sees them: the file's size
		// depends on how far the checkpoint got (a relay's read can hold
		// it back) and on free pages waiting for incremental vacuum.
		var pages, free, size uint64
		if err := d.ob.DB().QueryRow(`SELECT (SELECT page_count FROM pragma_page_count()),
			(SELECT freelist_count FROM pragma_freelist_count()), (SELECT page_size FROM pragma_page_size())`).Scan(&pages, &free, &size); err == nil {
			db += (pages - free) * size
		}
		if fi, err := os.Stat(d.path + "-wal"); err == nil {
			wal += uint64(fi.Size())
		}
	}
	return db, wal
}

type memSample struct {
	heap, rss  uint64
	goroutines int
}

func memory() memSample {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s := memSample{heap: m.HeapInuse + m.StackInuse, goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseUint(f[1], 10, 64)
			s.rss = pages * uint64(os.Getpagesize())
		}
	}
	return s
}

// peakInWindow is the most timestamps (sorted) in any window of length w.
func peakInWindow(ts []time.Time, w time.Duration) int {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	peak, lo := 0, 0
	for hi := range ts {
		for ts[hi].Sub(ts[lo]) >= w {
			lo++
		}
		peak = max(peak, hi-lo+1)
	}
	return peak
}

// p99Buckets is the 99th percentile of the counts in consecutive buckets of
// length w from start to end, empty buckets included.
func p99Buckets(ts []time.Time, start, end time.Time, w time.Duration) float64 {
	n := int(end.Sub(start)/w) + 1
	counts := make([]int, n)
	for _, t := range ts {
		if i := int(t.Sub(start) / w); i >= 0 && i < n {
			counts[i]++
		}
	}
	slices.Sort(counts)
	return float64(counts[min(n-1, n*99/100)])
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

var errTimeout = errors.New("timed out")

// waitFor polls cond every 10 ms until it holds, ctx ends or d passes.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errTimeout
		}
		if !sleep(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// brokerOrEmbedded is the broker a run uses: url, or the in-process broker
// when url is empty. With deliver set, a subscriber (clientID, on filter)
// hands it every payload the broker routes. stop ends both.
func brokerOrEmbedded(ctx context.Context, url, clientID, filter string, deliver func([]byte)) (_ string, stop func(), err error) {
	if url != "" {
		if deliver == nil {
			return url, func() {}, nil
		}
		stop, err := subscribe(ctx, url, clientID, filter, deliver)
		return url, stop, err
	}
	b, err := harness.LaunchMochi(harness.MochiOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("embedded broker: %w", err)
	}
	if deliver != nil {
		if err := b.Subscribe(filter, func(m harness.Message) { deliver(m.Payload) }); err != nil {
			b.Close()
			return "", nil, fmt.Errorf("embedded broker: %w", err)
		}
	}
	return b.URL(), func() { b.Close() }, nil
}

// workDir is dir, or a temporary directory named after prefix that cleanup
// removes.
func workDir(dir, prefix string) (_ string, cleanup func(), err error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	if dir, err = os.MkdirTemp("", prefix); err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}
