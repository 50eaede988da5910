package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
	"github.com/edgeoutbox/outbox/internal/harness"
)

type demoFlags struct {
	duration  time.Duration
	rate      int
	outages   int
	outageLen time.Duration
	keep      bool
}

func demoCmd(a *cli.App) *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show the outbox at work: a till, an embedded broker, outages, a summary",
		Long: `demo needs no setup. It starts an MQTT broker on loopback, a simulated
till that commits orders and their events into a SQLite file in a temporary
directory (every tenth card is declined, so that order and its event roll
back), the relay, and a subscriber that drops duplicates by event id. The
broker goes away a few times and comes back while the till keeps selling.

A status line shows what is pending, delivered and whether the relay is
connected. At the end a summary gives orders committed, events delivered,
duplicates, lost, out of order, commit-to-delivery latency and the peak
backlog. The exit status is 0 only if nothing was lost, nothing phantom was
delivered and nothing came out of order.`,
		Example: `  outboxlab demo
  outboxlab demo --duration 60s --rate 200 --outages 4 --outage-length 5s`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.duration <= 0 || f.rate <= 0 || f.outages < 0 || f.outageLen <= 0 {
				return cli.Usagef("--duration, --rate and --outage-length must be positive, --outages zero or more")
			}
			if time.Duration(f.outages)*f.outageLen >= f.duration {
				return cli.Usagef("the outages take the whole --duration; shorten them or run longer")
			}
			return demo(cmd.Context(), a, f)
		},
	}
	cmd.Flags().DurationVar(&f.duration, "duration", 15*time.Second, "how long the till sells")
	cmd.Flags().IntVar(&f.rate, "rate", 50, "orders per second")
	cmd.Flags().IntVar(&f.outages, "outages", 2, "how many times the broker goes away")
	cmd.Flags().DurationVar(&f.outageLen, "outage-length", 3*time.Second, "how long each outage lasts")
	cmd.Flags().BoolVar(&f.keep, "keep", false, "keep the database file and print its path")
	return cmd
}

// demoSubscriber records deliveries once per event id, as a consumer that
// dedupes would.
type demoSubscriber struct {
	mu        sync.Mutex
	committed map[string]time.Time // id → when Transact returned
	declined  map[string]bool
	seen      map[string]time.Time // id → first delivery
	lastSeq   int64
	unique    int
	dups      int
	disorder  int
	phantom   int
}

func (s *demoSubscriber) receive(payload []byte) {
	now := time.Now()
	ev, err := outbox.DecodeEvent(payload)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[ev.ID]; ok {
		s.dups++
		return
	}
	s.seen[ev.ID] = now
	s.unique++
	if ev.Sequence <= s.lastSeq {
		s.disorder++
	}
	s.lastSeq = ev.Sequence
	if s.declined[ev.ID] {
		s.phantom++
	}
}

