package powerfs_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/powerfs"
)

// TestFsyncDelay: with Options.FsyncDelay, an fsync, an fdatasync and a
// directory's fsync through the mount each take at least the delay; a
// write does not wait for it. SetFsyncDelay changes it.
func TestFsyncDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: powerfs mounts a FUSE file system served by a helper process")
	}
	const delay = 50 * time.Millisecond
	backing := filepath.Join(t.TempDir(), "backing")
	require.NoError(t, os.Mkdir(backing, 0o755))
	fs := powerfs.StartOptions(t, backing, powerfs.Options{FsyncDelay: delay})
	f, err := os.Create(filepath.Join(fs.Mountpoint(), "data"))
	require.NoError(t, err)
	defer f.Close()

	start := time.Now()
	_, err = f.Write(fill('a', 4096))
	require.NoError(t, err)
	require.Less(t, time.Since(start), delay, "a write does not wait for the delay")
	for _, sync := range []struct {
		name string
		do   func() error
	}{
		{"fsync", f.Sync},
		{"fdatasync", func() error { return fdatasync(f) }},
		{"fsync of the directory", func() error { powerfs.SyncDir(t, fs.Mountpoint()); return nil }},
	} {
		start := time.Now()
		require.NoError(t, sync.do())
		took := time.Since(start)
		require.GreaterOrEqual(t, took, delay, sync.name)
		t.Logf("%s took %s (delay %s)", sync.name, took, delay)
	}

	// Changed while mounted: from now on.
	const longer = 2 * delay
	require.NoError(t, fs.SetFsyncDelay(longer))
	start = time.Now()
	require.NoError(t, f.Sync())
	require.GreaterOrEqual(t, time.Since(start), longer, "fsync after SetFsyncDelay")
}

// TestCounts: the mount counts, by file name, the bytes written,
// the fsyncs, the 4 KiB pages each sync made durable (each once, however
// often written) and the pages written and not synced yet.
func TestCounts(t *testing.T) {
	fs, _ := start(t)
	mnt := fs.Mountpoint()
	p := filepath.Join(mnt, "data")
	writeFile(t, p, 0, fill('a', 10000), false) // pages 0–2
	writeFile(t, p, 100, fill('b', 10), false)  // page 0 again
	writeFile(t, p, 8190, fill('c', 4), false)  // pages 1 and 2 again
	writeFile(t, p, 20000, fill('d', 10), true) // page 4, then the sync
	writeFile(t, p, 0, fill('e', 5000), false)  // pages 0–1, not synced
	writeFile(t, filepath.Join(mnt, "other"), 0, fill('f', 1), true)
	powerfs.SyncDir(t, mnt)

	c, err := fs.Counts()
	require.NoError(t, err)
	data := c["data"]
	require.GreaterOrEqual(t, data.Writes, int64(5), "write requests: the kernel may split one")
	data.Writes = 0
	require.Equal(t, powerfs.FileCounts{Bytes: 10000 + 10 + 4 + 10 + 5000, Pages: 4, Fsyncs: 1, Dirty: 2}, data)
	require.Equal(t, powerfs.FileCounts{Writes: 1, Bytes: 1, Pages: 1, Fsyncs: 1}, c["other"])
	require.EqualValues(t, 1, c["."].Fsyncs, "the directory's fsync")
}
