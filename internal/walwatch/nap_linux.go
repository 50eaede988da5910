//go:build linux

package walwatch

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// NapTimer fires after gaps shorter than a Go timer keeps: a Go timer
// under a millisecond waits a whole one in a process that has nothing else
// to do, since the runtime's poller sleeps in milliseconds. A timerfd read
// through the poller wakes it when it fires, and holds no thread meanwhile
// (a nanosleep does, and on a small device a process that napped so loses
// one of its few processors to the nap).
type NapTimer struct {
	f     *os.File
	fd    int
	fired chan struct{} // a value (coalesced) when an armed gap has passed
	done  chan struct{} // closed when the reader has ended
}

// NewNapTimer makes a timer and the goroutine that reads it.
func NewNapTimer() (*NapTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	n := &NapTimer{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd, fired: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(n.done)
		var b [8]byte // the count of expirations
		for {
			if _, err := n.f.Read(b[:]); err != nil {
				return // closed
			}
			select {
			case n.fired <- struct{}{}:
			default:
			}
		}
	}()
	return n, nil
}

// Arm makes Fired receive a value once d has passed (and forgets a value
// from an earlier gap).
func (n *NapTimer) Arm(d time.Duration) {
	n.Disarm()
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(d, time.Microsecond).Nanoseconds())}
	unix.TimerfdSettime(n.fd, 0, &spec, nil)
}

// Disarm stops the timer and forgets a value it left.
func (n *NapTimer) Disarm() {
	var off unix.ItimerSpec
	unix.TimerfdSettime(n.fd, 0, &off, nil)
	select {
	case <-n.fired:
	default:
	}
}

// Close ends the reader and waits for it.
func (n *NapTimer) Close() {
	n.f.Close()
	<-n.done
}

// Fired receives a value (coalesced) when an armed gap has passed.
func (n *NapTimer) Fired() <-chan struct{} { return n.fired }
