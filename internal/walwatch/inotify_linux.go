//go:build linux

package walwatch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchers is the process's one inotify instance, shared by every relay
// that watches a WAL: a user has few instances (128 by default, in
// /proc/sys/fs/inotify/max_user_instances), and hundreds of relays in one process
// must work. It is the one piece of global state in the package, and the
// reason is that limit: it is opened by the first watch and closed with the
// last one, so a process with no relay running holds nothing.
var watchers struct {
	mu sync.Mutex
	w  *inotifyWatcher
}

// inotifyWatcher is one inotify descriptor and the goroutine that reads it.
// It watches directories, not files: SQLite deletes and creates the WAL
// again (when the last connection closes, or after a truncating
// checkpoint), and a watch on the directory sees every file it holds.
type inotifyWatcher struct {
	f      *os.File
	dirs   map[int32]*watchedDir // by watch descriptor
	byPath map[string]*watchedDir
	subs   int
	done   chan struct{}
}

type watchedDir struct {
	wd    int32
	path  string
	names map[string][]*Subscription // file name → its subscribers
}

// Subscription is one relay's watch on its WAL: C receives a value
// (coalesced) after any write to the file by any process.
type Subscription struct {
	C    chan struct{}
	dir  string
	name string
}

// Subscribe watches the file at path. ErrNoWatch says that it cannot be
// watched (no inotify instance left, or too many watches): poll instead.
func Subscribe(path string) (*Subscription, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	dir, name := filepath.Dir(abs), filepath.Base(abs)
	watchers.mu.Lock()
	defer watchers.mu.Unlock()
	w := watchers.w
	if w == nil {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			return nil, fmt.Errorf("%w: inotify: %w", ErrNoWatch, err)
		}
		// Non-blocking, so that the runtime's poller waits for it and a
		// Close ends the read.
		w = &inotifyWatcher{f: os.NewFile(uintptr(fd), "inotify"), dirs: map[int32]*watchedDir{},
			byPath: map[string]*watchedDir{}, done: make(chan struct{})}
		go w.read()
	}
	d := w.byPath[dir]
	if d == nil {
		wd, err := unix.InotifyAddWatch(int(w.f.Fd()), dir, unix.IN_MODIFY|unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
		if err != nil {
			if w.subs == 0 {
				// Never published: its reader ends on the close, without
				// the lock.
				w.f.Close()
			}
			return nil, fmt.Errorf("%w: inotify watch of %s: %w", ErrNoWatch, dir, err)
		}
		d = &watchedDir{wd: int32(wd), path: dir, names: map[string][]*Subscription{}}
		w.dirs[d.wd], w.byPath[dir] = d, d
	}
	s := &Subscription{C: make(chan struct{}, 1), dir: dir, name: name}
	d.names[name] = append(d.names[name], s)
	w.subs++
	watchers.w = w
	return s, nil
}

// Close ends the watch; the last one closes the inotify instance and waits
// for its reader to end.
func (s *Subscription) Close() {
	watchers.mu.Lock()
	w := watchers.w
	var d *watchedDir
	if w != nil {
		d = w.byPath[s.dir]
	}
	if d == nil {
		watchers.mu.Unlock()
		return
	}
	subs := d.names[s.name]
	for i, o := range subs {
		if o == s {
			d.names[s.name] = append(subs[:i:i], subs[i+1:]...)
			w.subs--
			break
		}
	}
	if len(d.names[s.name]) == 0 {
		delete(d.names, s.name)
	}
	if len(d.names) == 0 {
		unix.InotifyRmWatch(int(w.f.Fd()), uint32(d.wd))
		delete(w.dirs, d.wd)
		delete(w.byPath, d.path)
	}
	last := w.subs == 0
	if last {
		watchers.w = nil
	}
	watchers.mu.Unlock()
	if last {
		// The reader takes the lock after each read: wait without it.
		w.f.Close()
		<-w.done
	}
}

// read dispatches events to the subscribers of the file they name.
func (w *inotifyWatcher) read() {
	defer close(w.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			// An overflow or a read error: wake everyone, who then looks.
			watchers.mu.Lock()
			for _, d := range w.dirs {
				for _, subs := range d.names {
					notifyAll(subs)
				}
			}
			watchers.mu.Unlock()
			if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) {
				return
			}
			continue
		}
		watchers.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				// Events were lost: everyone looks.
				for _, d := range w.dirs {
					for _, subs := range d.names {
						notifyAll(subs)
					}
				}
				continue
			}
			d := w.dirs[ev.Wd]
			if d == nil {
				continue
			}
			name := string(nameBytes)
			for i := 0; i < len(name); i++ {
				if name[i] == 0 {
					name = name[:i]
					break
				}
			}
			notifyAll(d.names[name])
		}
		watchers.mu.Unlock()
	}
}

func notifyAll(subs []*Subscription) {
	for _, s := range subs {
		select {
		case s.C <- struct{}{}:
		default:
		}
	}
}
