package outbox

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// byPriority writes rows of the given priorities by plain SQL, in this
// order, each created a second after the one before from base, and
// returns their seqs.
func byPriority(t *testing.T, ob *Outbox, base time.Time, prios ...int) []int64 {
	t.Helper()
	var seqs []int64
	for _, p := range prios {
		var seq int64
		err := ob.DB().QueryRow(`INSERT INTO outbox (topic, payload, priority, created_at) VALUES ('stores/1/orders', '{}', ?, ?) RETURNING seq`,
			p, base.Add(time.Duration(len(seqs))*time.Second).UnixMilli()).Scan(&seq)
		require.NoError(t, err)
		seqs = append(seqs, seq)
	}
	return seqs
}

// TestStatsAndGaugesByPriority: Stats and Gauges say how many messages
// wait at each priority that has any, highest first, and since when, as
// the relay's marks of each priority (and so the common one) move, rows
// die and are requeued; with a message limit (the counters) and without.
func TestStatsAndGaugesByPriority(t *testing.T) {
	for _, limits := range []bool{false, true} {
		t.Run(fmt.Sprint("limits=", limits), func(t *testing.T) {
			ctx := context.Background()
			opts := Options{}
			if limits {
				opts.MaxPendingMessages, opts.MaxPendingBytes = 1000, 1<<20
			}
			ob := openTest(t, opts)
			r, err := ob.NewRelay(&fakePublisher{}, RelayOptions{Source: "/outbox/device"})
			require.NoError(t, err)
			rc, err := sqlconn.Open(ctx, ob.DB())
			require.NoError(t, err)
			t.Cleanup(rc.Close)
			holdLease(t, r, rc)
			sent := func(prio uint8, seqs ...int64) {
				t.Helper()
				var acked []mark
				for _, seq := range seqs {
					acked = append(acked, mark{seq: seq, ends: true, priority: prio})
				}
				require.NoError(t, r.markSent(rc, acked))
			}
			base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
			at := func(i int) time.Time { return base.Add(time.Duration(i) * time.Second) }
			gap := false
			check := func(what string, want ...PriorityStats) {
				t.Helper()
				s, err := ob.Stats(ctx)
				require.NoError(t, err)
				g, err := ob.Gauges(ctx)
				require.NoError(t, err)
				var total int64
				for _, p := range want {
					total += p.Pending
				}
				// Without the counters, a number that holds no row above
				// the common mark (a row deleted by hand) counts at
				// priority 0, unless nothing of 0 waits (Gauges.Pending).
				over := gap && !limits
				require.Equal(t, total, s.Pending, "%s: Stats.Pending", what)
				if over {
					require.GreaterOrEqual(t, g.Pending, total, "%s: Gauges.Pending", what)
				} else {
					require.Equal(t, total, g.Pending, "%s: Gauges.Pending", what)
				}
				for name, got := range map[string][]PriorityStats{"Stats": s.Priorities, "Gauges": g.Priorities} {
					require.Len(t, got, len(want), "%s: %s.Priorities %v", what, name, got)
					for i := range want {
						require.Equal(t, want[i].Priority, got[i].Priority, "%s: %s %v", what, name, got)
						if over && name == "Gauges" && want[i].Priority == 0 {
							require.GreaterOrEqual(t, got[i].Pending, want[i].Pending, "%s: %s %v", what, name, got)
						} else {
							require.Equal(t, want[i].Pending, got[i].Pending, "%s: %s %v", what, name, got)
						}
						require.True(t, want[i].OldestPending.Equal(got[i].OldestPending), "%s: %s priority %d: oldest %v, want %v",
							what, name, want[i].Priority, got[i].OldestPending, want[i].OldestPending)
					}
				}
			}
			check("empty")

			// seq:      1  2  3  4  5  6  7  8
			// priority: 0  0  0  9  9  3  0  9
			byPriority(t, ob, base, 0, 0, 0, 9, 9, 3, 0, 9)
			check("eight pending", PriorityStats{9, 3, at(3)}, PriorityStats{3, 1, at(5)}, PriorityStats{0, 4, at(0)})

			// The relay sent 4 and 5 (priority 9's mark), then 1
			// (priority 0's, and the common one, which stops before 2).
			sent(9, 4, 5)
			sent(0, 1)
			check("some sent by their priority's mark", PriorityStats{9, 1, at(7)}, PriorityStats{3, 1, at(5)}, PriorityStats{0, 3, at(1)})

			// Priority 3's only message dies: nothing waits at 3.
			_, err = ob.DB().Exec(`UPDATE outbox SET dead_at = 1, attempts = 5, last_error = 'refused' WHERE seq = 6`)
			require.NoError(t, err)
			check("priority 3 dead", PriorityStats{9, 1, at(7)}, PriorityStats{0, 3, at(1)})

			// Priority 0 all sent: the common mark passes every row but 8.
			sent(0, 2, 3, 7)
			check("only priority 9 waits", PriorityStats{9, 1, at(7)})

			// Requeued, priority 3's message waits again, behind
			// everything, with its creation time.
			n, err := ob.RequeueDead(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			check("priority 3 requeued", PriorityStats{9, 1, at(7)}, PriorityStats{3, 1, at(5)})

			sent(9, 8)
			var requeued int64
			require.NoError(t, ob.DB().QueryRow(`SELECT seq FROM outbox WHERE priority = 3`).Scan(&requeued))
			sent(3, requeued)
			check("all sent")

			// A pending row deleted by hand leaves a number that holds no
			// row above the common mark: nothing of priority 0 waits.
			seqs := byPriority(t, ob, at(8), 9, 0, 9)
			_, err = ob.DB().Exec(`DELETE FROM outbox WHERE seq = ?`, seqs[1])
			require.NoError(t, err)
			gap = true
			check("a row deleted by hand", PriorityStats{9, 2, at(8)})
			g, err := ob.Gauges(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 2, g.Pending, "nothing of priority 0 waits: the number left does not count")

			// Priority 0's mark passes priority 9's waiting messages.
			seqs = byPriority(t, ob, at(11), 0, 0)
			sent(0, seqs...)
			check("priority 0's mark above waiting messages of 9", PriorityStats{9, 2, at(8)})
			byPriority(t, ob, at(13), 0)
			check("and one more of 0", PriorityStats{9, 2, at(8)}, PriorityStats{0, 1, at(13)})
		})
	}
}

// normal returns ps with their times in UTC, for require.Equal.
func normal(ps []PriorityStats) []PriorityStats {
	for i := range ps {
		ps[i].OldestPending = ps[i].OldestPending.UTC()
	}
	return ps
}

// TestPrioritiesFromTheRelay: a backlog at priority 0 alone is shown as
// one priority's; what the relay sends leaves its priority's figures,
// whichever mark it moves.
func TestPrioritiesFromTheRelay(t *testing.T) {
	ctx := context.Background()
	for _, limits := range []bool{false, true} {
		t.Run(fmt.Sprint("limits=", limits), func(t *testing.T) {
			opts := Options{}
			if limits {
				opts.MaxPendingMessages, opts.MaxPendingBytes = 1000, 1<<20
			}
			ob := openTest(t, opts)
			base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
			// Priority 0 alone, as a device that never sets one has it.
			byPriority(t, ob, base, 0, 0)
			s, err := ob.Stats(ctx)
			require.NoError(t, err)
			g, err := ob.Gauges(ctx)
			require.NoError(t, err)
			want := []PriorityStats{{Priority: 0, Pending: 2, OldestPending: base.UTC()}}
			require.Equal(t, want, normal(s.Priorities))
			require.Equal(t, want, normal(g.Priorities))
			byPriority(t, ob, base, 5, 0, 5, 9)
			s, err = ob.Stats(ctx)
			require.NoError(t, err)
			require.Len(t, s.Priorities, 3)
			r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
			require.NoError(t, err)
			stop := startRelay(t, r)
			eventually(t, 5*time.Second, "drained", func() bool {
				s, err := ob.Stats(ctx)
				return err == nil && s.Pending == 0
			})
			stop()
			s, err = ob.Stats(ctx)
			require.NoError(t, err)
			require.Empty(t, s.Priorities)
			g, err = ob.Gauges(ctx)
			require.NoError(t, err)
			require.Zero(t, g.Pending)
			require.Empty(t, g.Priorities)
		})
	}
}

// TestPriorityQueriesAreSeeks: the per-priority reads of Stats and Gauges
// find a priority above 0 through the outbox_priority index and priority
// 0 by rowid from its mark, never by reading the whole table: that is
// what keeps a scrape cheap whatever the backlog.
func TestPriorityQueriesAreSeeks(t *testing.T) {
	ob := openTest(t, Options{})
	table := regexp.MustCompile(`^(SCAN|SEARCH) (outbox|o)( |$)`)
	const (
		byIndex = "outbox_priority (priority=? AND seq>?)"
		between = "outbox_priority (priority=? AND seq>? AND seq<?)"
		byRowid = "rowid>?"
		byDead  = "outbox_dead (seq>?)"
		newest  = "max(seq)"
	)
	for _, c := range []struct {
		name, query string
		want        map[string]int
	}{
		{"stats", statsPrioritiesSQL, map[string]int{byIndex: 2, byRowid: 1}},
		{"gauges", gaugesPrioritiesSQL, map[string]int{byIndex: 2}},
		{"gauges, priority 0's first", gaugesFirstOfZeroSQL, map[string]int{byRowid: 1}},
	} {
		rows, err := ob.DB().Query(`EXPLAIN QUERY PLAN ` + c.query)
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var id, parent, notUsed int
			var detail string
			require.NoError(t, rows.Scan(&id, &parent, &notUsed, &detail))
			plan = append(plan, detail)
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
		text := strings.Join(plan, "\n")
		got := map[string]int{}
		for _, step := range plan {
			if !table.MatchString(step) {
				continue
			}
			switch {
			case strings.HasSuffix(step, "USING INDEX "+byIndex):
				got[byIndex]++
			case strings.HasSuffix(step, "USING INDEX "+between):
				got[between]++
			case strings.HasSuffix(step, "USING INTEGER PRIMARY KEY ("+byRowid+")"):
				got[byRowid]++
			case strings.HasSuffix(step, "USING INDEX "+byDead):
				got[byDead]++
			case step == "SEARCH outbox":
				got[newest]++
			default:
				t.Fatalf("%s: %q reads the table otherwise:\n%s", c.name, step, text)
			}
		}
		require.Equal(t, c.want, got, "%s:\n%s", c.name, text)
	}
}

// BenchmarkGaugesPriorities100k is BenchmarkGauges100k with the backlog
// spread over priorities 0, 5 and 9: the priorities above 0 are counted
// in their index.
func BenchmarkGaugesPriorities100k(b *testing.B) {
	ob := backlogOutbox(b, 100_000)
	if _, err := ob.DB().Exec(`UPDATE outbox SET priority = CASE seq % 3 WHEN 1 THEN 5 WHEN 2 THEN 9 ELSE 0 END`); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		g, err := ob.Gauges(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(g.Priorities) != 3 {
			b.Fatalf("priorities %v", g.Priorities)
		}
	}
}

// TestListByPriority: List's pending and sent follow each priority's mark,
// and ListOptions.Priority selects one priority's rows.
func TestListByPriority(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{})
	// seq: 1 2 3 4 5; priority: 0 9 0 9 4. Priority 9's mark passes 2
	// and 4; the common one stays at 0, below 1.
	byPriority(t, ob, time.Now().Add(-time.Hour), 0, 9, 0, 9, 4)
	_, err := ob.DB().Exec(`UPDATE outbox_state SET sent_seq_9 = 4, seq_floor = max(seq_floor, 4)`)
	require.NoError(t, err)
	seqs := func(opts ListOptions) []int64 {
		t.Helper()
		recs, err := ob.List(ctx, opts)
		require.NoError(t, err)
		out := []int64{}
		for _, r := range recs {
			if opts.Priority != nil {
				require.Equal(t, *opts.Priority, r.Priority)
			}
			out = append(out, r.Seq)
		}
		return out
	}
	p := func(n int) *int { return &n }
	require.Equal(t, []int64{1, 3, 5}, seqs(ListOptions{}))
	require.Equal(t, []int64{2, 4}, seqs(ListOptions{State: StateSent}))
	require.Equal(t, []int64{}, seqs(ListOptions{Priority: p(9)}))
	require.Equal(t, []int64{2, 4}, seqs(ListOptions{State: StateSent, Priority: p(9)}))
	require.Equal(t, []int64{1, 3}, seqs(ListOptions{Priority: p(0)}))
	require.Equal(t, []int64{5}, seqs(ListOptions{Priority: p(4)}))
	require.Equal(t, []int64{3}, seqs(ListOptions{Priority: p(0), AfterSeq: 1}))
	for _, bad := range []int{-1, MaxPriority + 1} {
		_, err := ob.List(ctx, ListOptions{Priority: p(bad)})
		require.ErrorContains(t, err, "outside 0..9")
	}
}
