package clock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeElapsed is monotonic time that moves only when the test says so.
type fakeElapsed struct{ d time.Duration }

func (f *fakeElapsed) elapsed() time.Duration  { return f.d }
func (f *fakeElapsed) advance(d time.Duration) { f.d += d }

// TestPause: a paused clock stands still and resumes where it stopped, and
// still catches up with a later stored value.
func TestPause(t *testing.T) {
	el := &fakeElapsed{}
	c := New(1000, el.elapsed, 10*time.Second)
	el.advance(2 * time.Second)
	c.Pause()
	el.advance(time.Hour)
	require.EqualValues(t, 3000, c.Now())
	require.Equal(t, time.Hour, c.Resume())
	require.EqualValues(t, 3000, c.Now())
	el.advance(time.Second)
	require.EqualValues(t, 4000, c.Now())
	c.Pause()
	c.CatchUp(10_000)
	require.EqualValues(t, 10_000, c.Now())
	el.advance(time.Minute)
	require.Equal(t, time.Minute, c.Resume())
	el.advance(time.Second)
	require.EqualValues(t, 11_000, c.Now())
	require.Zero(t, c.Resume(), "not paused")
}

// TestDueAndCatchUp: a store is due once the clock runs storeEvery ahead of
// the stored value; a later stored value moves the clock forward, an
// earlier one never moves it back.
func TestDueAndCatchUp(t *testing.T) {
	el := &fakeElapsed{}
	c := New(5000, el.elapsed, 10*time.Second)
	el.advance(9 * time.Second)
	now, due := c.Due()
	require.EqualValues(t, 14_000, now)
	require.False(t, due)
	el.advance(time.Second)
	now, due = c.Due()
	require.EqualValues(t, 15_000, now)
	require.True(t, due)
	require.EqualValues(t, 10_000, c.Ahead())
	c.CatchUp(15_000) // stored
	_, due = c.Due()
	require.False(t, due)
	c.CatchUp(1_000) // another process's, behind: ignored
	require.EqualValues(t, 15_000, c.Now())
	c.CatchUp(60_000) // another process's, ahead
	require.EqualValues(t, 60_000, c.Now())
	require.Zero(t, c.Ahead())
}
