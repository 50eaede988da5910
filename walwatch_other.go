//go:build !linux

package outbox

// walSubscription is a watch on a WAL; without inotify there is none, and
// the relay polls.
type walSubscription struct {
	C chan struct{}
}

func watchWAL(string) (*walSubscription, error) { return nil, errNoWALWatch }

// Close does nothing.
func (s *walSubscription) Close() {}
