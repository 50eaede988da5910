package examples_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestConsumersScaleOut: consumers that scale out. Two tills (an outbox and
// a relay each, in this process) commit events and relay them to
// Mosquitto; three consumer processes (the examples/consumer program) share
// one subscription ($share/backend/stores/#) and one PostgreSQL inbox.
// While the events flow, a consumer is killed with SIGKILL at random
// moments and started again with the same client id. At the end every
// committed event has been applied exactly once across the group: one row
// per event in orders_seen (the handler's table, written in the Inbox's
// transaction), none missing, none twice.
//
// It lives here rather than in tests/integration because it runs the
// example program as a user would, built as the other tests here build it.
//
//	OUTBOX_SCALEOUT_EVENTS=20000 go test -race -run TestConsumersScaleOut -v ./examples  # a long run (default 1200)
//	OUTBOX_SCALEOUT_SEED=12345 ...                                                        # the same kill schedule again
func TestConsumersScaleOut(t *testing.T) {
	events := 1200
	if s := os.Getenv("OUTBOX_SCALEOUT_EVENTS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "OUTBOX_SCALEOUT_EVENTS")
		events = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("OUTBOX_SCALEOUT_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "OUTBOX_SCALEOUT_SEED")
		seed = n
	}
	t.Logf("OUTBOX_SCALEOUT_SEED=%d, %d events", seed, events)
	rng := rand.New(rand.NewPCG(seed, seed))

	consumerBin := build(t, "consumer")
	pg := harness.StartPostgres(t, harness.PostgresOptions{})
	dsn := pg.NewDatabase(t)
	mq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	dir := t.TempDir()

	// The consumers, each with its own client id (its persistent session)
	// and log; a restart appends to the same log.
	const consumers = 3
	var mu sync.Mutex
	procs := make([]*harness.Program, consumers)
	logs := make([]string, consumers)
	starts := 0
	startConsumer := func(i int) {
		logs[i] = filepath.Join(dir, fmt.Sprintf("consumer-%d.log", i))
		starts++
		procs[i] = harness.StartProgram(t, fmt.Sprintf("consumer-%d (start %d)", i, starts), logs[i], consumerBin,
			"--broker", mq.URL(), "--postgres", dsn, "--share", "backend", "--topic", "stores/#",
			"--client-id", fmt.Sprintf("scaleout-%d", i))
	}
	subscribed := func(i int) int {
		b, _ := os.ReadFile(logs[i])
		return strings.Count(string(b), "subscribed to $share/backend/stores/# ")
	}
	for i := range consumers {
		startConsumer(i)
	}
	// The group must exist before the first event: the broker keeps
	// messages for a subscription, not for a subscriber yet to come.
	for i := range consumers {
		harness.Eventually(t, 60*time.Second, fmt.Sprintf("consumer %d subscribed", i), func() bool {
			if procs[i].Exited() {
				b, _ := os.ReadFile(logs[i])
				t.Fatalf("consumer %d exited at start-up:\n%s", i, b)
			}
			return subscribed(i) > 0
		})
	}

	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	appliedRows := func() int {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM orders_seen`).Scan(&n); err != nil {
			t.Logf("count: %v", err)
		}
		return n
	}

	// Two tills.
	ctx := context.Background()
	type till struct {
		ob     *outbox.Outbox
		source string
		topic  string
	}
	var tills []till
	for s := 1; s <= 2; s++ {
		ob, err := outbox.Open(ctx, filepath.Join(dir, fmt.Sprintf("till-%d.db", s)), outbox.Options{Logger: harness.TestLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { ob.Close() })
		source := fmt.Sprintf("/stores/%d/tills/1", s)
		pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: mq.URL(), ClientID: fmt.Sprintf("till-%d", s)})
		require.NoError(t, err)
		t.Cleanup(func() { pub.Close() })
		relay, err := ob.NewRelay(pub, outbox.RelayOptions{Source: source,
			Reconnect: outbox.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}})
		require.NoError(t, err)
		harness.RunInBackground(t, "relay "+source, relay)
		tills = append(tills, till{ob, source, fmt.Sprintf("stores/%d/orders", s)})
	}

	// The kills: one consumer at a time, at a random moment, started again
	// after a random pause, until every event is applied.
	stopChaos := make(chan struct{})
	chaosDone := make(chan int)
	go func() {
		kills := 0
		defer func() { chaosDone <- kills }()
		for {
			select {
			case <-stopChaos:
				return
			case <-time.After(time.Duration(200+rng.IntN(800)) * time.Millisecond): // the fault schedule
			}
			i := rng.IntN(consumers)
			mu.Lock()
			procs[i].Kill()
			kills++
			mu.Unlock()
			select {
			case <-stopChaos:
			case <-time.After(time.Duration(rng.IntN(300)) * time.Millisecond): // how long it stays down
			}
			mu.Lock()
			startConsumer(i)
			mu.Unlock()
		}
	}()

	// Commit the events, a few per transaction, paced so that the kills
	// fall while they flow.
	committed := map[string]bool{} // source + " " + id
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	const perTx = 4
	for n := 0; n < events; {
		<-tick.C // pacing, not synchronisation
		tl := tills[(n/perTx)%len(tills)]
		var batch []outbox.Message
		for k := 0; k < perTx && n < events; k++ {
			n++
			id := outbox.NewID()
			batch = append(batch, outbox.Message{Topic: tl.topic, ID: id, Type: "com.example.pos.OrderPlaced", Payload: fmt.Appendf(nil, `{"n":%d}`, n)})
			committed[tl.source+" "+id] = true
		}
		require.NoError(t, tl.ob.Transact(ctx, func(tx *sql.Tx) error { return tl.ob.Enqueue(ctx, tx, batch...) }))
	}
	for _, tl := range tills {
		harness.Eventually(t, 60*time.Second, "the relay of "+tl.source+" has sent everything", func() bool {
			st, err := tl.ob.Stats(ctx)
			return err == nil && st.Pending == 0
		})
	}
	// The kills go on until the consumers are done, then everyone is up.
	deadline := 60 * time.Second
	if events > 5000 {
		deadline = time.Duration(events/50) * time.Second
	}
	done := harness.WaitFor(deadline, func() bool { return appliedRows() >= events })
	close(stopChaos)
	kills := <-chaosDone
	for i := range consumers {
		if procs[i].Exited() {
			mu.Lock()
			startConsumer(i)
			mu.Unlock()
		}
	}
	if !done {
		harness.Eventually(t, 30*time.Second, fmt.Sprintf("%d events applied (have %d)", events, appliedRows()), func() bool { return appliedRows() >= events })
	}

	// Exactly once: one row per committed event, none else.
	rows, err := db.Query(`SELECT source, id FROM orders_seen`)
	require.NoError(t, err)
	defer rows.Close()
	seen := map[string]int{}
	for rows.Next() {
		var source, id string
		require.NoError(t, rows.Scan(&source, &id))
		seen[source+" "+id]++
	}
	require.NoError(t, rows.Err())
	var twice, unknown []string
	for k, c := range seen {
		if c > 1 {
			twice = append(twice, fmt.Sprintf("%s (%d times)", k, c))
		}
		if !committed[k] {
			unknown = append(unknown, k)
		}
	}
	missing := 0
	for k := range committed {
		if seen[k] == 0 {
			missing++
		}
	}
	require.Empty(t, twice, "applied more than once")
	require.Empty(t, unknown, "applied but never committed")
	require.Zero(t, missing, "committed but not applied")
	var inboxRows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM inbox`).Scan(&inboxRows))
	require.Equal(t, events, inboxRows, "the inbox remembers each event once")

	per := map[string]int{}
	byConsumer, err := db.Query(`SELECT consumer, count(*) FROM orders_seen GROUP BY consumer`)
	require.NoError(t, err)
	defer byConsumer.Close()
	for byConsumer.Next() {
		var c string
		var n int
		require.NoError(t, byConsumer.Scan(&c, &n))
		per[c] = n
	}
	require.NoError(t, byConsumer.Err())
	t.Logf("%d events applied once each by %d consumers (%v), %d kills with SIGKILL, %d consumer starts", events, consumers, per, kills, starts)
	require.Len(t, per, consumers, "the shared subscription spread the events over every consumer")
	require.Positive(t, kills, "the consumers were killed while the events flowed")
}

// TestConsumersThroughput measures what FLEET.md's backend sizing says:
// how many events per second 1, 2 and 3 consumers (examples/consumer
// processes on one $share group) apply to one PostgreSQL inbox. For each
// N the consumers make their sessions, go away, a till's relay queues a
// backlog in Mosquitto for them, and they come back: the time from their
// start to the last event applied. The PostgreSQL server is made durable
// for it (fsync, synchronous_commit and full_page_writes on), as a
// backend's would be. A measurement, not a check: it runs only when asked,
// and without -race for figures that mean something.
//
//	OUTBOX_CONSUMER_THROUGHPUT=5000 go test -count=1 -run TestConsumersThroughput -v ./examples
func TestConsumersThroughput(t *testing.T) {
	s := os.Getenv("OUTBOX_CONSUMER_THROUGHPUT")
	if s == "" {
		t.Skip("a measurement for FLEET.md; OUTBOX_CONSUMER_THROUGHPUT=<events> runs it")
	}
	events, err := strconv.Atoi(s)
	require.NoError(t, err, "OUTBOX_CONSUMER_THROUGHPUT")
	if raceEnabled {
		t.Log("built with -race: the figures are the race detector's, not the program's")
	}
	consumerBin := build(t, "consumer")
	pg := harness.StartPostgres(t, harness.PostgresOptions{Config: []string{"fsync=on", "synchronous_commit=on", "full_page_writes=on"}})
	mq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	ctx := context.Background()
	dir := t.TempDir()
	for _, n := range []int{1, 2, 3} {
		dsn := pg.NewDatabase(t)
		group := fmt.Sprintf("throughput%d", n)
		start := func(i, round int) *harness.Program {
			return harness.StartProgram(t, fmt.Sprintf("consumer %d/%d", i, n), filepath.Join(dir, fmt.Sprintf("%s-%d-%d.log", group, i, round)), consumerBin,
				"--broker", mq.URL(), "--postgres", dsn, "--share", group, "--topic", "stores/#", "--client-id", fmt.Sprintf("%s-%d", group, i))
		}
		subscribed := func(i, round int) bool {
			b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s-%d-%d.log", group, i, round)))
			return strings.Contains(string(b), "subscribed to ")
		}
		// 1. The sessions, then away.
		var procs []*harness.Program
		for i := range n {
			procs = append(procs, start(i, 0))
		}
		for i, p := range procs {
			harness.Eventually(t, 60*time.Second, "subscribed", func() bool { return subscribed(i, 0) })
			p.Kill()
		}
		// 2. The backlog.
		ob, err := outbox.Open(ctx, filepath.Join(dir, group+".db"), outbox.Options{Logger: harness.TestLogger()})
		require.NoError(t, err)
		for k := 0; k < events; k += 100 {
			require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
				var batch []outbox.Message
				for j := k; j < min(k+100, events); j++ {
					batch = append(batch, outbox.Message{Topic: "stores/1/orders", Type: "com.example.pos.OrderPlaced", Payload: fmt.Appendf(nil, `{"n":%d}`, j)})
				}
				return ob.Enqueue(ctx, tx, batch...)
			}))
		}
		pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: mq.URL(), ClientID: group + "-till"})
		require.NoError(t, err)
		relay, err := ob.NewRelay(pub, outbox.RelayOptions{Source: "/stores/1/tills/1"})
		require.NoError(t, err)
		stopRelay := harness.RunInBackground(t, "relay", relay)
		harness.Eventually(t, 5*time.Minute, "the backlog published", func() bool {
			st, err := ob.Stats(ctx)
			return err == nil && st.Pending == 0
		})
		stopRelay()
		pub.Close()
		ob.Close()

		// 3. Back: the time to apply it all.
		db, err := sql.Open("pgx", dsn)
		require.NoError(t, err)
		load0, _ := os.ReadFile("/proc/loadavg")
		began := time.Now()
		procs = procs[:0]
		for i := range n {
			procs = append(procs, start(i, 1))
		}
		harness.Eventually(t, 10*time.Minute, "the backlog applied", func() bool {
			var c int
			return db.QueryRow(`SELECT count(*) FROM orders_seen`).Scan(&c) == nil && c >= events
		})
		took := time.Since(began)
		load1, _ := os.ReadFile("/proc/loadavg")
		var rows, distinct int
		require.NoError(t, db.QueryRow(`SELECT count(*), count(DISTINCT id) FROM orders_seen`).Scan(&rows, &distinct))
		require.Equal(t, []int{events, events}, []int{rows, distinct})
		db.Close()
		for _, p := range procs {
			p.Kill()
		}
		t.Logf("consumers %d: %d events in %s = %.0f events/s (load average before %s, after %s)", n, events, took.Round(time.Millisecond),
			float64(events)/took.Seconds(), strings.Join(strings.Fields(string(load0))[:3], " "), strings.Join(strings.Fields(string(load1))[:3], " "))
	}
}

