//go:build linux && !arm

package fusefs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is go-fuse's loopback node with every change recorded first. Every
// request that changes the backing directory goes through a method here
// (or of file or dir), under m.mu; what the loopback does that these do
// not override only reads, or changes metadata the model keeps as it is
// (modes, owners, times, extended attributes).
type node struct {
	*fs.LoopbackNode
	m *Mount
}

var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
)

// WrapChild makes every node below the root one of ours.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), m: n.m}
}

// bpath is the node's path in the backing directory.
func (n *node) bpath() string { return filepath.Join(n.m.backing, n.Path(nil)) }

// Open opens the backing file without O_DIRECT, whatever the caller asked:
// the kernel sends an O_DIRECT write here as any other (and it is as
// volatile until an fsync: a drive's cache loses it just the same), and
// this process's own reads and writes of the backing file need no
// alignment.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	m := n.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return nil, 0, syscall.EIO
	}
	// The kernel truncates with a SETATTR (go-fuse does not ask for
	// atomic O_TRUNC); in case one comes anyway:
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		if errno := m.truncatePath(n.bpath(), 0); errno != 0 {
			return nil, 0, errno
		}
	}
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags&^syscall.O_DIRECT)
	if errno != 0 {
		return nil, 0, errno
	}
	f, errno := newFile(m, fh, flags, n.Path(nil))
	return f, fl, errno
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	m := n.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return nil, nil, 0, syscall.EIO
	}
	dir := n.bpath()
	dirIno, err := m.changingDir(dir)
	if err != nil {
		return nil, nil, 0, fs.ToErrno(err)
	}
	p := filepath.Join(dir, name)
	_, statErr := os.Lstat(p)
	existed := statErr == nil
	if existed && flags&syscall.O_TRUNC != 0 {
		if errno := m.truncatePath(p, 0); errno != 0 {
			return nil, nil, 0, errno
		}
	}
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags&^syscall.O_DIRECT, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	f, errno := newFile(m, fh, flags, filepath.Join(n.Path(nil), name))
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if !existed {
		m.created[f.ino] = where{dirIno, name}
	}
	return ch, f, fl, 0
}

// Setattr records a size change; the rest it leaves to the loopback.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		m := n.m
		m.mu.Lock()
		var errno syscall.Errno
		switch {
		case m.dead:
			errno = syscall.EIO
		case f != nil:
			if pf, ok := f.(*file); ok {
				errno = m.truncate(pf, int64(sz))
				break
			}
			fallthrough
		default:
			errno = m.truncatePath(n.bpath(), int64(sz))
		}
		m.mu.Unlock()
		if errno != 0 {
			return errno
		}
		in.Valid &^= fuse.FATTR_SIZE
	}
	if n.m.isDead() {
		return syscall.EIO
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

// nameChange runs op, which changes names in directory dir, after saving
// the listings of the directories it changes.
func (n *node) nameChange(dirs []string, op func() syscall.Errno) syscall.Errno {
	m := n.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return syscall.EIO
	}
	for _, d := range dirs {
		if _, err := m.changingDir(d); err != nil {
			return fs.ToErrno(err)
		}
	}
	return op()
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.nameChange([]string{n.bpath()}, func() syscall.Errno {
		ch, errno = n.LoopbackNode.Mkdir(ctx, name, mode, out)
		if errno == 0 {
			// A new directory's names are durable once it is synced:
			// until then it has none.
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(n.bpath(), name), &st); err == nil {
				n.m.dirs[st.Ino] = map[string]entry{}
			}
		}
		return errno
	})
	return ch, errno
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.nameChange([]string{n.bpath()}, func() syscall.Errno {
		ch, errno = n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
		return errno
	})
	return ch, errno
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.nameChange([]string{n.bpath()}, func() syscall.Errno {
		ch, errno = n.LoopbackNode.Symlink(ctx, target, name, out)
		return errno
	})
	return ch, errno
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	errno = n.nameChange([]string{n.bpath()}, func() syscall.Errno {
		ch, errno = n.LoopbackNode.Link(ctx, t.LoopbackNode, name, out)
		return errno
	})
	return ch, errno
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.nameChange([]string{n.bpath()}, func() syscall.Errno {
		dirIno, _ := n.m.changingDir(n.bpath()) // saved just now
		if err := n.m.removing(dirIno, name, filepath.Join(n.bpath(), name)); err != nil {
			return fs.ToErrno(err)
		}
		return n.LoopbackNode.Unlink(ctx, name)
	})
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.nameChange([]string{n.bpath()}, func() syscall.Errno {
		return n.LoopbackNode.Rmdir(ctx, name)
	})
}

