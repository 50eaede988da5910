package outbox

import (
	"context"
	"database/sql"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWALIndexTellsCommits: the WAL index says changed after another
// connection's commit and not otherwise, and pending while a transaction
// has written frames that no commit covers yet (here a transaction larger
// than its page cache, which SQLite spills into the WAL before COMMIT).
func TestWALIndexTellsCommits(t *testing.T) {
	ob := openTest(t, Options{})
	path := dbPath(t, ob)
	idx, err := openWALIndex(path)
	require.NoError(t, err)
	defer idx.close()
	idx.look()
	changed, pending := idx.look()
	require.False(t, changed, "nothing committed")
	require.False(t, pending, "nothing under way")

	sidecarInsert(t, path, "NORMAL", 1)
	changed, pending = idx.look()
	require.True(t, changed, "a commit")
	require.False(t, pending)
	changed, _ = idx.look()
	require.False(t, changed, "the same commit, seen")

	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=cache_size(10)")
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	c, err := db.Conn(ctx)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.ExecContext(ctx, `BEGIN IMMEDIATE`)
	require.NoError(t, err)
	big := strings.Repeat("x", 4000)
	for i := 0; i < 200; i++ {
		_, err = c.ExecContext(ctx, `INSERT INTO outbox (topic, payload) VALUES ('shop/1', ?)`, big)
		require.NoError(t, err)
	}
	changed, pending = idx.look()
	require.False(t, changed, "not committed yet")
	require.True(t, pending, "frames written before the commit")
	_, err = c.ExecContext(ctx, `COMMIT`)
	require.NoError(t, err)
	changed, pending = idx.look()
	require.True(t, changed, "committed")
	require.False(t, pending)
}

// TestIdleRelayLooksLittle: a watching relay that has nothing to send asks
// data_version about once a second, and once or twice after each of its own
// lease renewals, not at every fast look for a second after each (about 23):
// 500 such relays in one process must cost little (outboxctl fleet
// --idle). It still sees a sidecar's commit at once.
func TestIdleRelayLooksLittle(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = 400 * time.Millisecond // a renewal every 100 ms
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected", func() bool { return pub.connectCount() == 1 })
	start, looks := time.Now(), r.looks.Load()
	eventually(t, 10*time.Second, "two seconds", func() bool { return time.Since(start) >= 2*time.Second })
	n := r.looks.Load() - looks
	renewals := time.Since(start).Seconds() * 10
	t.Logf("%d data_version looks in %s, about %.0f renewals", n, time.Since(start).Round(time.Millisecond), renewals)
	require.Less(t, float64(n), 4*renewals, "looks per renewal")
	sidecarInsert(t, dbPath(t, ob), "FULL", 1)
	eventually(t, 5*time.Second, "published", func() bool { return pub.publishedCount() == 1 })
}
