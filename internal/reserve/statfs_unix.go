//go:build unix

package reserve

import (
	"path/filepath"
	"syscall"
)

// FreeBytes reports the space available to this user on the file system
// holding path.
func FreeBytes(path string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
