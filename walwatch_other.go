//go:build !linux

package outbox

import "time"

// walSubscription is a watch on a WAL; without inotify there is none, and
// the relay polls.
type walSubscription struct {
	C chan struct{}
}

func watchWAL(string) (*walSubscription, error) { return nil, errNoWALWatch }

// Close does nothing.
func (s *walSubscription) Close() {}

// napTimer is Linux's (a timerfd); the relay watches no WAL here and
// never naps.
type napTimer struct{ fired chan struct{} }

func newNapTimer() (*napTimer, error) { return nil, errNoWALWatch }
func (n *napTimer) arm(time.Duration) {}
func (n *napTimer) disarm()           {}
func (n *napTimer) close()            {}
