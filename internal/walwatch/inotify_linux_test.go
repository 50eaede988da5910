package walwatch

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSubscriptionsShareOneInstance: the watches of one process share one
// inotify instance (a process has few), watching each directory once; each
// subscriber hears its own file only; the last one to close closes the
// instance.
func TestSubscriptionsShareOneInstance(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	var subs []*Subscription
	for i := range 4 {
		// Two databases in one directory, two in directories of their own.
		path := filepath.Join(dir, fmt.Sprintf("till-%d.db", i))
		if i >= 2 {
			path = filepath.Join(t.TempDir(), "till.db")
		}
		walDB(t, path)
		holdOpen(t, path)
		s, err := Subscribe(path + "-wal")
		require.NoError(t, err)
		paths, subs = append(paths, path), append(subs, s)
	}
	watchers.mu.Lock()
	w := watchers.w
	require.NotNil(t, w)
	require.Equal(t, 4, w.subs)
	require.Len(t, w.dirs, 3, "one watch per directory")
	watchers.mu.Unlock()
	for i, path := range paths {
		for _, s := range subs { // forget earlier events
			select {
			case <-s.C:
			default:
			}
		}
		insert(t, path, i)
		select {
		case <-subs[i].C:
		case <-time.After(5 * time.Second):
			t.Fatalf("no event for %s", path)
		}
		for j, s := range subs {
			if j != i {
				require.Empty(t, s.C, "subscriber %d heard %s", j, path)
			}
		}
	}
	for _, s := range subs {
		s.Close()
	}
	watchers.mu.Lock()
	defer watchers.mu.Unlock()
	require.Nil(t, watchers.w, "closed with the last subscriber")
}
