package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/natsjs"
)

// What the JetStream fault tests (jetstream_crash_test.go,
// jetstream_cluster_test.go) share: an application committing events of
// several topics and priorities, a count of what reached the server, and
// the stream read back and held to what was committed.

// jsTopics are the topics the application commits to; each is a subject
// of the stream jsStreamSubjects captures.
var jsTopics = []string{"till/orders", "till/refunds", "till/voids"}

const jsStreamSubjects = "till.>"

// jsEvent is one committed event.
type jsEvent struct {
	ID       string `json:"id"`
	Topic    string `json:"topic"`
	Priority int    `json:"priority"`
	Pad      string `json:"pad"`
}

// jsWriter is the application: it commits perTx events every interval,
// in one transaction, each to one of jsTopics with one of
// crashPriorities, and lists what was committed, in commit order.
type jsWriter struct {
	t    *testing.T
	ob   *outbox.Outbox
	stop chan struct{}
	done chan struct{}

	mu        sync.Mutex
	committed []jsEvent
	err       error
}

func startJSWriter(t *testing.T, ob *outbox.Outbox, every time.Duration, perTx int, seed uint64) *jsWriter {
	w := &jsWriter{t: t, ob: ob, stop: make(chan struct{}), done: make(chan struct{})}
	rng := rand.New(rand.NewPCG(seed, 0x75))
	go func() {
		defer close(w.done)
		ctx := context.Background()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			evs := make([]jsEvent, perTx)
			for i := range evs {
				evs[i] = jsEvent{ID: outbox.NewID(), Topic: jsTopics[rng.IntN(len(jsTopics))],
					Priority: crashPriorities[rng.IntN(len(crashPriorities))], Pad: strings.Repeat("x", rng.IntN(600))}
			}
			err := ob.Transact(ctx, func(tx *sql.Tx) error {
				for _, ev := range evs {
					payload, _ := json.Marshal(ev)
					if err := ob.Enqueue(ctx, tx, outbox.Message{ID: ev.ID, Topic: ev.Topic, Type: "order.created", Priority: ev.Priority, Payload: payload}); err != nil {
						return err
					}
				}
				return nil
			})
			w.mu.Lock()
			if err != nil {
				w.err = fmt.Errorf("commit %d: %w", len(w.committed)+1, err)
				w.mu.Unlock()
				return
			}
			w.committed = append(w.committed, evs...)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *jsWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// count is how many events were committed so far.
func (w *jsWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.committed)
}

// finish stops the writer and returns what it committed, in commit order.
func (w *jsWriter) finish() []jsEvent {
	w.halt()
	require.NoError(w.t, w.err, "the application's commits")
	return w.committed
}

// jsArrivals counts the messages that reach the server on the stream's
// subjects, duplicates included, through a plain subscription: a relay
// killed or cut off sends again what it had in flight, and the stream
// stores it once.
type jsArrivals struct{ n atomic.Int64 }

func countArrivals(t *testing.T, nc *nats.Conn) *jsArrivals {
	a := &jsArrivals{}
	sub, err := nc.Subscribe(jsStreamSubjects, func(*nats.Msg) { a.n.Add(1) })
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { sub.Unsubscribe() })
	return a
}

// jsStored is one message of the stream.
type jsStored struct {
	seq     uint64
	subject string
	msgID   string  // Nats-Msg-Id
	ev      jsEvent // the event's data, which repeats its id
	err     error
}

// readStream reads every message of the stream name, in stream order, one
// by one: an ordered consumer, which would be quicker, is not placed on a
// 2.9.10 cluster that has lost a node (nats.go retries it for ever).
func readStream(t *testing.T, js jetstream.JetStream, name string) []jsStored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, name)
	require.NoError(t, err)
	state := st.CachedInfo().State
	var out []jsStored
	for seq := state.FirstSeq; state.Msgs > 0 && seq <= state.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err, "stream message %d", seq)
		s := jsStored{seq: m.Sequence, subject: m.Subject, msgID: m.Header.Get(jetstream.MsgIDHeader)}
		ev, err := outbox.DecodeEvent(m.Data)
		if err == nil {
			err = json.Unmarshal(ev.Data, &s.ev)
		}
		if err == nil && ev.ID != s.ev.ID {
			err = fmt.Errorf("event id %q, data for %q", ev.ID, s.ev.ID)
		}
		s.err = err
		out = append(out, s)
	}
	require.Len(t, out, int(state.Msgs), "the stream's messages, %d to %d", state.FirstSeq, state.LastSeq)
	return out
}

