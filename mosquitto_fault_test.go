//go:build linux

package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// The fault test against a real Mosquitto: go test -race -run TestMosquittoBrokerFaults -v .
// Its premise, that Mosquitto keeps a persistent session across a restart,
// is a case of tests/integration (TestMosquitto/mqtt_*/session_survives_a_restart).
//
// OUTBOX_FAULTS=1000 raises the number of network faults of
// TestMosquittoBrokerFaults (default 100, about a minute);
// OUTBOX_FAULT_SEED replays a logged schedule; it runs over MQTT 5 and then
// over 3.1.1 with a third of the faults (both with OUTBOX_FAULTS's number if
// set); OUTBOX_FAULTS_MQTT=5 or 3.1.1 runs only that one. Not auto: it would
// switch to 3.1.1 after two cuts right after a CONNECT.

// faultKind is one kind of fault injected by TestMosquittoBrokerFaults.
type faultKind int

const (
	faultCut faultKind = iota
	faultBlackholeUp
	faultBlackholeDown
	faultStall
	faultRefuse
	faultRestart
	numFaultKinds
)

func (k faultKind) String() string {
	return [...]string{"cut", "blackhole relay->broker then cut", "blackhole broker->relay then cut",
		"stall (no bytes, nothing closed)", "refuse connections (outage)", "Mosquitto restart"}[k]
}

// faultDeck returns the shuffled schedule: n proxy faults in fixed shares
// (each kind at least once) plus a Mosquitto restart per ten.
func faultDeck(rng *rand.Rand, n int) []faultKind {
	shares := map[faultKind]int{faultBlackholeUp: 20, faultBlackholeDown: 20, faultStall: 10, faultRefuse: 20}
	var deck []faultKind
	rest := n
	for k := faultBlackholeUp; k <= faultRefuse; k++ {
		c := max(1, n*shares[k]/100)
		for range c {
			deck = append(deck, k)
		}
		rest -= c
	}
	for range max(1, rest) {
		deck = append(deck, faultCut)
	}
	for range max(1, n/10) {
		deck = append(deck, faultRestart)
	}
	rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
	return deck
}

// injected is one fault as it happened.
type injected struct {
	kind       faultKind
	start, end time.Time
	planned    time.Duration // how long it was meant to last
}

// relayLog counts what the relay logs, and keeps the connection losses and
// charged attempts with their time, to tell which fault caused what.
type relayLog struct {
	mu       sync.Mutex
	counts   map[string]int
	lost     []logEvent
	charges  []logEvent
	connects []time.Time
}

type logEvent struct {
	at   time.Time
	text string // the record's attributes
}

type relayLogHandler struct {
	next  slog.Handler
	log   *relayLog
	attrs []slog.Attr
}

func (h relayLogHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h relayLogHandler) Handle(ctx context.Context, r slog.Record) error {
	l := h.log
	l.mu.Lock()
	l.counts[r.Message]++
	switch r.Message {
	case "outbox relay connected":
		l.connects = append(l.connects, r.Time)
	case "outbox relay connection lost", "outbox message failed":
		var b strings.Builder
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, "%s=%v ", a.Key, a.Value)
			return true
		})
		ev := logEvent{at: r.Time, text: strings.TrimSpace(b.String())}
		if r.Message == "outbox message failed" {
			l.charges = append(l.charges, ev)
		} else {
			l.lost = append(l.lost, ev)
		}
	}
	l.mu.Unlock()
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h relayLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return relayLogHandler{next: h.next.WithAttrs(as), log: h.log}
}

func (h relayLogHandler) WithGroup(name string) slog.Handler {
	return relayLogHandler{next: h.next.WithGroup(name), log: h.log}
}

func (l *relayLog) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[msg]
}

// lastConnect is the time of the relay's latest connection.
func (l *relayLog) lastConnect() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.connects) == 0 {
		return time.Time{}
	}
	return l.connects[len(l.connects)-1]
}

