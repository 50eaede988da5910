package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/natsjs"
)

// jetstream: section 11, NATS JetStream. The relay drains a backlog into a
// stream through the natsjs Publisher, beside nats.go publishing the same
// messages to the same stream with the same window of PubAcks awaited, on
// one server (a stream of one replica) and on a three-node cluster (three
// replicas); then members of one durable pull consumer apply a stream's
// events into a PostgreSQL inbox (jsconsumer.go).

// jsStream is the stream the drains go to: it captures benchTopic's subject.
const jsStream = "BENCH"

// jsTarget is a NATS deployment drained to.
type jsTarget struct {
	key      string // r1, r3
	url      string // the node both publishers connect to
	replicas int
}

func (r *runner) jetstream(ctx context.Context) error {
	// The server lives as long as the section; the cluster, only through
	// the drains, so that it uses no CPU while the consumers are measured.
	tb, clusterTB := newSectionTB(r.dir), newSectionTB(r.dir)
	defer tb.close()
	defer clusterTB.close()
	var targets []jsTarget
	skipped, err := tb.do(func() {
		n := harness.StartNATS(tb)
		targets = append(targets, jsTarget{"r1", "nats://" + n.Addr, 1})
	})
	if err == nil && skipped == "" {
		_, err = clusterTB.do(func() {
			c := harness.StartNATSCluster(clusterTB, 3)
			targets = append(targets, jsTarget{"r3", "nats://" + c.Nodes[0].Addr, 3})
		})
	}
	if err != nil {
		return err
	}
	if skipped != "" {
		r.rep.missing[11] = skipped
		return nil
	}
	if err := r.jsDrains(ctx, targets); err != nil {
		return err
	}
	clusterTB.close()
	return r.jsConsumers(ctx, targets[0].url)
}

// jsDrains measures the relay beside raw publishing, rounds interleaved.
func (r *runner) jsDrains(ctx context.Context, targets []jsTarget) error {
	sz := r.sz
	n := sz.jsBacklog
	// By target_wW_variant: rates, CPU per message of this process and of
	// the nats-server processes, and the machine's busy share.
	rates, selfCPU, natsCPU, busy := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	leaders := map[string]string{}
	version := ""
	for _, t := range targets {
		leader, nc, err := jsOpenStream(ctx, t)
		if err != nil {
			return fmt.Errorf("%s: %w", t.key, err)
		}
		version = nc.ConnectedServerVersion()
		nc.Close()
		leaders[t.key] = leader
	}
	for round := 0; round < sz.jsRounds; round++ {
		for _, t := range targets {
			for _, w := range sz.jsWindows {
				order := []string{"raw", "library"}
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, which := range order {
					// A backlog of its own each time: fresh event ids, so
					// that the stream's duplicate window never takes one
					// for a re-send.
					path, err := r.makeBacklog(ctx, fmt.Sprintf("js-%s-%d-%d-%s.db", t.key, w, round, which), n)
					if err != nil {
						return err
					}
					var rate float64
					var use cpuUse
					if which == "raw" {
						rate, use, err = jsDrainRaw(ctx, t, path, n, w)
					} else {
						rate, use, err = r.jsDrainLibrary(ctx, t, path, n, w)
					}
					if err != nil {
						return fmt.Errorf("%s window %d %s: %w", t.key, w, which, err)
					}
					k := fmt.Sprintf("%s_w%d_%s", t.key, w, which)
					rates[k] = append(rates[k], rate)
					selfCPU[k] = append(selfCPU[k], float64(use.self.Microseconds())/float64(n))
					natsCPU[k] = append(natsCPU[k], float64(use.children["nats-server"].Microseconds())/float64(n))
					busy[k] = append(busy[k], use.busy)
					r.progress("  jetstream %s window %d %s: %.0f msg/s", t.key, w, which, rate)
				}
			}
		}
	}
	for round := 0; round < sz.jsRounds; round++ {
		path, err := r.makeBacklog(ctx, fmt.Sprintf("js-instant-%d.db", round), n)
		if err != nil {
			return err
		}
		rate, use, err := r.drainInstant(ctx, path, n, jsTargetWindow)
		if err != nil {
			return fmt.Errorf("the relay alone: %w", err)
		}
		rates["instant"] = append(rates["instant"], rate)
		selfCPU["instant"] = append(selfCPU["instant"], float64(use.self.Microseconds())/float64(n))
		r.progress("  the relay alone, window %d: %.0f msg/s", jsTargetWindow, rate)
	}
	r.rep.set("jetstream_drain_instant_msgs_per_s", median(rates["instant"]))
	r.rep.set("jetstream_drain_instant_cpu_us_per_msg", median(selfCPU["instant"]))
	for _, t := range targets {
		for _, w := range sz.jsWindows {
			p := fmt.Sprintf("jetstream_drain_%s_w%d_", t.key, w)
			k := fmt.Sprintf("%s_w%d_", t.key, w)
			l, rw := median(rates[k+"library"]), median(rates[k+"raw"])
			r.rep.set(p+"library_msgs_per_s", l)
			r.rep.set(p+"raw_msgs_per_s", rw)
			r.rep.set(p+"ratio", l/rw)
			for _, v := range []string{"raw", "library"} {
				r.rep.set(p+v+"_cpu_us_per_msg", median(selfCPU[k+v]))
				r.rep.set(p+v+"_nats_cpu_us_per_msg", median(natsCPU[k+v]))
				r.rep.set(p+v+"_machine_busy", median(busy[k+v]))
			}
			if w == jsTargetWindow {
				r.rep.check(p+"ratio", l/rw >= 0.90)
			}
		}
	}
	note := fmt.Sprintf("Backlog %s messages of %d-byte JSON payloads (structured CloudEvents, Content-Type and Nats-Msg-Id headers)", thousands(int64(n)), payloadLen)
	if r.cfg.Mode != Full {
		note += fmt.Sprintf(" (%s; --full drains %s)", r.cfg.Mode, thousands(int64(sizesFor(Full).jsBacklog)))
	}
	r.rep.note(11, "%s into the stream %s (subjects bench.>, file storage, duplicate window 2 min), on nats-server %s: one server (R1), and a 3-node cluster (R3; both publishers on node 1, the stream's leader %s). "+
		"Rate: messages / (the stream's last message's time − start); the relay's start includes its lease and the connect; raw: nats.go's jetstream PublishMsgAsync of the same bytes and headers, "+
		"at most window PubAcks awaited, no database. The relay alone: the same drain at window %d to a Publisher that acknowledges at once and sends nothing (its reads, encoding, dispatch and marks). Each drain a fresh backlog (fresh ids), the stream purged before it; %d round(s), raw and library alternating; medians.",
		note, jsStream, version, leaders["r3"], jsTargetWindow, sz.jsRounds)
	return nil
}

