//go:build linux && !arm

package fusefs

import (
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// entry is a name in a directory, as a directory sync left it.
type entry struct {
	ino  uint64
	dir  bool
	mode uint32
}

// where is a name in a directory: that of a file created since the mount
// whose existence no sync has made durable yet.
type where struct {
	dir  uint64
	name string
}

// Mount is one life of the mount, from its start (when everything in the
// backing directory counts as durable) to a cut or Close.
type Mount struct {
	backing, mountpoint string
	// stash is a sibling of the backing directory (the same file system,
	// so that a hard link is possible) that keeps the inodes a durable
	// name may need again: what was unlinked or renamed over since the
	// last directory sync. It is emptied by every cut.
	stash  string
	server *fuse.Server

	// mu serialises every change to the backing directory with the
	// records of it, and with the cut: once dead, nothing more reaches
	// the backing directory.
	mu   sync.Mutex
	dead bool
	// files: inode -> what changed since its last sync.
	files map[uint64]*fileState
	// dirs: inode -> its listing at its last sync, for every directory
	// whose names changed since (a new directory's is empty).
	dirs map[uint64]map[string]entry
	// created: inode -> the name it was created under, until a sync of
	// the file or of its directory makes that name durable.
	created  map[uint64]where
	stashSeq int
	// names: inode -> the name (relative to the root) a file was last
	// opened under, for the counts.
	names map[uint64]string

	opts  Options
	delay atomic.Int64 // Options.FsyncDelay, or what SetFsyncDelay set
}

// Options are a mount's settings beyond its place.
type Options struct {
	// Debug logs every FUSE request to stderr.
	Debug bool
	// FsyncDelay makes every fsync, fdatasync and directory fsync take at
	// least this long before it returns, as on an SD card, where a sync
	// waits for the card's controller to program its flash: the caller
	// waits, other requests go on meanwhile.
	FsyncDelay time.Duration
	// Counter, if not nil, counts what goes through the mount; a helper
	// gives every life of its mount the same one.
	Counter *Counter
}

// Start mounts a new life of the file system over backing at mountpoint.
func Start(backing, mountpoint string, o Options) (*Mount, error) {
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	m := &Mount{
		backing:    backing,
		mountpoint: mountpoint,
		stash:      filepath.Join(filepath.Dir(backing), "."+filepath.Base(backing)+".powerfs-stash"),
		files:      map[uint64]*fileState{},
		dirs:       map[uint64]map[string]entry{},
		created:    map[uint64]where{},
		names:      map[uint64]string{},
		opts:       o,
	}
	// Left over by a helper that died: nothing in it is needed any more.
	if err := os.RemoveAll(m.stash); err != nil {
		return nil, err
	}
	rootOps, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, err
	}
	root := &node{LoopbackNode: rootOps.(*fs.LoopbackNode), m: m}
	opts := &fs.Options{MountOptions: fuse.MountOptions{
		// No fusermount: we are root and mount(2) ourselves.
		DirectMountStrict: true,
		FsName:            "powerfs",
		Name:              "powerfs",
		Debug:             o.Debug,
		// Every write must reach this process: with a writeback cache
		// the kernel would hold data we never saw, and a cut could not
		// drop it; with passthrough the kernel would write the backing
		// file itself. (go-fuse asks for neither; this says so.)
		DisabledCapabilities: fuse.CAP_WRITEBACK_CACHE | fuse.CAP_PASSTHROUGH,
	}}
	srv, err := fs.Mount(mountpoint, root, opts)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	m.server = srv
	m.delay.Store(int64(o.FsyncDelay))
	return m, nil
}

// SetFsyncDelay changes Options.FsyncDelay from now on.
func (m *Mount) SetFsyncDelay(d time.Duration) { m.delay.Store(int64(d)) }

// Cut pulls the plug: from now on no request reaches the backing
// directory; the mount goes (the kernel's page cache of it with it), and
// the backing directory is put back as it was at the last syncs. With
// rng the cut is torn: a random part of the unsynced pages is kept. It
// returns how many unsynced bytes were dropped. The processes using the
// mount must be gone; if some still hold a file open, the mount is
// aborted and detached. Start the next life with Start.
func (m *Mount) Cut(rng *rand.Rand) (dropped int64, err error) {
	m.mu.Lock()
	m.dead = true
	m.mu.Unlock()
	if err := m.unmount(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revert(rng)
}

// Close unmounts and leaves the backing directory as the processes left
// it, synced or not.
func (m *Mount) Close() error {
	m.mu.Lock()
	m.dead = true
	m.mu.Unlock()
	err := m.unmount()
	return errors.Join(err, os.RemoveAll(m.stash))
}

// unmount takes the mount away. If files are still open on it (a process
// the caller did not stop, or a release the kernel has not sent yet), the
// connection is aborted, so that what is in flight fails, and the mount
// detached: the next mount can take its place at once.
func (m *Mount) unmount() error {
	var st syscall.Stat_t
	statErr := syscall.Stat(m.mountpoint, &st)
	err := syscall.Unmount(m.mountpoint, 0)
	if err == nil {
		m.server.Wait()
		return nil
	}
	if !errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("unmount %s: %w", m.mountpoint, err)
	}
	if statErr == nil {
		// Only where fusectl is mounted; without it the detached
		// connection lives on until its last file closes, answering
		// EIO (the mount is dead).
		abort := filepath.Join("/sys/fs/fuse/connections", strconv.FormatUint(uint64(unix.Minor(st.Dev)), 10), "abort")
		_ = os.WriteFile(abort, []byte("1"), 0)
	}
	if err := syscall.Unmount(m.mountpoint, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s (detach): %w", m.mountpoint, err)
	}
	log.Printf("powerfs: %s was busy (a file still open on it): aborted and detached", m.mountpoint)
	return nil
}

