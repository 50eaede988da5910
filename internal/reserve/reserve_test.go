package reserve

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFillReleaseRefill: the reserve is written whole (not sparse), given
// up once, written again when the disk has room, and a nil reserve does
// nothing.
func TestFillReleaseRefill(t *testing.T) {
	db := filepath.Join(t.TempDir(), "till.db")
	r := New(db, 256<<10)
	require.NoError(t, r.Fill())
	fi, err := os.Stat(db + "-reserve")
	require.NoError(t, err)
	require.EqualValues(t, 256<<10, fi.Size())
	require.True(t, r.Release())
	require.False(t, r.Release(), "released once")
	_, err = os.Stat(db + "-reserve")
	require.ErrorIs(t, err, os.ErrNotExist)
	r.Refill()
	_, err = os.Stat(db + "-reserve")
	require.NoError(t, err, "written again: this disk has room")
	size, ok := ReleaseFile(db)
	require.True(t, ok)
	require.EqualValues(t, 256<<10, size)

	var none *Reserve = New("", 1)
	require.NoError(t, none.Fill())
	require.False(t, none.Release())
	none.Refill()
}