// TestConsumersPartitioned: the other way to scale out, which keeps each
// till's order. Two consumers on one PostgreSQL inbox, each given its own
// tills' topics (--topics): every event reaches the one consumer of its
// till, and each till's events are applied in the order it committed them.
func TestConsumersPartitioned(t *testing.T) {
	consumerBin := build(t, "consumer")
	pg := harness.StartPostgres(t, harness.PostgresOptions{})
	dsn := pg.NewDatabase(t)
	mq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	dir := t.TempDir()
	partitions := map[string]string{"part-a": "stores/1/#", "part-b": "stores/2/#,stores/3/#"}
	owner := map[string]string{"/stores/1/tills/1": "part-a", "/stores/2/tills/1": "part-b", "/stores/3/tills/1": "part-b"}
	for id, topics := range partitions {
		log := filepath.Join(dir, id+".log")
		p := harness.StartProgram(t, id, log, consumerBin, "--broker", mq.URL(), "--postgres", dsn, "--topics", topics, "--client-id", id)
		harness.Eventually(t, 60*time.Second, id+" subscribed", func() bool {
			if p.Exited() {
				b, _ := os.ReadFile(log)
				t.Fatalf("%s exited at start-up:\n%s", id, b)
			}
			b, _ := os.ReadFile(log)
			return strings.Contains(string(b), "subscribed to "+topics+" ")
		})
	}

	ctx := context.Background()
	const perTill = 150
	for s := 1; s <= 3; s++ {
		ob, err := outbox.Open(ctx, filepath.Join(dir, fmt.Sprintf("till-%d.db", s)), outbox.Options{Logger: harness.TestLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { ob.Close() })
		pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: mq.URL(), ClientID: fmt.Sprintf("till-%d", s)})
		require.NoError(t, err)
		t.Cleanup(func() { pub.Close() })
		relay, err := ob.NewRelay(pub, outbox.RelayOptions{Source: fmt.Sprintf("/stores/%d/tills/1", s)})
		require.NoError(t, err)
		harness.RunInBackground(t, fmt.Sprintf("relay %d", s), relay)
		for n := 1; n <= perTill; n++ {
			require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
				return ob.Enqueue(ctx, tx, outbox.Message{Topic: fmt.Sprintf("stores/%d/orders", s), Payload: fmt.Appendf(nil, `{"n":%d}`, n)})
			}))
		}
	}

	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	harness.Eventually(t, 60*time.Second, "every event applied", func() bool {
		var c int
		return db.QueryRow(`SELECT count(*) FROM orders_seen`).Scan(&c) == nil && c >= 3*perTill
	})
	rows, err := db.Query(`SELECT consumer, source, seq FROM orders_seen ORDER BY n`)
	require.NoError(t, err)
	defer rows.Close()
	last := map[string]int64{} // source -> seq applied last
	count := map[string]int{}
	for rows.Next() {
		var consumer, source string
		var seq int64
		require.NoError(t, rows.Scan(&consumer, &source, &seq))
		require.Equal(t, owner[source], consumer, "the event of %s went to its partition's consumer", source)
		require.Greater(t, seq, last[source], "%s: seq %d applied after %d", source, seq, last[source])
		last[source] = seq
		count[source]++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"/stores/1/tills/1": perTill, "/stores/2/tills/1": perTill, "/stores/3/tills/1": perTill}, count)
}
