package outbox

import (
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/edgeoutbox/outbox/internal/wait"
)

// Backoff is an exponential backoff with jitter that never gives up: each
// wait is Initial × Multiplier^n spread by ±Jitter (a fraction), so that a
// fleet of devices does not reconnect in lockstep, and never more than Max.
// The zero value uses the defaults given on each field.
type Backoff struct {
	Initial    time.Duration // first wait; default 500 ms
	Max        time.Duration // cap on one wait; default 30 s
	Multiplier float64       // default 2
	Jitter     float64       // 0..1; default 0.5. Negative means none.
}

func (b Backoff) withDefaults() Backoff { return Backoff(wait.Backoff(b).WithDefaults()) }

// newBackOff returns a fresh sequence of waits for this policy. The elapsed
// time limit is off: an outage of any length is waited out.
func (b Backoff) newBackOff() *backoff.ExponentialBackOff { return wait.Backoff(b).Sequence() }

// RetryPolicy decides what becomes of a message after a failed attempt
// that counts against it: one the broker refused for itself (a Token error
// wrapping ErrRejected), one that no connection can carry, or one the
// isolation rule blames because the connection it went out alone on failed
// too. Outages never reach it: a message is never charged for them.
//
// RelayOptions.Retry is the relay's; DefaultRetryPolicy is the default.
type RetryPolicy interface {
	// Decide is asked once the attempt has been recorded against the
	// message (its row's attempts count it).
	Decide(f Failure) Decision
}

// Failure is one failed attempt of one message, as a RetryPolicy sees it.
type Failure struct {
	// Attempts counts the failed attempts recorded against the message,
	// this one included.
	Attempts int
	// Err says why. It wraps ErrRejected when the broker or the relay
	// refused the message, and ErrUndeliverable too when retrying cannot
	// deliver it (a policy that does not park such a message holds back
	// every message behind it, for good).
	Err error
}

// Decision is what a RetryPolicy decided for a message.
type Decision struct {
	// Dead parks the message as dead: kept, listed, requeueable, and the
	// messages behind it flow on.
	Dead bool
	// RetryAfter is the least wait before the message goes again, alone
	// and first; the messages behind it wait too, so that order holds.
	RetryAfter time.Duration
}

// DefaultRetryPolicy parks a message that retrying cannot deliver at once,
// and any other once it has failed MaxAttempts times; until then it is
// retried after Backoff's wait for that attempt. The zero value uses the
// defaults given on each field.
type DefaultRetryPolicy struct {
	// Backoff is the wait before each retry, growing with the attempts.
	// Defaults: 1 s initial, 1 min cap.
	Backoff Backoff
	// MaxAttempts is how many failed attempts park a message. Default 5.
	MaxAttempts int
}

// Decide parks the message when it is undeliverable or has failed
// MaxAttempts times, and otherwise asks for the backoff's wait.
func (p DefaultRetryPolicy) Decide(f Failure) Decision {
	maxAttempts := p.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = 5
	}
	if errors.Is(f.Err, ErrUndeliverable) || f.Attempts >= maxAttempts {
		return Decision{Dead: true}
	}
	b := p.Backoff
	if b == (Backoff{}) {
		b = Backoff{Initial: time.Second, Max: time.Minute}
	}
	return Decision{RetryAfter: retryDelay(b, f.Attempts)}
}

// retryDelay is the wait before attempt n+1 of a message that failed n
// times: Initial × Multiplier^(n-1), at most Max, without jitter.
func retryDelay(b Backoff, attempts int) time.Duration {
	b = b.withDefaults()
	d := float64(b.Initial)
	for i := 1; i < attempts && d < float64(b.Max); i++ {
		d *= b.Multiplier
	}
	return min(time.Duration(d), b.Max)
}
