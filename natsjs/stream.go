package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamSpec is a stream for the Publisher to create at Connect when no
// stream of its name exists (Options.CreateStream). Streams are the
// operator's, and a till usually has no right to create one, so this is
// off unless asked. A stream of that name that exists is used as it is,
// whatever its settings: it is never updated.
//
// What it creates: file storage; limits retention (what is stored stays
// until a limit or the operator removes it, whoever consumes it); and
// discard new, so that a full stream refuses new messages, which the
// Publisher reports as an outage: the events stay pending on the till and
// go once there is room, instead of the stream silently dropping its
// oldest.
type StreamSpec struct {
	// Name is the stream's name. Required.
	Name string
	// Subjects are the subjects it captures, e.g. "pos.>" for the topics
	// pos/…. Required: a fleet's streams must not overlap (NATS refuses
	// a stream whose subjects do), and only the fleet knows its
	// subject space, so none is derived from a till's topics.
	Subjects []string
	// Replicas is how many nodes of a cluster hold the stream: 1 (the
	// default) or 3, say, for one that survives the loss of a node.
	Replicas int
	// Duplicates is the duplicate window: a message whose Nats-Msg-Id
	// (the event id) the stream stored within it is not stored again.
	// Exactly once into the stream holds only for re-sends within it (a
	// relay restarting after a crash); past it, a re-sent event is stored
	// again, and the consumer's Inbox drops it. 0 means 2 minutes, NATS's
	// default, or MaxAge if that is shorter (NATS allows no longer).
	Duplicates time.Duration
	// MaxMsgs, MaxBytes and MaxAge bound the stream; 0 means no bound
	// but the account's. Past MaxMsgs or MaxBytes new messages are
	// refused (see above); messages older than MaxAge are removed, which
	// makes room.
	MaxMsgs  int64
	MaxBytes int64
	MaxAge   time.Duration
	// Logger, if set, hears whether Connect created the stream or found
	// one of its name, which it then uses as it is.
	Logger *slog.Logger
}

// defaultDuplicates is NATS's own duplicate window.
const defaultDuplicates = 2 * time.Minute

// config is the stream s asks for, checked.
func (s StreamSpec) config() (jetstream.StreamConfig, error) {
	c := jetstream.StreamConfig{
		Name:       s.Name,
		Subjects:   s.Subjects,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardNew,
		Storage:    jetstream.FileStorage,
		Replicas:   s.Replicas,
		Duplicates: s.Duplicates,
		MaxMsgs:    s.MaxMsgs,
		MaxBytes:   s.MaxBytes,
		MaxAge:     s.MaxAge,
	}
	switch {
	case s.Name == "":
		return c, errors.New("natsjs: CreateStream: no stream name")
	case strings.ContainsAny(s.Name, ".*> \t\r\n/\\"):
		// NATS refuses these in a name: said once, not at every Connect.
		return c, fmt.Errorf("natsjs: CreateStream %q: a character NATS does not allow in a stream name", s.Name)
	case len(s.Subjects) == 0:
		return c, fmt.Errorf("natsjs: CreateStream %q: no subjects", s.Name)
	case s.Replicas < 0 || s.Replicas > 5:
		return c, fmt.Errorf("natsjs: CreateStream %q: %d replicas, want 1 to 5", s.Name, s.Replicas)
	case s.Duplicates < 0 || s.MaxMsgs < 0 || s.MaxBytes < 0 || s.MaxAge < 0:
		return c, fmt.Errorf("natsjs: CreateStream %q: a negative limit", s.Name)
	case s.MaxAge > 0 && s.Duplicates > s.MaxAge:
		return c, fmt.Errorf("natsjs: CreateStream %q: a duplicate window (%s) longer than MaxAge (%s)", s.Name, s.Duplicates, s.MaxAge)
	}
	for _, sub := range s.Subjects {
		if sub == "" {
			return c, fmt.Errorf("natsjs: CreateStream %q: an empty subject", s.Name)
		}
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Duplicates == 0 {
		c.Duplicates = defaultDuplicates
		if s.MaxAge > 0 {
			c.Duplicates = min(c.Duplicates, s.MaxAge)
		}
	}
	return c, nil
}

// streamMaker creates a StreamSpec's stream at Connect.
type streamMaker struct {
	cfg    jetstream.StreamConfig
	logger *slog.Logger
	found  atomic.Bool // said once that the stream exists
}

func newStreamMaker(s StreamSpec) (*streamMaker, error) {
	cfg, err := s.config()
	if err != nil {
		return nil, err
	}
	m := &streamMaker{cfg: cfg, logger: s.Logger}
	if m.logger == nil {
		m.logger = slog.New(slog.DiscardHandler)
	}
	return m, nil
}

// ensure creates the stream unless one of its name exists, which it leaves
// as it is.
func (m *streamMaker) ensure(ctx context.Context, js jetstream.JetStream) error {
	name := m.cfg.Name
	_, err := js.Stream(ctx, name)
	if err == nil {
		if !m.found.Swap(true) {
			m.logger.Info("natsjs: the stream exists: used as it is, not updated", "stream", name)
		}
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("natsjs: stream %q: %w", name, err)
	}
	_, err = js.CreateStream(ctx, m.cfg)
	switch {
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		// Another relay created it meanwhile: it is that one's.
		m.logger.Info("natsjs: the stream was created meanwhile by another: used as it is", "stream", name)
	case err != nil:
		return fmt.Errorf("natsjs: create stream %q: %w", name, err)
	default:
		m.logger.Info("natsjs: created the stream", "stream", name, "subjects", m.cfg.Subjects, "replicas", m.cfg.Replicas,
			"max_msgs", m.cfg.MaxMsgs, "max_bytes", m.cfg.MaxBytes, "max_age", m.cfg.MaxAge, "duplicate_window", m.cfg.Duplicates)
	}
	return nil
}
