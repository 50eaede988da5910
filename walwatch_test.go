package outbox

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sidecarInsert commits one event by plain SQL on a pool of its own, as
// another process would: no in-process wake-up reaches the relay.
func sidecarInsert(t *testing.T, path, sync string, n int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=synchronous("+sync+")")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/1', ?)`, fmt.Sprintf(`{"n":%d}`, n))
	require.NoError(t, err)
}

// TestRelayWatchesTheWAL: with polling out of the way (an hour between
// looks), a relay on Linux still sees other processes' commits at once, at
// synchronous FULL and NORMAL: it watches the WAL. Without the watch this
// test waits in vain.
func TestRelayWatchesTheWAL(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.PollInterval = time.Hour
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	r.safetyPoll = time.Hour
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected", func() bool { return pub.connectCount() == 1 })
	for i, sync := range []string{"FULL", "NORMAL", "FULL", "NORMAL"} {
		sidecarInsert(t, dbPath(t, ob), sync, i)
		eventually(t, 5*time.Second, "published: "+sync, func() bool { return pub.publishedCount() == i+1 })
	}
}

// TestRelayPollsWhenTheWALCannotBeWatched: a relay that cannot watch its
// WAL (no inotify instance left, another OS) polls data_version, as
// before, and says so in the log.
func TestRelayPollsWhenTheWALCannotBeWatched(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.PollInterval = 5 * time.Millisecond
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	r.watchWAL = func(string) (*walSubscription, error) { return nil, errNoWALWatch }
	startRelay(t, r)
	sidecarInsert(t, dbPath(t, ob), "NORMAL", 1)
	eventually(t, 5*time.Second, "published by polling", func() bool { return pub.publishedCount() == 1 })
}

// TestRelaysShareOneWALWatcher: relays in one process share one inotify
// instance (a process has few: 128 here), watching each directory once;
// the last relay to stop closes it.
func TestRelaysShareOneWALWatcher(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	dir := t.TempDir()
	var stops []func()
	var pubs []*fakePublisher
	var paths []string
	for i := range 4 {
		// Two databases in one directory, two in directories of their own.
		path := filepath.Join(dir, fmt.Sprintf("till-%d.db", i))
		if i >= 2 {
			path = filepath.Join(t.TempDir(), "till.db")
		}
		ob, err := Open(t.Context(), path, Options{Logger: testLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { ob.Close() })
		pub := &fakePublisher{}
		opts := fastRelay()
		opts.PollInterval = time.Hour
		r, err := ob.NewRelay(pub, opts)
		require.NoError(t, err)
		r.safetyPoll = time.Hour
		stops = append(stops, startRelay(t, r))
		pubs, paths = append(pubs, pub), append(paths, path)
	}
	for i := range pubs {
		eventually(t, 5*time.Second, "connected", func() bool { return pubs[i].connectCount() == 1 })
	}
	walWatchers.mu.Lock()
	w := walWatchers.w
	require.NotNil(t, w)
	require.Equal(t, 4, w.subs)
	require.Len(t, w.dirs, 3, "one watch per directory")
	walWatchers.mu.Unlock()
	// Each relay hears its own file only.
	for i, path := range paths {
		sidecarInsert(t, path, "NORMAL", i)
		eventually(t, 5*time.Second, "published", func() bool { return pubs[i].publishedCount() == 1 })
		for j := range pubs {
			if j > i {
				require.Zero(t, pubs[j].publishedCount())
			}
		}
	}
	for _, stop := range stops {
		stop()
	}
	walWatchers.mu.Lock()
	defer walWatchers.mu.Unlock()
	require.Nil(t, walWatchers.w, "closed with the last relay")
}

// TestNapTimer: an armed gap fires once, however often it is armed again
// before (each arming forgets the last); a disarmed one leaves nothing;
// close ends its reader (goleak checks the package's goroutines).
func TestNapTimer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("a timerfd is Linux's")
	}
	n, err := newNapTimer()
	require.NoError(t, err)
	defer n.close()
	for i := 0; i < 3; i++ {
		n.arm(200 * time.Microsecond)
		select {
		case <-n.fired:
		case <-time.After(5 * time.Second):
			t.Fatal("an armed napTimer did not fire")
		}
	}
	// Fired and not taken: the next arming forgets it, and a disarmed
	// timer is quiet for as long as a long gap would have taken.
	n.arm(time.Microsecond)
	require.Eventually(t, func() bool { return len(n.fired) == 1 }, 5*time.Second, time.Millisecond)
	n.arm(time.Hour)
	require.Empty(t, n.fired, "arm forgets the value an earlier gap left")
	n.disarm()
	n.arm(50 * time.Millisecond)
	n.disarm()
	select {
	case <-n.fired:
		t.Fatal("a disarmed napTimer fired")
	case <-time.After(200 * time.Millisecond):
	}
}