func envInt(t *testing.T, name string, def int64) int64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err, name)
	return n
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// TestMosquittoBrokerFaults drains an outbox through a fault-injecting
// proxy into a real Mosquitto while a writer commits at a steady rate, and
// checks that nothing is lost, first deliveries keep commit order, nothing
// is charged or dead-lettered, and the relay is back to full speed after.
func TestMosquittoBrokerFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a real Mosquitto and many faults")
	}
	nFaults := int(envInt(t, "OUTBOX_FAULTS", 100))
	require.Positive(t, nFaults, "OUTBOX_FAULTS")
	if v := os.Getenv("OUTBOX_FAULTS_MQTT"); v != "" {
		proto, err := ParseMQTTProtocol(v)
		require.NoError(t, err, "OUTBOX_FAULTS_MQTT")
		testMosquittoBrokerFaults(t, proto, nFaults)
		return
	}
	// Both versions; 3.1.1 with a third of the faults unless OUTBOX_FAULTS
	// says, so that CI runs both within a minute and a half.
	faults311 := nFaults
	if os.Getenv("OUTBOX_FAULTS") == "" {
		faults311 = nFaults / 3
	}
	t.Run("mqtt 5", func(t *testing.T) { testMosquittoBrokerFaults(t, Protocol5, nFaults) })
	t.Run("mqtt 3.1.1", func(t *testing.T) { testMosquittoBrokerFaults(t, Protocol311, faults311) })
}