func demo(ctx context.Context, a *cli.App, f demoFlags) error {
	dir, err := os.MkdirTemp("", "outboxlab-demo-")
	if err != nil {
		return err
	}
	if !f.keep {
		defer os.RemoveAll(dir)
	}
	sub := &demoSubscriber{committed: map[string]time.Time{}, declined: map[string]bool{}, seen: map[string]time.Time{}}
	// The subscriber lives inside the broker, so that it is there before
	// the relay can publish again after an outage.
	broker, err := harness.LaunchMochi(harness.MochiOptions{})
	if err != nil {
		return err
	}
	defer broker.Stop()
	if err := broker.Subscribe("stores/#", func(m harness.Message) { sub.receive(m.Payload) }); err != nil {
		return err
	}
	addr := broker.Addr()

	// Library logs only when something is wrong; the demo tells the story.
	logger := slog.New(slog.NewTextHandler(a.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	path := filepath.Join(dir, "till.db")
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer ob.Close()
	if _, err := ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, total_cents INTEGER NOT NULL)`); err != nil {
		return err
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "tcp://" + addr, ClientID: "demo-till-1", KeepAlive: 5 * time.Second})
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{
		Source:    "/stores/1/tills/1",
		Reconnect: outbox.Backoff{Initial: 100 * time.Millisecond, Max: time.Second},
	})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(context.Background())
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

	fmt.Fprintf(a.Stdout, "till: %d orders/s for %s; broker on %s goes away %d× for %s\ndatabase: %s\n",
		f.rate, f.duration, addr, f.outages, f.outageLen, path)

	status := newStatusLine(a.Stdout)
	var peak int64
	var committed, declined int
	var mu sync.Mutex // guards committed, declined for the status line
	var brokerUp = true
	stopStatus := make(chan struct{})
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		start := time.Now()
		t := time.NewTicker(status.every)
		defer t.Stop()
		for {
			select {
			case <-stopStatus:
				return
			case <-t.C:
			}
			st, err := relay.Stats(context.Background())
			if err != nil {
				continue
			}
			mu.Lock()
			peak = max(peak, st.Pending)
			c, up := committed, brokerUp
			mu.Unlock()
			sub.mu.Lock()
			delivered := sub.unique
			sub.mu.Unlock()
			conn := "connected"
			if !st.Connected {
				conn = "disconnected"
			}
			b := ""
			if !up {
				b = "  (broker down)"
			}
			status.show(fmt.Sprintf("[%5.1fs] committed %d  delivered %d  pending %d  %s%s",
				time.Since(start).Seconds(), c, delivered, st.Pending, conn, b))
		}
	}()

	// Outages are spread evenly over the run.
	var outageAt []time.Duration
	for i := 1; i <= f.outages; i++ {
		outageAt = append(outageAt, f.duration*time.Duration(i)/time.Duration(f.outages+1))
	}
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(f.rate))
	defer tick.Stop()
	var restarts sync.WaitGroup
	defer restarts.Wait()
	for n := 1; time.Since(start) < f.duration; n++ {
		select {
		case <-ctx.Done():
			return finishDemo(ctx, a, relayDone, stopRelay, stopStatus, statusDone, status, sub, committed, declined, peak)
		case <-tick.C:
		}
		if len(outageAt) > 0 && time.Since(start) >= outageAt[0] {
			outageAt = outageAt[1:]
			broker.Stop()
			mu.Lock()
			brokerUp = false
			mu.Unlock()
			status.event(fmt.Sprintf("broker down for %s; the till keeps selling", f.outageLen))
			restarts.Add(1)
			time.AfterFunc(f.outageLen, func() {
				defer restarts.Done()
				if err := broker.Resume(); err != nil {
					status.event("broker restart failed: " + err.Error())
					return
				}
				mu.Lock()
				brokerUp = true
				mu.Unlock()
				status.event("broker back")
			})
		}
		id := outbox.NewID()
		decline := n%10 == 0
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			res, err := tx.Exec(`INSERT INTO orders (total_cents) VALUES (?)`, 100+n%900)
			if err != nil {
				return err
			}
			order, _ := res.LastInsertId()
			if err := ob.Enqueue(ctx, tx, outbox.Message{
				ID: id, Topic: "stores/1/orders", Type: "com.example.order.created",
				Payload: fmt.Appendf(nil, `{"order":%d,"total_cents":%d}`, order, 100+n%900),
			}); err != nil {
				return err
			}
			if decline {
				return errDeclined
			}
			return nil
		})
		switch {
		case decline && errors.Is(err, errDeclined):
			sub.mu.Lock()
			sub.declined[id] = true
			sub.mu.Unlock()
			mu.Lock()
			declined++
			mu.Unlock()
		case err != nil:
			return err
		default:
			sub.mu.Lock()
			sub.committed[id] = time.Now()
			sub.mu.Unlock()
			mu.Lock()
			committed++
			mu.Unlock()
		}
	}
	// Let the relay catch up after the last outage.
	restarts.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		sub.mu.Lock()
		done := sub.unique >= committed
		sub.mu.Unlock()
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return finishDemo(ctx, a, relayDone, stopRelay, stopStatus, statusDone, status, sub, committed, declined, peak)
}

var errDeclined = errors.New("card declined")

func finishDemo(ctx context.Context, a *cli.App, relayDone chan error, stopRelay func(), stopStatus, statusDone chan struct{},
	status *statusLine, sub *demoSubscriber, committed, declined int, peak int64) error {
	stopRelay()
	relayErr := <-relayDone
	close(stopStatus)
	<-statusDone
	status.clear()

	sub.mu.Lock()
	defer sub.mu.Unlock()
	lost := 0
	var lat []time.Duration
	for id, committedAt := range sub.committed {
		deliveredAt, ok := sub.seen[id]
		if !ok {
			lost++
			continue
		}
		// The relay may deliver before Transact has returned.
		lat = append(lat, max(0, deliveredAt.Sub(committedAt)))
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	w := a.Stdout
	fmt.Fprintf(w, "\norders committed     %d (and %d declined, rolled back)\n", committed, declined)
	fmt.Fprintf(w, "events delivered     %d unique\n", sub.unique)
	fmt.Fprintf(w, "duplicates           %d (redeliveries after a cut, dropped by the subscriber)\n", sub.dups)
	fmt.Fprintf(w, "lost                 %d\n", lost)
	fmt.Fprintf(w, "phantom              %d (events of declined orders delivered)\n", sub.phantom)
	fmt.Fprintf(w, "out of order         %d\n", sub.disorder)
	fmt.Fprintf(w, "commit → delivery    p50 %s  p99 %s  max %s\n", round(pct(0.50)), round(pct(0.99)), round(pct(1)))
	fmt.Fprintf(w, "peak backlog         %d pending\n", peak)
	switch {
	case relayErr != nil:
		return fmt.Errorf("relay: %w", relayErr)
	case ctx.Err() != nil:
		return errors.New("interrupted")
	case lost > 0 || sub.phantom > 0 || sub.disorder > 0:
		return fmt.Errorf("FAILED: %d lost, %d phantom, %d out of order", lost, sub.phantom, sub.disorder)
	}
	fmt.Fprintln(w, "OK: every committed order's event was delivered, in commit order, and no declined one")
	return nil
}

func round(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

// statusLine rewrites one line on a terminal and prints a line every few
// seconds otherwise.
type statusLine struct {
	w     io.Writer
	tty   bool
	every time.Duration
	mu    sync.Mutex
	last  string
}

func newStatusLine(w io.Writer) *statusLine {
	s := &statusLine{w: w, every: 2 * time.Second}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			s.tty, s.every = true, 200*time.Millisecond
		}
	}
	return s
}

func (s *statusLine) show(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = line
	if s.tty {
		fmt.Fprintf(s.w, "\r\033[K%s", line)
		return
	}
	fmt.Fprintln(s.w, line)
}

// event prints a line that stays, above the status line.
func (s *statusLine) event(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty {
		fmt.Fprintf(s.w, "\r\033[K-- %s\n%s", msg, s.last)
		return
	}
	fmt.Fprintln(s.w, "-- "+msg)
}

func (s *statusLine) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty {
		fmt.Fprint(s.w, "\r\033[K")
	}
}