// Rename of a file; a directory's is refused with EXDEV (as across file
// systems: mv copies instead), which keeps a cut's restore of names simple.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	from, to := filepath.Join(n.bpath(), name), filepath.Join(np.bpath(), newName)
	return n.nameChange([]string{n.bpath(), np.bpath()}, func() syscall.Errno {
		var st syscall.Stat_t
		if err := syscall.Lstat(from, &st); err != nil {
			return fs.ToErrno(err)
		}
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return syscall.EXDEV
		}
		const exchange = 1 << 1 // RENAME_EXCHANGE: nothing is replaced
		if flags&exchange == 0 {
			toIno, _ := n.m.changingDir(np.bpath()) // saved just now
			if err := n.m.removing(toIno, newName, to); err != nil && !errors.Is(err, syscall.ENOENT) {
				return fs.ToErrno(err)
			}
		}
		errno := n.LoopbackNode.Rename(ctx, name, np.LoopbackNode, newName, flags)
		if errno != 0 {
			return errno
		}
		// A file created since its directory's sync is durable, once
		// fsynced, under the name it has then.
		fromIno, err1 := n.m.changingDir(n.bpath())
		toIno, err2 := n.m.changingDir(np.bpath())
		if w, ok := n.m.created[st.Ino]; ok && err1 == nil && err2 == nil && w == (where{fromIno, name}) {
			n.m.created[st.Ino] = where{toIno, newName}
		}
		return 0
	})
}

// Tmpfile is refused: a file with no name could be linked in later, and
// the model does not follow it.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// CopyFileRange is refused, so that the kernel copies with reads and
// writes, which are recorded.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.m.isDead() {
		return nil, 0, syscall.EIO
	}
	p := n.bpath()
	ds, errno := fs.NewLoopbackDirStream(p)
	if errno != 0 {
		return nil, 0, errno
	}
	return &dir{ds: ds, m: n.m, path: p}, 0, 0
}

// truncate records a change of f's size to size, then makes it.
func (m *Mount) truncate(f *file, size int64) syscall.Errno {
	return m.truncateFd(f.fd, f.ino, f.read, size)
}

// truncatePath is truncate for a file no handle came with.
func (m *Mount) truncatePath(p string, size int64) syscall.Errno {
	fd, err := syscall.Open(p, syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fs.ToErrno(err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	return m.truncateFd(fd, st.Ino, func(b []byte, off int64) error { return preadAll(fd, b, off) }, size)
}

func (m *Mount) truncateFd(fd int, ino uint64, read readAtFunc, size int64) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	s, err := m.state(ino, func() (int64, error) { return st.Size, nil })
	if err != nil {
		return fs.ToErrno(err)
	}
	cur := st.Size
	if size < cur {
		if err := s.preserve(read, size, cur); err != nil {
			return syscall.EIO
		}
		// Growing a file is not counted: it adds no data, only zeros.
		s.mark(size, min(cur, s.synced))
	}
	return fs.ToErrno(syscall.Ftruncate(fd, size))
}

// file is an open file: go-fuse's loopback file, with its writes, size
// changes and syncs recorded. It does not offer its descriptor for FUSE
// passthrough, so that every write comes here.
type file struct {
	lf  *fs.LoopbackFile
	fd  int
	ino uint64
	m   *Mount
	// reader is a read-only descriptor of the same file, for saving
	// pages, when fd is write-only (opened on first need).
	wronly bool
	reader int
}

var (
	_ fs.FileReader    = (*file)(nil)
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileWritever  = (*file)(nil)
	_ fs.FileFsyncer   = (*file)(nil)
	_ fs.FileFlusher   = (*file)(nil)
	_ fs.FileReleaser  = (*file)(nil)
	_ fs.FileGetattrer = (*file)(nil)
	_ fs.FileLseeker   = (*file)(nil)
	_ fs.FileAllocater = (*file)(nil)
)

// newFile wraps the loopback's file opened under name (relative to the
// root); m.mu is held.
func newFile(m *Mount, fh fs.FileHandle, flags uint32, name string) (*file, syscall.Errno) {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		return nil, syscall.EIO
	}
	// The loopback file's own descriptor; it offers it for passthrough,
	// which is how it can be had.
	fd, ok := lf.PassthroughFd()
	if !ok {
		return nil, syscall.EBADF
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		lf.Release(context.Background())
		return nil, fs.ToErrno(err)
	}
	m.names[st.Ino] = name
	return &file{lf: lf, fd: fd, ino: st.Ino, m: m, wronly: flags&syscall.O_ACCMODE == syscall.O_WRONLY, reader: -1}, 0
}