// jsTargetWindow is the window the ≥ 0.90 target is checked at: the
// relay's default.
const jsTargetWindow = 64

// jsOpenStream creates (or recreates) the drains' stream on t and waits
// until it has a leader, whose name it returns.
func jsOpenStream(ctx context.Context, t jsTarget) (string, *nats.Conn, error) {
	nc, err := nats.Connect(t.url, nats.Timeout(10*time.Second))
	if err != nil {
		return "", nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return "", nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	// A fresh cluster can leave a request unanswered, which would use the
	// whole deadline (seen once in six runs): each try has 10 s, and they
	// go on, as the cluster tests' do, until the stream is made.
	var st jetstream.Stream
	for {
		tctx, tcancel := context.WithTimeout(cctx, 10*time.Second)
		err = js.DeleteStream(tctx, jsStream)
		if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
			st, err = js.CreateStream(tctx, jetstream.StreamConfig{Name: jsStream, Subjects: []string{"bench.>"},
				Storage: jetstream.FileStorage, Replicas: t.replicas, Duplicates: 2 * time.Minute})
		}
		tcancel()
		if err == nil {
			break
		}
		select {
		case <-cctx.Done():
			nc.Close()
			return "", nil, fmt.Errorf("stream %s: %w", jsStream, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	for {
		info, err := st.Info(cctx)
		if err == nil && (t.replicas == 1 || info.Cluster != nil && info.Cluster.Leader != "") {
			leader := "—"
			if info.Cluster != nil {
				leader = info.Cluster.Leader
			}
			return leader, nc, nil
		}
		select {
		case <-cctx.Done():
			nc.Close()
			return "", nil, fmt.Errorf("stream %s: no leader: %v", jsStream, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// jsPurged connects to t and purges the drains' stream.
func jsPurged(ctx context.Context, t jsTarget) (jetstream.Stream, *nats.Conn, error) {
	nc, err := nats.Connect(t.url, nats.Timeout(10*time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := js.Stream(cctx, jsStream)
	if err == nil {
		err = st.Purge(cctx)
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return st, nc, nil
}

// jsStored waits until st holds n messages and returns the time of the
// last one.
func jsStored(ctx context.Context, st jetstream.Stream, n int) (time.Time, error) {
	deadline := time.Now().Add(drainTimeout(n, 0))
	for {
		info, err := st.Info(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if info.State.Msgs == uint64(n) {
			return info.State.LastTime, nil
		}
		if info.State.Msgs > uint64(n) {
			return time.Time{}, fmt.Errorf("the stream holds %d messages, %d were published", info.State.Msgs, n)
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("only %d of %d messages stored", info.State.Msgs, n)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// jsDrainLibrary drains the backlog at path through the relay and the
// natsjs Publisher at window w.
func (r *runner) jsDrainLibrary(ctx context.Context, t jsTarget, path string, n, w int) (float64, cpuUse, error) {
	st, nc, err := jsPurged(ctx, t)
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer nc.Close()
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer ob.Close()
	pub, err := natsjs.New(natsjs.Options{Servers: []string{t.url}, Name: "bench-relay"})
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer pub.Disconnect()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{Window: w, Source: benchSource,
		Reconnect: outbox.Backoff{Initial: 50 * time.Millisecond, Max: time.Second}})
	if err != nil {
		return 0, cpuUse{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	before := takeCPUSample()
	start := time.Now()
	go func() { done <- relay.Run(rctx) }()
	// The stream says when it holds the backlog: asking the outbox (Stats)
	// while it drains would take CPU from the relay.
	last, werr := jsStored(ctx, st, n)
	use := before.until(takeCPUSample(), time.Since(start))
	if werr == nil {
		werr = waitPending(ctx, ob, 0, 30*time.Second)
	}
	cancel()
	if err := <-done; err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return 0, cpuUse{}, werr
	}
	return float64(n) / last.Sub(start).Seconds(), use, nil
}

// drainInstant drains the backlog at path through the relay to a
// Publisher that acknowledges at once, at window w.
func (r *runner) drainInstant(ctx context.Context, path string, n, w int) (float64, cpuUse, error) {
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: r.log, ReserveBytes: -1})
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer ob.Close()
	pub := newInstantPublisher(n)
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{Window: w, Source: benchSource})
	if err != nil {
		return 0, cpuUse{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	before := takeCPUSample()
	start := time.Now()
	go func() { done <- relay.Run(rctx) }()
	werr := waitDone(ctx, pub.done, drainTimeout(n, w), func() error {
		return fmt.Errorf("%d of %d published", pub.published.Load(), n)
	})
	use := before.until(takeCPUSample(), time.Since(start))
	if werr == nil {
		werr = waitPending(ctx, ob, 0, 30*time.Second)
	}
	cancel()
	if err := <-done; err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return 0, cpuUse{}, werr
	}
	return float64(n) / time.Unix(0, pub.last.Load()).Sub(start).Seconds(), use, nil
}

// jsDrainRaw publishes the messages the relay would publish for the
// backlog at path with nats.go alone, at most w PubAcks awaited.
func jsDrainRaw(ctx context.Context, t jsTarget, path string, n, w int) (float64, cpuUse, error) {
	msgs, err := jsMessages(ctx, path, n, "bench")
	if err != nil {
		return 0, cpuUse{}, err
	}
	st, admin, err := jsPurged(ctx, t)
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer admin.Close()
	before := takeCPUSample()
	start := time.Now()
	nc, err := nats.Connect(t.url, nats.Name("bench-raw"), nats.NoReconnect(), nats.Timeout(10*time.Second))
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1<<16))
	if err != nil {
		return 0, cpuUse{}, err
	}
	// The stream is asked while the messages go, as it is for the relay.
	type stored struct {
		last time.Time
		err  error
	}
	got := make(chan stored, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		last, err := jsStored(sctx, st, n)
		got <- stored{last, err}
	}()
	if err := jsPublishWindow(js, msgs, w); err != nil {
		return 0, cpuUse{}, err
	}
	s := <-got
	use := before.until(takeCPUSample(), time.Since(start))
	if s.err != nil {
		return 0, cpuUse{}, s.err
	}
	return float64(n) / s.last.Sub(start).Seconds(), use, nil
}

// jsPublishWindow publishes msgs, keeping at most w awaiting their PubAck.
func jsPublishWindow(js jetstream.JetStream, msgs []*nats.Msg, w int) error {
	ring := make([]jetstream.PubAckFuture, w)
	wait := func(f jetstream.PubAckFuture) error {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		case <-time.After(30 * time.Second):
			return errors.New("no PubAck within 30 s")
		}
	}
	for i, m := range msgs {
		if f := ring[i%w]; f != nil {
			if err := wait(f); err != nil {
				return err
			}
		}
		f, err := js.PublishMsgAsync(m, jetstream.WithRetryAttempts(0))
		if err != nil {
			return err
		}
		ring[i%w] = f
	}
	for _, f := range ring {
		if f != nil {
			if err := wait(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsMessages are the NATS messages the relay publishes for the backlog at
// path (structured mode: its envelopes, with the Content-Type of a
// structured CloudEvent and the event id as Nats-Msg-Id), to the subject of
// benchTopic under prefix.
func jsMessages(ctx context.Context, path string, n int, prefix string) ([]*nats.Msg, error) {
	envs, err := readEnvelopes(ctx, path, n)
	if err != nil {
		return nil, err
	}
	subject, err := natsjs.Subject(prefix + benchTopic[len("bench"):])
	if err != nil {
		return nil, err
	}
	out := make([]*nats.Msg, len(envs))
	for i, e := range envs {
		h := nats.Header{}
		h.Set("Content-Type", structuredContentType)
		h.Set(jetstream.MsgIDHeader, envelopeID(e))
		out[i] = &nats.Msg{Subject: subject, Data: e, Header: h}
	}
	return out, nil
}

// envelopeID is the id of an envelope made by envelope.
func envelopeID(e []byte) string {
	const open = `{"specversion":"1.0","id":"`
	rest := e[len(open):]
	for i, c := range rest {
		if c == '"' {
			return string(rest[:i])
		}
	}
	return ""
}
