package outboxtest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// stream is what a case's subscriber received: the first delivery of each
// event, in order of arrival, and what came besides.
type stream struct {
	mu         sync.Mutex
	firsts     []delivery     // first deliveries, in order of arrival
	seen       map[string]int // event id -> index in firsts
	duplicates int
	undecoded  []string // why messages could not be decoded (the first few)
}

// delivery is one event as the subscriber first received it.
type delivery struct {
	id  string
	seq int64
}

func newStream() *stream { return &stream{seen: map[string]int{}} }

// add records one message; it is Broker.Subscribe's callback.
func (s *stream) add(ev outbox.Event, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || ev.ID == "" {
		if err == nil {
			err = fmt.Errorf("an event without an id")
		}
		if len(s.undecoded) < 10 {
			s.undecoded = append(s.undecoded, err.Error())
		}
		return
	}
	if _, ok := s.seen[ev.ID]; ok {
		s.duplicates++
		return
	}
	s.seen[ev.ID] = len(s.firsts)
	s.firsts = append(s.firsts, delivery{id: ev.ID, seq: ev.Sequence})
}

// unique is how many distinct events arrived.
func (s *stream) unique() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.firsts)
}

// has says whether the event with this id arrived.
func (s *stream) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.seen[id]
	return ok
}

// dups is how many deliveries repeated an event that had arrived.
func (s *stream) dups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.duplicates
}

// waitFor waits until n distinct events have arrived, for as long as they
// keep arriving: it fails the case once none has for stillness, listing
// the first committed events of rows that have not.
func (s *stream) waitFor(t *testing.T, n int, what string, rows func() []row) {
	t.Helper()
	last, lastAt := s.unique(), time.Now()
	for {
		got := s.unique()
		if got >= n {
			return
		}
		if got != last {
			last, lastAt = got, time.Now()
		}
		if time.Since(lastAt) > stillness {
			all := rows()
			s.mu.Lock()
			var missing []string
			for _, r := range all {
				if _, ok := s.seen[r.id]; !ok && len(missing) < 5 {
					missing = append(missing, r.String())
				}
			}
			s.mu.Unlock()
			t.Fatalf("%s: %d of %d events delivered, none for %s: not every committed event delivered; the first missing: %v",
				what, got, n, stillness, missing)
		}
		time.Sleep(time.Millisecond) // polling, bounded by stillness
	}
}

// matches checks the stream against want, the rows that must have been
// delivered, in commit order: each arrived, its first delivery in commit
// order (the sequence numbers strictly increasing) and carrying its row's
// sequence number; nothing else arrived; every message could be decoded;
// and at most maxDups deliveries were duplicates. It returns the
// duplicates.
func (s *stream) matches(t *testing.T, want []row, maxDups int) int {
	t.Helper()
	s.mu.Lock()
	firsts := slices.Clone(s.firsts)
	dups := s.duplicates
	undecoded := slices.Clone(s.undecoded)
	s.mu.Unlock()

	require.Empty(t, undecoded, "messages that are not events")
	wantSeq := make(map[string]int64, len(want))
	for _, r := range want {
		wantSeq[r.id] = r.seq
	}
	var last int64
	var disorder, foreign, misnumbered []string
	for _, d := range firsts {
		seq, ok := wantSeq[d.id]
		switch {
		case !ok:
			foreign = append(foreign, fmt.Sprintf("%s (seq %d)", d.id, d.seq))
		case seq != d.seq:
			misnumbered = append(misnumbered, fmt.Sprintf("%s: seq %d, its row's is %d", d.id, d.seq, seq))
		}
		if d.seq <= last {
			disorder = append(disorder, fmt.Sprintf("seq %d first delivered after seq %d", d.seq, last))
		}
		last = max(last, d.seq)
	}
	require.Empty(t, foreign, "delivered, never committed (or rolled back, or refused)")
	require.Empty(t, misnumbered, "an event's sequence is not its row's")
	require.Empty(t, disorder, "first deliveries out of commit order")
	if len(firsts) != len(want) {
		got := make(map[string]bool, len(firsts))
		for _, d := range firsts {
			got[d.id] = true
		}
		var missing []string
		for _, r := range want {
			if !got[r.id] && len(missing) < 10 {
				missing = append(missing, r.String())
			}
		}
		require.Failf(t, "not every committed event delivered", "%d of %d; the first missing: %v", len(firsts), len(want), missing)
	}
	require.LessOrEqual(t, dups, maxDups, "duplicates")
	return dups
}

// only is the rows that pass keep, in order.
func only(rows []row, keep func(row) bool) []row {
	var out []row
	for _, r := range rows {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}
