package walwatch

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSubscriptionsShareOneInstance: the watches of one process share one
// inotify instance (a process has few), watching each directory once; each
// subscriber hears its own file, and one whose file nobody writes hears
// nothing though its directory is busy; the last one to close closes the
// instance.
func TestSubscriptionsShareOneInstance(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	var subs []*Subscription
	for i := range 4 {
		// Two files in one directory, two in directories of their own.
		path := filepath.Join(dir, fmt.Sprintf("till-%d.db-wal", i))
		if i >= 2 {
			path = filepath.Join(t.TempDir(), "till.db-wal")
		}
		s, err := Subscribe(path)
		require.NoError(t, err)
		paths, subs = append(paths, path), append(subs, s)
	}
	quiet, err := Subscribe(filepath.Join(dir, "quiet.db-wal"))
	require.NoError(t, err)
	last := filepath.Join(dir, "last.db-wal")
	barrier, err := Subscribe(last)
	require.NoError(t, err)
	watchers.mu.Lock()
	w := watchers.w
	require.NotNil(t, w)
	require.Equal(t, 6, w.subs)
	require.Len(t, w.dirs, 3, "one watch per directory")
	watchers.mu.Unlock()
	for i, path := range paths {
		require.NoError(t, os.WriteFile(path, []byte("frame"), 0o600))
		select {
		case <-subs[i].C:
		case <-time.After(5 * time.Second):
			t.Fatalf("no event for %s", path)
		}
	}
	// One goroutine dispatches the instance's events in the kernel's
	// order: once the last file's event has come, every event of the
	// writes before it has been dispatched.
	require.NoError(t, os.WriteFile(last, []byte("frame"), 0o600))
	select {
	case <-barrier.C:
	case <-time.After(5 * time.Second):
		t.Fatalf("no event for %s", last)
	}
	require.Empty(t, quiet.C, "a subscriber heard another file's writes")
	quiet.Close()
	barrier.Close()
	for _, s := range subs {
		s.Close()
	}
	watchers.mu.Lock()
	defer watchers.mu.Unlock()
	require.Nil(t, watchers.w, "closed with the last subscriber")
}