// revert drops everything not synced; m.mu is held and the mount gone.
func (m *Mount) revert(rng *rand.Rand) (dropped int64, err error) {
	if err := m.restoreNames(); err != nil {
		return 0, fmt.Errorf("restore names: %w", err)
	}
	if err := os.RemoveAll(m.stash); err != nil {
		return 0, err
	}
	if len(m.files) == 0 {
		return 0, nil
	}
	paths, err := m.walk()
	if err != nil {
		return 0, err
	}
	// In the order of their paths, so that a seed tears the same way
	// again whatever the inode numbers.
	type todo struct {
		path string
		s    *fileState
	}
	var list []todo
	for ino, s := range m.files {
		p, ok := paths[ino]
		if !ok { // the file did not survive the cut: none of it was durable
			dropped += s.changedBytes()
			continue
		}
		list = append(list, todo{p, s})
	}
	sortBy(list, func(t todo) string { return t.path })
	for _, t := range list {
		fd, err := syscall.Open(t.path, syscall.O_WRONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return dropped, fmt.Errorf("revert %s: %w", t.path, err)
		}
		n, err := t.s.revert(fd, rng)
		dropped += n
		syscall.Close(fd)
		if err != nil {
			return dropped, fmt.Errorf("revert %s: %w", t.path, err)
		}
	}
	m.files = map[uint64]*fileState{}
	return dropped, nil
}

// walk maps the inode of every regular file under the backing directory
// to one of its paths.
func (m *Mount) walk() (map[uint64]string, error) {
	paths := map[uint64]string{}
	err := filepath.WalkDir(m.backing, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		if _, ok := paths[st.Ino]; !ok {
			paths[st.Ino] = p
		}
		return nil
	})
	return paths, err
}

func (m *Mount) isDead() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dead
}

// state is the record of inode ino, made with the size it has now if the
// file is unchanged since its sync.
func (m *Mount) state(ino uint64, size func() (int64, error)) (*fileState, error) {
	if s := m.files[ino]; s != nil {
		return s, nil
	}
	sz, err := size()
	if err != nil {
		return nil, err
	}
	s := newFileState(sz)
	m.files[ino] = s
	return s, nil
}

// synced makes inode ino's content and size durable, and the name it
// was created under, if any.
func (m *Mount) synced(ino uint64) {
	if s := m.files[ino]; s != nil {
		pages := int64(len(s.dirty))
		m.opts.Counter.add(m.names[ino], func(c *Counts) { c.Pages += pages })
	}
	delete(m.files, ino)
	if w, ok := m.created[ino]; ok {
		if l := m.dirs[w.dir]; l != nil {
			l[w.name] = entry{ino: ino, mode: syscall.S_IFREG}
		}
		delete(m.created, ino)
	}
}

// dirSynced makes directory ino's names durable as they are now.
func (m *Mount) dirSynced(ino uint64) {
	delete(m.dirs, ino)
	for f, w := range m.created {
		if w.dir == ino {
			delete(m.created, f)
		}
	}
}

// changingDir is called before a name in directory path changes: the
// first change since the directory's sync saves its listing. It returns
// the directory's inode.
func (m *Mount) changingDir(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return 0, err
	}
	if _, ok := m.dirs[st.Ino]; ok {
		return st.Ino, nil
	}
	l, err := listDir(path)
	if err != nil {
		return 0, err
	}
	m.dirs[st.Ino] = l
	return st.Ino, nil
}

func listDir(path string) (map[string]entry, error) {
	des, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	l := make(map[string]entry, len(des))
	for _, de := range des {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(path, de.Name()), &st); err != nil {
			return nil, err
		}
		l[de.Name()] = entry{ino: st.Ino, dir: st.Mode&syscall.S_IFMT == syscall.S_IFDIR, mode: st.Mode}
	}
	return l, nil
}

// removing is called before the name path in directory dirIno goes (an
// unlink, or a rename over it). If a durable name may need the file's
// inode again, it is hard-linked into the stash first, so that a cut can
// give it back.
func (m *Mount) removing(dirIno uint64, name, path string) error {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return nil // empty (rmdir) or refused (rename): a cut makes it anew
	}
	if w, ok := m.created[st.Ino]; ok && w == (where{dirIno, name}) {
		delete(m.created, st.Ino) // the name it was created under is gone
	}
	if !m.durableSomewhere(st.Ino) {
		return nil
	}
	if err := os.MkdirAll(m.stash, 0o700); err != nil {
		return err
	}
	m.stashSeq++
	return os.Link(path, filepath.Join(m.stash, "v"+strconv.Itoa(m.stashSeq)))
}

// durableSomewhere says whether a directory's listing at its last sync
// names inode ino. (A directory whose listing is not saved has not changed
// since its sync, and a name in it is not going away.)
func (m *Mount) durableSomewhere(ino uint64) bool {
	for _, l := range m.dirs {
		for _, e := range l {
			if e.ino == ino && !e.dir {
				return true
			}
		}
	}
	return false
}