func testMosquittoBrokerFaults(t *testing.T, proto MQTTProtocol, nFaults int) {
	seed := envInt(t, "OUTBOX_FAULT_SEED", time.Now().UnixNano())
	rng := rand.New(rand.NewSource(seed))
	deck := faultDeck(rng, nFaults)
	t.Logf("fault schedule seed %d (OUTBOX_FAULT_SEED=%d replays it): %d faults", seed, seed, len(deck))
	testStart := time.Now()
	ctx := context.Background()

	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	sub := startPersistentSubscriber(t, m.Addr(), "outbox-faults-subscriber", "orders/#")
	proxy := harness.StartFaultProxy(t, m.Addr())
	rl := &relayLog{counts: map[string]int{}}
	ob := openTest(t, Options{Logger: slog.New(relayLogHandler{next: testLogger().Handler(), log: rl})})

	const (
		keepAlive   = time.Second // MQTT keepalive has a resolution of 1 s
		pingTimeout = 250 * time.Millisecond
		ackTimeout  = 1300 * time.Millisecond // races the keepalive: both get exercised
	)
	t.Logf("MQTT %s", proto)
	pub, err := NewMQTTPublisher(MQTTOptions{
		Broker: proxy.URL(), ClientID: "outbox-faults-relay",
		ConnectTimeout: time.Second, WriteTimeout: time.Second, KeepAlive: keepAlive, PingTimeout: pingTimeout,
		Protocol: proto, Logger: testLogger(),
	})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	opts := fastRelay()
	opts.AckTimeout = ackTimeout
	opts.Reconnect = Backoff{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond}
	opts.LeaseTTL = 10 * time.Second
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)

	var committedMu sync.Mutex
	committed := 0
	addCommitted := func(n int) {
		committedMu.Lock()
		committed += n
		committedMu.Unlock()
	}
	getCommitted := func() int {
		committedMu.Lock()
		defer committedMu.Unlock()
		return committed
	}
	commit := func(n int, batch int) error {
		msgs := make([]Message, batch)
		for i := range msgs {
			msgs[i] = Message{Topic: "orders/fault", Type: "order.created", Payload: fmt.Appendf(nil, `{"order":%d,"line":%d}`, n, i)}
		}
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (item) VALUES (?)`, fmt.Sprint("order-", n)); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, msgs...)
		})
		if err == nil {
			addCommitted(batch)
		}
		return err
	}
	allDelivered := func() bool {
		return sub.Log.Unique() >= getCommitted() && int(r.sent.Load()) >= getCommitted()
	}

	// A burst of n messages committed at once: how fast the relay drains it
	// (acknowledged by Mosquitto and marked sent) and how fast it reaches
	// the subscriber.
	// peakInFlight is the most messages seen awaiting their PUBACK at once
	// during the bursts after the faults: the window must have opened
	// again (the isolation rule sends a suspect alone, then the rest).
	var peakInFlight int64
	burst := func(name string, n int) (relayRate, endToEnd float64) {
		t.Helper()
		require.True(t, harness.WaitFor(60*time.Second, allDelivered), "%s: the queue is drained before the burst", name)
		sent0, uniq0 := r.sent.Load(), sub.Log.Unique()
		start := time.Now()
		require.NoError(t, commit(-1, n))
		var relayDone time.Duration
		ok := harness.WaitFor(60*time.Second, func() bool {
			peakInFlight = max(peakInFlight, r.inFlight.Load())
			if relayDone == 0 && r.sent.Load()-sent0 >= int64(n) {
				relayDone = time.Since(start)
			}
			return relayDone != 0 && sub.Log.Unique()-uniq0 >= n
		})
		require.True(t, ok, "%s: burst of %d delivered within 60 s", name, n)
		e2e := time.Since(start)
		return float64(n) / relayDone.Seconds(), float64(n) / e2e.Seconds()
	}
	// The best of two bursts, so that a moment of CPU contention (other
	// tests, -race) does not pass for the relay's speed.
	var burstLog []string
	bestBurst := func(name string, n int) (relayRate, endToEnd float64) {
		t.Helper()
		for i := 0; i < 2; i++ {
			rr, ee := burst(name, n)
			burstLog = append(burstLog, fmt.Sprintf("%s #%d: relay %.0f msg/s, end to end %.0f msg/s", name, i+1, rr, ee))
			relayRate, endToEnd = max(relayRate, rr), max(endToEnd, ee)
		}
		return relayRate, endToEnd
	}

	// Warm up, then the baseline burst.
	for i := 0; i < 10; i++ {
		require.NoError(t, commit(i, 1))
	}
	require.True(t, harness.WaitFor(30*time.Second, allDelivered), "warm-up delivered")
	const burstSize = 2000
	relayBefore, e2eBefore := bestBurst("before the faults", burstSize)

	// The writer: one order and its event every 4 ms, all through the
	// faults.
	writerCtx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		tick := time.NewTicker(4 * time.Millisecond)
		defer tick.Stop()
		for n := 1000; ; n++ {
			select {
			case <-writerCtx.Done():
				return
			case <-tick.C:
			}
			if err := commit(n, 1); err != nil {
				t.Errorf("writer: %v", err)
				return
			}
		}
	}()
	defer func() { stopWriter(); <-writerDone }()

	// The faults, at random moments. Between two faults the relay carries
	// traffic; how long it takes to deliver again after a fault is
	// measured in the gap.
	var (
		timeline      []injected
		byKind        [numFaultKinds]int
		recoveries    []time.Duration
		notRecovered  int
		restartErrors int
	)
	faultPhase := time.Now()
	for i, kind := range deck {
		gap := time.Duration(20+rng.Intn(230)) * time.Millisecond
		if i == 0 {
			time.Sleep(gap) // the fault schedule
		} else {
			prev := timeline[len(timeline)-1]
			sentAtEnd := r.sent.Load()
			var connectSent int64 = -1
			var connectAt time.Time
			recovered := false
			deadline := prev.end.Add(gap)
			for time.Now().Before(deadline) {
				// Recovered: a connection made after the fault began has
				// carried a message (or, if the connection survived the
				// fault, messages flow again).
				if c := rl.lastConnect(); c.After(prev.start) {
					if !c.Equal(connectAt) {
						connectAt, connectSent = c, r.sent.Load()
					}
					if r.sent.Load() > connectSent && !recovered {
						recovered = true
						recoveries = append(recoveries, max(0, time.Since(prev.end)))
					}
				} else if r.sent.Load() > sentAtEnd && !recovered && r.connected.Load() {
					recovered = true
					recoveries = append(recoveries, max(0, time.Since(prev.end)))
				}
				time.Sleep(time.Millisecond) // measuring inside the schedule's gap
			}
			if !recovered {
				notRecovered++
			}
		}
		f := injected{kind: kind, start: time.Now()}
		switch kind {
		case faultCut:
			proxy.Cut(rng.Intn(2) == 0)
		case faultBlackholeUp:
			f.planned = time.Duration(50+rng.Intn(550)) * time.Millisecond
			proxy.Blackhole(harness.ToBroker, f.planned)
		case faultBlackholeDown:
			f.planned = time.Duration(50+rng.Intn(550)) * time.Millisecond
			proxy.Blackhole(harness.ToClient, f.planned)
		case faultStall:
			f.planned = time.Duration(1600+rng.Intn(800)) * time.Millisecond
			proxy.StallFor(f.planned)
		case faultRefuse:
			f.planned = time.Duration(50+rng.Intn(550)) * time.Millisecond
			if err := proxy.Refuse(f.planned); err != nil {
				t.Fatalf("proxy cannot listen again: %v", err)
			}
		case faultRestart:
			f.planned = time.Duration(rng.Intn(300)) * time.Millisecond
			if err := m.Restart(f.planned); err != nil {
				restartErrors++
				t.Errorf("Mosquitto did not come back: %v", err)
			}
		}
		f.end = time.Now()
		timeline = append(timeline, f)
		byKind[kind]++
		if restartErrors > 0 {
			break
		}
	}
	faultsTook := time.Since(faultPhase)
	stopWriter()
	<-writerDone

	// Everything committed through the faults must arrive, once the network
	// is healthy again.
	healStart := time.Now()
	drained := harness.WaitFor(60*time.Second, allDelivered)
	healTook := time.Since(healStart)
	if !drained {
		t.Errorf("not everything delivered within 60 s of the last fault: committed %d, delivered %d, marked sent %d",
			getCommitted(), sub.Log.Unique(), r.sent.Load())
	}
	var relayAfter, e2eAfter float64
	peakInFlight = 0
	if drained {
		relayAfter, e2eAfter = bestBurst("after the faults", burstSize)
	}

	// What reached the subscriber against what was committed.
	type row struct {
		seq      int64
		id       string
		state    string
		attempts int
		lastErr  string
	}
	var rows []row
	dbRows, err := ob.DB().Query(`SELECT seq, id, state, attempts, coalesce(last_error, '') FROM outbox_messages ORDER BY seq`)
	require.NoError(t, err)
	for dbRows.Next() {
		var x row
		require.NoError(t, dbRows.Scan(&x.seq, &x.id, &x.state, &x.attempts, &x.lastErr))
		rows = append(rows, x)
	}
	require.NoError(t, dbRows.Err())
	dbRows.Close()
	var missing, dead, chargedRows, chargedTotal, maxAttempts int
	var missingSample []int64
	var charged []string
	ids := make(map[string]bool, len(rows))
	for _, x := range rows {
		ids[x.id] = true
		if !sub.Log.Has(x.id) {
			missing++
			if len(missingSample) < 10 {
				missingSample = append(missingSample, x.seq)
			}
		}
		if x.state == string(StateDead) {
			dead++
		}
		if x.attempts > 0 {
			chargedRows++
			chargedTotal += x.attempts
			charged = append(charged, fmt.Sprintf("seq %d: %d attempt(s), %s, last error %q", x.seq, x.attempts, x.state, x.lastErr))
		}
		maxAttempts = max(maxAttempts, x.attempts)
	}
	got := sub.Log.Snapshot()
	phantoms := 0
	for id := range got.Seen {
		if !ids[id] {
			phantoms++
		}
	}
	delivered, unique, dups, decodeErrs := got.Deliveries, len(got.FirstSeqs), got.Duplicates, got.DecodeErrors
	disorder := got.Disorder

	// Which fault was under way (or last) when each charge happened.
	rl.mu.Lock()
	chargeLog := slices.Clone(rl.charges)
	lost := slices.Clone(rl.lost)
	connects := len(rl.connects)
	rl.mu.Unlock()
	rl.mu.Lock()
	connectTimes := slices.Clone(rl.connects)
	rl.mu.Unlock()
	faultAt := func(at time.Time) string {
		for i := len(timeline) - 1; i >= 0; i-- {
			f := timeline[i]
			if f.start.After(at) {
				continue
			}
			// The relay's last connection made before the fault began.
			conn := "no connection before it"
			if j := slices.IndexFunc(connectTimes, func(c time.Time) bool { return c.After(f.start) }); j != 0 {
				if j < 0 {
					j = len(connectTimes)
				}
				conn = fmt.Sprintf("the relay had connected %s before it began", f.start.Sub(connectTimes[j-1]).Round(time.Microsecond))
			}
			return fmt.Sprintf("%s #%d, %s after it began (it lasted %s; %s)", f.kind, i,
				at.Sub(f.start).Round(time.Millisecond), f.end.Sub(f.start).Round(time.Millisecond), conn)
		}
		return "before any fault"
	}
	// How the relay noticed each stall: its first connection loss after
	// the stall began.
	var stallByAck, stallByKeepalive, stallOther, stallUnnoticed int
	for _, f := range timeline {
		if f.kind != faultStall {
			continue
		}
		i := slices.IndexFunc(lost, func(e logEvent) bool { return !e.at.Before(f.start) && !e.at.After(f.end) })
		switch {
		case i < 0:
			stallUnnoticed++
		case strings.Contains(lost[i].text, errNoAck.Error()):
			stallByAck++
		case strings.Contains(lost[i].text, mqtt.ErrDisconnected.Error()), strings.Contains(lost[i].text, errConnectionLost.Error()):
			stallByKeepalive++ // paho's PINGRESP timeout closed the connection
		default:
			stallOther++
		}
	}

	// A fault that lasted much longer than planned means the machine starved
	// this process: timers fire late, all at once, and a fault then tends to
	// strike just as the relay reconnects.
	var maxOverrun time.Duration
	late := 0
	for _, f := range timeline {
		o := f.end.Sub(f.start) - f.planned
		maxOverrun = max(maxOverrun, o)
		if o > 250*time.Millisecond {
			late++
		}
	}
	t.Logf("faults: %d in %s (seed %d); %d ran over their planned length by more than 250 ms (at most %s): CPU starvation",
		len(timeline), faultsTook.Round(time.Millisecond), seed, late, maxOverrun.Round(time.Millisecond))
	for k := faultKind(0); k < numFaultKinds; k++ {
		t.Logf("  %-36s %d", k.String()+":", byKind[k])
	}
	t.Logf("Mosquitto restarts: %d (SIGKILLed, database not saved: %d); subscriber reconnects %d, sessions lost %d",
		m.Restarts(), m.Killed(), sub.Reconnects(), sub.SessionsLost())
	// Mosquitto's own view: why it dropped clients other than a plain close.
	reasons := map[string]int{}
	for _, line := range strings.Split(m.LogSince(0), "\n") {
		if i := strings.Index(line, " disconnected due to "); i >= 0 {
			reason := strings.TrimSuffix(line[i+len(" disconnected due to "):], ".")
			if reason == "out of memory" {
				// What 2.0.11 logs when it cannot write a PUBACK: after a
				// stall, the late bytes of a connection the relay had
				// already closed.
				reason = "out of memory (a PUBACK it could not write)"
			}
			reasons[reason]++
		} else if strings.Contains(line, "has exceeded timeout") {
			reasons["keepalive timeout"]++
		}
	}
	t.Logf("Mosquitto disconnected clients for: %v", reasons)
	t.Logf("stalls noticed by: ack timeout %d, keepalive (PINGRESP timeout) %d, other %d, not at all %d",
		stallByAck, stallByKeepalive, stallOther, stallUnnoticed)
	t.Logf("relay: %d connections, %d lost, %d failed connection attempts; proxy: %d connections, bytes blackholed up %d / down %d, failed re-listens %d",
		connects, rl.count("outbox relay connection lost"), rl.count("outbox relay cannot connect"),
		proxy.Connected(), proxy.Dropped(harness.ToBroker), proxy.Dropped(harness.ToClient), proxy.Rebinds())
	t.Logf("recovery after a fault (a new connection carrying a message): p50 %s, p90 %s, max %s; next fault came first %d of %d times",
		percentile(recoveries, 0.5).Round(time.Millisecond), percentile(recoveries, 0.9).Round(time.Millisecond),
		percentile(recoveries, 1).Round(time.Millisecond), notRecovered, len(timeline)-1)
	t.Logf("messages: committed %d, delivered %d (unique %d, duplicates %d), missing %d, phantom %d, undecodable %d, out of order %d",
		getCommitted(), delivered, unique, dups, missing, phantoms, decodeErrs, len(disorder))
	t.Logf("charged attempts: %d on %d message(s), max %d per message; dead %d", chargedTotal, chargedRows, maxAttempts, dead)
	for _, c := range charged {
		t.Logf("  charged: %s", c)
	}
	for _, c := range chargeLog {
		t.Logf("  charge at %s: %s; during/after %s", c.at.Format("15:04:05.000"), c.text, faultAt(c.at))
		// What happened in the 3 s before it, relative to the charge.
		from := c.at.Add(-3 * time.Second)
		var story []string
		for i, f := range timeline {
			if f.end.After(from) && f.start.Before(c.at) {
				story = append(story, fmt.Sprintf("fault #%d %s %s..%s", i, f.kind, f.start.Sub(c.at).Round(time.Millisecond), f.end.Sub(c.at).Round(time.Millisecond)))
			}
		}
		for _, ct := range connectTimes {
			if ct.After(from) && !ct.After(c.at) {
				story = append(story, fmt.Sprintf("connected %s", ct.Sub(c.at).Round(time.Millisecond)))
			}
		}
		for _, e := range lost {
			if e.at.After(from) && !e.at.After(c.at.Add(50*time.Millisecond)) {
				story = append(story, fmt.Sprintf("lost %s (%s)", e.at.Sub(c.at).Round(time.Millisecond), e.text))
			}
		}
		t.Logf("    before it: %s", strings.Join(story, "; "))
	}
	t.Logf("throughput, best of two bursts of %d: before the faults relay %.0f msg/s (end to end %.0f/s), after %.0f msg/s (end to end %.0f/s)",
		burstSize, relayBefore, e2eBefore, relayAfter, e2eAfter)
	for _, b := range burstLog {
		t.Logf("  %s", b)
	}
	t.Logf("most in flight at once in the bursts after the faults: %d", peakInFlight)
	t.Logf("drained %s after the last fault; whole test %s", healTook.Round(time.Millisecond), time.Since(testStart).Round(time.Millisecond))

	// The verdict.
	require.GreaterOrEqual(t, len(timeline), nFaults, "faults injected")
	require.Zero(t, missing, "lost: committed events never delivered (first sequence numbers %v)", missingSample)
	require.Zero(t, phantoms, "delivered events that were never committed")
	require.Zero(t, decodeErrs, "undecodable deliveries")
	require.Empty(t, disorder, "first deliveries out of commit order")
	require.Zero(t, dead, "dead-lettered messages")
	// Charged attempts. The isolation rule charges the suspect when the
	// connection it was sent alone on dies before its PUBACK; a network
	// fault that strikes in that window cannot be told from a broker
	// refusing the message, so with faults at random moments a rare
	// coincidental charge remains possible. Under -race here: about one
	// per hundred faults while the suspect went out only after a whole
	// batch had been read and encoded; about one per two hundred since it
	// is read alone, mostly when the machine is starved and the injector's
	// late timers fire just as the relay reconnects. What must never
	// happen is a systematic charge: the same message charged again and
	// again until it is dead (asserted above), or charges in proportion to
	// the faults. OUTBOX_STRICT_ATTEMPTS=1 asserts none at all.
	if chargedTotal > 0 {
		t.Logf("WEAKNESS of the isolation rule: %d network fault(s) charged a message that was alone in flight on a fresh connection (listed above)", chargedTotal)
	}
	require.LessOrEqual(t, chargedTotal*10, len(timeline), "charged attempts: at most one per ten faults (coincidences, not a rule that counts outages)")
	if os.Getenv("OUTBOX_STRICT_ATTEMPTS") != "" {
		require.Zero(t, maxAttempts, "charged attempts: outages never count (see the charges logged above)")
	}
	require.Zero(t, sub.SessionsLost(), "Mosquitto lost the subscriber's session")
	// Not the rates: on a shared machine they vary fourfold from one burst
	// to the next (this check, relay rate after the faults at least half
	// of before, failed on unchanged code under load). What a fault could
	// leave behind is a window that never opens again.
	if drained {
		require.Greater(t, peakInFlight, int64(1), "after the faults the relay keeps more than one message in flight: the window opened again")
	}
}