// jsCheck is the stream held to what was committed.
type jsCheck struct {
	stored, committed int
	bad               []string // messages that are not a committed event, as sent
	missing           []string // committed ids not in the stream
	dups              int      // messages whose event the stream held already
	wrongMsgID        []string // messages whose Nats-Msg-Id is not their event's id
	disorder          []string // first storings out of commit order within a subject and priority
	overtook          int      // first storings after an event of their subject committed later
}

func checkStream(stored []jsStored, committed []jsEvent) jsCheck {
	c := jsCheck{stored: len(stored), committed: len(committed)}
	index := make(map[string]int, len(committed))
	for i, ev := range committed {
		index[ev.ID] = i
	}
	seen := map[string]bool{}
	type key struct {
		subject  string
		priority int
	}
	last := map[key]int{}           // commit index of the last first storing, per subject and priority
	lastSubject := map[string]int{} // the same, per subject
	for _, s := range stored {
		i, ok := index[s.ev.ID]
		switch {
		case s.err != nil:
			c.bad = append(c.bad, fmt.Sprintf("seq %d: %v", s.seq, s.err))
			continue
		case !ok:
			c.bad = append(c.bad, fmt.Sprintf("seq %d: id %q never committed", s.seq, s.ev.ID))
			continue
		}
		ev := committed[i]
		if subject, _ := natsjs.Subject(ev.Topic); s.subject != subject || s.ev != ev {
			c.bad = append(c.bad, fmt.Sprintf("seq %d: %q on %s, committed as %+v", s.seq, s.ev.ID, s.subject, ev))
			continue
		}
		if s.msgID != ev.ID {
			c.wrongMsgID = append(c.wrongMsgID, fmt.Sprintf("seq %d: Nats-Msg-Id %q, event %q", s.seq, s.msgID, ev.ID))
		}
		if seen[ev.ID] {
			c.dups++
			continue
		}
		seen[ev.ID] = true
		k := key{s.subject, ev.Priority}
		if prev, ok := last[k]; ok && i < prev {
			c.disorder = append(c.disorder, fmt.Sprintf("seq %d: %s (commit %d) after commit %d on %s priority %d", s.seq, ev.ID, i, prev, s.subject, ev.Priority))
		}
		last[k] = max(last[k], i)
		if prev, ok := lastSubject[s.subject]; ok && i < prev {
			c.overtook++
		}
		lastSubject[s.subject] = max(lastSubject[s.subject], i)
	}
	for _, ev := range committed {
		if !seen[ev.ID] {
			c.missing = append(c.missing, ev.ID)
		}
	}
	return c
}

// require holds the stream to every committed event exactly once, in
// commit order within each subject and priority.
func (c jsCheck) require(t *testing.T) {
	t.Helper()
	require.Empty(t, few(c.bad), "%d messages that are not a committed event as sent", len(c.bad))
	require.Empty(t, few(c.missing), "LOST: %d of %d committed events not in the stream", len(c.missing), c.committed)
	require.Zero(t, c.dups, "duplicates in the stream")
	require.Empty(t, few(c.disorder), "%d events out of commit order within a subject and priority", len(c.disorder))
	require.Empty(t, few(c.wrongMsgID), "%d messages whose Nats-Msg-Id is not their event's id", len(c.wrongMsgID))
	require.Equal(t, c.committed, c.stored, "every committed event once")
}

// few is the first five of l, for a failure's message.
func few(l []string) []string { return l[:min(len(l), 5)] }