// read reads the backing file (for saving pages); m.mu is held.
func (f *file) read(b []byte, off int64) error {
	if !f.wronly {
		return preadAll(f.fd, b, off)
	}
	if f.reader < 0 {
		fd, err := syscall.Open("/proc/self/fd/"+strconv.Itoa(f.fd), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f.reader = fd
	}
	return preadAll(f.reader, b, off)
}

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.m.isDead() {
		return nil, syscall.EIO
	}
	return f.lf.Read(ctx, buf, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	m := f.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return 0, syscall.EIO
	}
	s, err := m.state(f.ino, f.size)
	if err != nil {
		return 0, fs.ToErrno(err)
	}
	if err := s.preserve(f.read, off, off+int64(len(data))); err != nil {
		return 0, syscall.EIO
	}
	n, err := syscall.Pwrite(f.fd, data, off)
	if n > 0 {
		s.mark(off, off+int64(n))
		s.wrote(off, off+int64(n))
	}
	m.opts.Counter.add(m.names[f.ino], func(c *Counts) {
		c.Writes++
		c.Bytes += int64(max(n, 0))
	})
	return uint32(max(n, 0)), fs.ToErrno(err)
}

func (f *file) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	var all []byte
	for _, d := range data {
		all = append(all, d...)
	}
	return f.Write(ctx, all, off)
}

func (f *file) size() (int64, error) {
	var st syscall.Stat_t
	err := syscall.Fstat(f.fd, &st)
	return st.Size, err
}

// Fsync (and fdatasync: the model makes no difference) makes the file's
// content and size durable, and the name it was created under, once
// Options.FsyncDelay has passed. The backing file is not synced: the host
// is not the one losing power.
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	m := f.m
	m.fsyncDelay()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return syscall.EIO
	}
	m.opts.Counter.add(m.names[f.ino], func(c *Counts) { c.Fsyncs++ })
	m.synced(f.ino)
	return 0
}

// fsyncDelay waits Options.FsyncDelay, without holding m.mu: only the
// caller waits, as for a card busy programming its flash. An interrupt
// does not cut it short: the kernel asks for one whenever a signal reaches
// the caller's thread (Go's runtime preempts with SIGURG), and a real
// fsync does not fail with EINTR.
func (m *Mount) fsyncDelay() {
	if d := time.Duration(m.delay.Load()); d > 0 {
		time.Sleep(d)
	}
}

func (f *file) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	const keepSize, punchHole, zeroRange = 0x01, 0x02, 0x10
	if mode&^(keepSize|punchHole|zeroRange) != 0 {
		return syscall.EOPNOTSUPP // collapsing or inserting ranges moves data
	}
	m := f.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return syscall.EIO
	}
	s, err := m.state(f.ino, f.size)
	if err != nil {
		return fs.ToErrno(err)
	}
	start, end := int64(off), int64(off+size)
	if mode&(punchHole|zeroRange) != 0 {
		if err := s.preserve(f.read, start, end); err != nil {
			return syscall.EIO
		}
		s.mark(start, end)
		s.wrote(start, end)
	}
	return f.lf.Allocate(ctx, off, size, mode)
}

func (f *file) Flush(ctx context.Context) syscall.Errno { return f.lf.Flush(ctx) }

func (f *file) Release(ctx context.Context) syscall.Errno {
	f.m.mu.Lock()
	if f.reader >= 0 {
		syscall.Close(f.reader)
		f.reader = -1
	}
	f.m.mu.Unlock()
	return f.lf.Release(ctx)
}

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return f.lf.Getattr(ctx, out)
}

func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return f.lf.Lseek(ctx, off, whence)
}

// dir is an open directory: go-fuse's loopback directory stream, with
// fsyncdir recorded.
type dir struct {
	ds   fs.DirStream
	m    *Mount
	path string
}

var (
	_ fs.FileReaddirenter = (*dir)(nil)
	_ fs.FileSeekdirer    = (*dir)(nil)
	_ fs.FileReleasedirer = (*dir)(nil)
	_ fs.FileFsyncdirer   = (*dir)(nil)
)

func (d *dir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if r, ok := d.ds.(fs.FileReaddirenter); ok {
		return r.Readdirent(ctx)
	}
	if !d.ds.HasNext() {
		return nil, 0
	}
	e, errno := d.ds.Next()
	return &e, errno
}

func (d *dir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.ds.(fs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dir) Releasedir(ctx context.Context, flags uint32) {
	if r, ok := d.ds.(fs.FileReleasedirer); ok {
		r.Releasedir(ctx, flags)
		return
	}
	d.ds.Close()
}

// Fsyncdir makes the directory's names durable as they are now.
func (d *dir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	m := d.m
	m.fsyncDelay()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return syscall.EIO
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(d.path, &st); err != nil {
		return fs.ToErrno(err)
	}
	m.dirSynced(st.Ino)
	name, err := filepath.Rel(m.backing, d.path)
	if err != nil {
		name = d.path
	}
	m.opts.Counter.add(name, func(c *Counts) { c.Fsyncs++ })
	return 0
}
