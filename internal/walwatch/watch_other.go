//go:build !linux

package walwatch

import "time"

// Subscription is a watch on a WAL; without inotify there is none, and the
// relay polls.
type Subscription struct {
	C chan struct{}
}

// Subscribe says that the WAL cannot be watched here.
func Subscribe(string) (*Subscription, error) { return nil, ErrNoWatch }

// Close does nothing.
func (s *Subscription) Close() {}

// NapTimer is Linux's (a timerfd); the relay watches no WAL here and never
// naps.
type NapTimer struct{ fired chan struct{} }

// NewNapTimer says there is none here.
func NewNapTimer() (*NapTimer, error) { return nil, ErrNoWatch }

// Arm does nothing.
func (n *NapTimer) Arm(time.Duration) {}

// Disarm does nothing.
func (n *NapTimer) Disarm() {}

// Close does nothing.
func (n *NapTimer) Close() {}

// Fired never receives.
func (n *NapTimer) Fired() <-chan struct{} { return n.fired }
