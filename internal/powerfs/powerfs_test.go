package powerfs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox/internal/powerfs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start mounts a power-loss file system over a new backing directory; it
// skips under -short, as the file system needs FUSE and a helper process.
func start(t *testing.T) (*powerfs.FS, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: powerfs mounts a FUSE file system served by a helper process")
	}
	backing := filepath.Join(t.TempDir(), "backing")
	require.NoError(t, os.Mkdir(backing, 0o755))
	return powerfs.Start(t, backing), backing
}

// writeFile writes data at off in the file at path (creating it), then
// fsyncs it if sync.
func writeFile(t *testing.T, path string, off int64, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt(data, off)
	require.NoError(t, err)
	if sync {
		require.NoError(t, f.Sync())
	}
}

func truncate(t *testing.T, path string, size int64, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(size))
	if sync {
		require.NoError(t, f.Sync())
	}
}

func fill(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// TestSyncedSurvivesUnsyncedDoesNot: what was written before an fsync is
// there after a cut; what was written after it (appended, and over the
// synced part) is not, and the cut says how many bytes it dropped.
func TestSyncedSurvivesUnsyncedDoesNot(t *testing.T) {
	fs, _ := start(t)
	mnt := fs.Mountpoint()
	p := filepath.Join(mnt, "data")
	synced := append(fill('a', 10000), fill('b', 3)...)
	writeFile(t, p, 0, synced, true)
	powerfs.SyncDir(t, mnt)
	writeFile(t, p, int64(len(synced)), fill('c', 5000), false) // appended
	writeFile(t, p, 100, fill('d', 50), false)                  // over synced bytes
	writeFile(t, p, 120, fill('e', 50), false)                  // over the same page again
	require.Len(t, readFile(t, p), len(synced)+5000, "the unsynced writes are there before the cut")

	dropped := fs.Cut()
	require.Equal(t, synced, readFile(t, p), "after the cut: the file as it was synced")
	require.EqualValues(t, 5000+70, dropped, "dropped: the appended bytes and the overwritten ones, each once")
	require.Equal(t, dropped, fs.DroppedBytes())

	// The mount is back and works as before: fdatasync counts as a sync.
	f, err := os.OpenFile(p, os.O_RDWR|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte("more"))
	require.NoError(t, err)
	require.NoError(t, fdatasync(f))
	_, err = f.Write([]byte("lost"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.EqualValues(t, 4, fs.Cut())
	require.Equal(t, append(synced, "more"...), readFile(t, p))
	require.EqualValues(t, 5000+70+4, fs.DroppedBytes())
	require.Equal(t, 2, fs.Cuts())
}

// TestSizeChanges: a truncate or an extension not synced is undone by a
// cut; synced, it stays.
func TestSizeChanges(t *testing.T) {
	fs, _ := start(t)
	mnt := fs.Mountpoint()
	content := make([]byte, 3*4096+123)
	for i := range content {
		content[i] = byte(i % 251)
	}
	shrunk, grown, kept := filepath.Join(mnt, "shrunk"), filepath.Join(mnt, "grown"), filepath.Join(mnt, "kept")
	for _, p := range []string{shrunk, grown, kept} {
		writeFile(t, p, 0, content, true)
	}
	powerfs.SyncDir(t, mnt)
	truncate(t, shrunk, 10, false)
	writeFile(t, shrunk, 4096*5, []byte("past the old end"), false) // and grown again, with a hole
	truncate(t, grown, 1<<20, false)
	truncate(t, kept, 4096, true)

	dropped := fs.Cut()
	require.Equal(t, content, readFile(t, shrunk), "an unsynced truncate is undone")
	require.Equal(t, content, readFile(t, grown), "an unsynced extension is undone")
	require.Equal(t, content[:4096], readFile(t, kept), "a synced truncate stays")
	// What the truncate cut off of synced data, and the bytes written
	// after it; growing adds no data and counts for nothing.
	require.EqualValues(t, len(content)-10+len("past the old end"), dropped)
}

// TestNamesNeedASync: a file's existence is durable once the file is
// fsynced (if it was created since the last sync of its directory) or its
// directory is; an unlink or a rename needs the directory's fsync.
func TestNamesNeedASync(t *testing.T) {
	fs, _ := start(t)
	mnt := fs.Mountpoint()
	in := func(name string) string { return filepath.Join(mnt, name) }
	require.NoError(t, os.Mkdir(in("sub"), 0o755))
	for _, name := range []string{"unlinked", "renamed", "over-from", "over-to", "sub/renamed-for-good", "sub/replaced"} {
		writeFile(t, in(name), 0, []byte(name), true)
	}
	powerfs.SyncDir(t, mnt)
	powerfs.SyncDir(t, in("sub"))

	writeFile(t, in("never-synced"), 0, []byte("x"), false)
	writeFile(t, in("file-synced"), 0, []byte("file"), true)
	require.NoError(t, os.Remove(in("unlinked")))
	require.NoError(t, os.Rename(in("renamed"), in("renamed-to")))
	require.NoError(t, os.Rename(in("over-from"), in("over-to")))
	writeFile(t, in("synced-then-unlinked"), 0, []byte("back"), true)
	require.NoError(t, os.Remove(in("synced-then-unlinked")))
	writeFile(t, in("created"), 0, []byte("named when synced"), false)
	require.NoError(t, os.Rename(in("created"), in("created-renamed")))
	writeFile(t, in("created-renamed"), 0, nil, true)
	writeFile(t, in("tmp-unlinked"), 0, []byte("never durable"), false)
	require.NoError(t, os.Remove(in("tmp-unlinked")))
	require.NoError(t, os.Mkdir(in("newdir"), 0o755))
	writeFile(t, in("newdir/all-synced"), 0, []byte("but not newdir's name"), true)
	powerfs.SyncDir(t, in("newdir"))
	// In sub, whose fsync comes last:
	writeFile(t, in("sub/dir-synced"), 0, []byte("data not synced"), false)
	require.NoError(t, os.Rename(in("sub/renamed-for-good"), in("sub/renamed")))
	// The safe way to replace a file: write, fsync, rename, fsync the directory.
	writeFile(t, in("sub/tmp"), 0, []byte("replaced safely"), true)
	require.NoError(t, os.Rename(in("sub/tmp"), in("sub/replaced")))
	powerfs.SyncDir(t, in("sub"))
	writeFile(t, in("sub/after-the-sync"), 0, []byte("y"), false)

	fs.Cut()
	names := func(dir string) []string {
		des, err := os.ReadDir(dir)
		require.NoError(t, err)
		var ns []string
		for _, de := range des {
			ns = append(ns, de.Name())
		}
		return ns
	}
	require.Equal(t, []string{"created-renamed", "file-synced", "over-from", "over-to", "renamed", "sub", "synced-then-unlinked", "unlinked"}, names(mnt))
	require.Equal(t, []string{"dir-synced", "renamed", "replaced"}, names(in("sub")))
	for name, want := range map[string]string{
		"file-synced": "file", "unlinked": "unlinked", "renamed": "renamed",
		"over-from": "over-from", "over-to": "over-to",
		"sub/renamed":          "sub/renamed-for-good",
		"sub/replaced":         "replaced safely",
		"synced-then-unlinked": "back",
		"created-renamed":      "named when synced",
		"sub/dir-synced":       "", // its name was synced, its data not
	} {
		require.Equal(t, want, string(readFile(t, in(name))), name)
	}
}

func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// TestTornKeepsSomePages: a torn cut keeps some of the unsynced pages and
// drops the others, each page whole, and a seed tears the same way again.
func TestTornKeepsSomePages(t *testing.T) {
	fs, _ := start(t)
	mnt := fs.Mountpoint()
	p := filepath.Join(mnt, "torn")
	const pages = 64
	writeFile(t, p, 0, fill('o', pages*4096), true)
	powerfs.SyncDir(t, mnt)
	keptBy := map[uint64][]bool{}
	for _, seed := range []uint64{1, 2, 3, 4, 5, 1} {
		writeFile(t, p, 0, fill('n', pages*4096), false)
		dropped := fs.CutTorn(seed)
		got := readFile(t, p)
		require.Len(t, got, pages*4096)
		var kept []bool
		n := 0
		for pg := range pages {
			page := got[pg*4096 : (pg+1)*4096]
			switch {
			case bytes.Equal(page, fill('n', 4096)):
				kept = append(kept, true)
				n++
			case bytes.Equal(page, fill('o', 4096)):
				kept = append(kept, false)
			default:
				t.Fatalf("seed %d: page %d is neither the synced one nor the new one", seed, pg)
			}
		}
		t.Logf("seed %d: %d of %d unsynced pages kept, %d bytes dropped", seed, n, pages, dropped)
		require.Positive(t, n, "seed %d: a torn cut keeps some pages", seed)
		require.Less(t, n, pages, "seed %d: a torn cut drops some pages", seed)
		require.EqualValues(t, (pages-n)*4096, dropped, "seed %d: dropped bytes", seed)
		if prev, ok := keptBy[seed]; ok {
			require.Equal(t, prev, kept, "seed %d again: the same pages", seed)
		}
		keptBy[seed] = kept
		// Make the new content durable for the next round's comparison
		// to start from all-'o' again.
		writeFile(t, p, 0, fill('o', pages*4096), true)
	}
	require.NotEqual(t, keptBy[1], keptBy[2], "two seeds, two tears")
}

// TestCutWithAFileOpen: a process that was not killed and still holds a
// file on the mount does not stop the cut; what it writes after the cut
// reaches nothing.
func TestCutWithAFileOpen(t *testing.T) {
	fs, _ := start(t)
	p := filepath.Join(fs.Mountpoint(), "open")
	writeFile(t, p, 0, []byte("synced"), true)
	powerfs.SyncDir(t, fs.Mountpoint())
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte("SYNCED, not"), 0)
	require.NoError(t, err)

	require.EqualValues(t, len("SYNCED, not"), fs.Cut())
	_, err = f.WriteAt([]byte("after the cut"), 0)
	require.Error(t, err, "a write through the old mount after the cut")
	t.Logf("a write through the old mount after the cut: %v", err)
	require.Equal(t, "synced", string(readFile(t, p)))
}
