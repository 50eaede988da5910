//go:build linux && !arm

package fusefs

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// restoreNames gives every directory changed since its last sync the names
// it had then, each with the inode it had then: a name created since goes
// (with all below it), a name unlinked or renamed away comes back, a name
// renamed over gets its old file back. m.mu is held and the mount gone.
func (m *Mount) restoreNames() error {
	if len(m.dirs) == 0 {
		return nil
	}
	// Names move below: first every file that a durable name needs gets a
	// link in the stash by its inode, wherever it is now (the stash holds
	// what was unlinked).
	need := map[uint64]bool{}
	for _, l := range m.dirs {
		for _, e := range l {
			if !e.dir {
				need[e.ino] = true
			}
		}
	}
	if err := os.MkdirAll(m.stash, 0o700); err != nil {
		return err
	}
	keep := map[uint64]string{}
	for _, root := range []string{m.stash, m.backing} {
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil {
				return err
			}
			if !need[st.Ino] || keep[st.Ino] != "" {
				return nil
			}
			k := filepath.Join(m.stash, "i"+strconv.FormatUint(st.Ino, 10))
			if err := os.Link(p, k); err != nil && !os.IsExist(err) {
				return err
			}
			keep[st.Ino] = k
			return nil
		})
		if err != nil {
			return err
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(m.backing, &st); err != nil {
		return err
	}
	return m.restoreDir(m.backing, st.Ino, keep)
}

// restoreDir restores directory path, whose inode at its last sync was ino,
// and those below it.
func (m *Mount) restoreDir(path string, ino uint64, keep map[uint64]string) error {
	cur, err := listDir(path)
	if err != nil {
		return err
	}
	want, changed := m.dirs[ino]
	if !changed {
		for name, e := range cur {
			if e.dir {
				if err := m.restoreDir(filepath.Join(path, name), e.ino, keep); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for name, e := range cur {
		if w, ok := want[name]; ok && w.ino == e.ino {
			continue
		}
		if err := os.RemoveAll(filepath.Join(path, name)); err != nil {
			return err
		}
	}
	for _, name := range sortedKeys(want) {
		w, p := want[name], filepath.Join(path, name)
		e, ok := cur[name]
		present := ok && e.ino == w.ino
		switch {
		case w.dir:
			if !present {
				if err := os.Mkdir(p, os.FileMode(w.mode&0o777)); err != nil {
					return err
				}
			}
			if err := m.restoreDir(p, w.ino, keep); err != nil {
				return err
			}
		case !present:
			src := keep[w.ino]
			if src == "" {
				return fmt.Errorf("%s: its inode %d is gone", p, w.ino)
			}
			if err := os.Link(src, p); err != nil {
				return err
			}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortBy[T any](s []T, key func(T) string) {
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
}
