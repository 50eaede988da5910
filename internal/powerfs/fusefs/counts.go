//go:build linux && !arm

package fusefs

import "sync"

// Counts is what went through the mount to the files of one name: what a
// program asked of the storage, for a benchmark to read (the power-loss
// model does not use it).
type Counts struct {
	Writes int64 `json:"writes"` // write requests
	Bytes  int64 `json:"bytes"`  // bytes written
	// Pages is how many 4 KiB pages a sync made durable: those written
	// since the file's previous sync, each once however often it was
	// written, as a file system writes its dirty pages back at an fsync.
	Pages  int64 `json:"pages"`
	Fsyncs int64 `json:"fsyncs"` // fsync and fdatasync (fsyncdir for a directory)
	// Dirty is how many pages are written and not synced now: what a
	// file system would write back later on its own.
	Dirty int64 `json:"dirty"`
}

// Counter keeps Counts per name, relative to the mount's root ("." for
// the root directory), over every life of a mount that shares it.
type Counter struct {
	mu     sync.Mutex
	byName map[string]*Counts
}

// NewCounter returns an empty Counter.
func NewCounter() *Counter { return &Counter{byName: map[string]*Counts{}} }

func (c *Counter) add(name string, f func(*Counts)) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.byName[name]
	if n == nil {
		n = &Counts{}
		c.byName[name] = n
	}
	f(n)
}

// Snapshot returns the counts so far; dirty gives each name's pages
// written and not synced now (Mount.Dirty).
func (c *Counter) Snapshot(dirty map[string]int64) map[string]Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Counts, len(c.byName))
	for name, n := range c.byName {
		out[name] = *n
	}
	for name, d := range dirty {
		n := out[name]
		n.Dirty = d
		out[name] = n
	}
	return out
}

// Dirty returns, per name, how many pages are written and not synced now.
func (m *Mount) Dirty() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int64{}
	for ino, s := range m.files {
		if len(s.dirty) > 0 {
			out[m.names[ino]] += int64(len(s.dirty))
		}
	}
	return out
}
