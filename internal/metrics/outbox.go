package metrics

import (
	"strconv"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox"
)

// Snapshot is what one reading of the outbox's metrics is made of. The
// reader fills it (internal/monitor does, at each scrape) and Outbox turns
// it into families; nothing here reads the database.
type Snapshot struct {
	Now       time.Time // the exporter's wall clock, for the oldest message's age
	Gauges    outbox.Gauges
	GaugesErr error // Outbox.Gauges failed: its families are invalid
	// ScannedPendingBytes is the last background count of the pending
	// bytes (Outbox.Stats), used while Gauges does not know them.
	ScannedPendingBytes int64
	Relay               *outbox.RelayMetrics // nil: no relay in this process
	Version             string
}

// def defines one of the outbox's metric families and how its samples are
// read from a snapshot.
type def struct {
	name, help string
	typ        Type
	labels     []string
	relay      bool // only with a relay
	gauges     bool // read from Snapshot.Gauges: invalid when they failed
	read       func(s *Snapshot) []Sample
}

// defs are the outbox's metrics. Names follow Prometheus' conventions:
// base units, _total for counters.
var defs = [...]def{
	{name: "outbox_pending_messages", typ: Gauge, gauges: true,
		help: "Messages waiting to be published. Exact with a message limit set (maintained counters); without one, numbers left above the relay's mark by a requeue or a hand-deleted row count until the relay passes them.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Gauges.Pending)) }},
	{name: "outbox_pending_bytes", typ: Gauge, gauges: true,
		help: "Payload bytes of the pending messages. Read at each scrape while a byte limit is set; otherwise counted in the background every refresh interval (default 30 s), so it lags by up to that.",
		read: func(s *Snapshot) []Sample {
			if !s.Gauges.PendingBytesKnown {
				return one(float64(s.ScannedPendingBytes))
			}
			return one(float64(s.Gauges.PendingBytes))
		}},
	{name: "outbox_oldest_pending_age_seconds", typ: Gauge, gauges: true,
		help: "Age of the oldest pending message, from its created_at (the writer's wall clock) to the exporter's wall clock; 0 when nothing is pending.",
		read: func(s *Snapshot) []Sample {
			if s.Gauges.OldestPending.IsZero() {
				return one(0)
			}
			return one(max(s.Now.Sub(s.Gauges.OldestPending).Seconds(), 0))
		}},
	{name: "outbox_priority_pending_messages", typ: Gauge, gauges: true, labels: []string{"priority"},
		help: "Messages waiting to be published, by priority (0 to 9, the higher first), for each priority that has any. Those above 0 are counted exactly; priority 0's is outbox_pending_messages less theirs, as exact as that.",
		read: func(s *Snapshot) []Sample {
			return byPriority(s.Gauges.Priorities, func(p outbox.PriorityStats) float64 { return float64(p.Pending) })
		}},
	{name: "outbox_priority_oldest_pending_age_seconds", typ: Gauge, gauges: true, labels: []string{"priority"},
		help: "Age of the first pending message in line of each priority that has any, from its created_at (the writer's wall clock) to the exporter's wall clock.",
		read: func(s *Snapshot) []Sample {
			return byPriority(s.Gauges.Priorities, func(p outbox.PriorityStats) float64 { return max(s.Now.Sub(p.OldestPending).Seconds(), 0) })
		}},
	{name: "outbox_commands", typ: Gauge, gauges: true, labels: []string{"state"},
		help: "Commands received from the backend (the outbox_command table), by state: waiting (not yet applied, expired nor failed), applied, expired (stale, never applied), failed (the handler failed them too often) and malformed (not a valid command); done ones until deleted after CommandOptions.Keep.",
		read: func(s *Snapshot) []Sample {
			c := s.Gauges.Commands
			return []Sample{
				{LabelValues: []string{"waiting"}, Value: float64(c.Waiting)},
				{LabelValues: []string{"applied"}, Value: float64(c.Applied)},
				{LabelValues: []string{"expired"}, Value: float64(c.Expired)},
				{LabelValues: []string{"failed"}, Value: float64(c.Failed)},
				{LabelValues: []string{"malformed"}, Value: float64(c.Malformed)},
			}
		}},
	{name: "outbox_dead_messages", typ: Gauge, gauges: true,
		help: "Messages parked as dead, until requeued or purged.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Gauges.Dead)) }},
	{name: "outbox_database_bytes", typ: Gauge, gauges: true,
		help: "Size of the SQLite database file.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Gauges.DatabaseBytes)) }},
	{name: "outbox_wal_bytes", typ: Gauge, gauges: true,
		help: "Size of the SQLite write-ahead log (the -wal file).",
		read: func(s *Snapshot) []Sample { return one(float64(s.Gauges.WALBytes)) }},
	{name: "outbox_filesystem_free_bytes", typ: Gauge, gauges: true,
		help: "Space left to this user on the file system holding the database.",
		read: func(s *Snapshot) []Sample {
			if !s.Gauges.FreeBytesKnown {
				return nil
			}
			return one(float64(s.Gauges.FreeBytes))
		}},
	{name: "outbox_info", typ: Gauge, labels: []string{"protocol", "source", "version"},
		help: "Always 1: the outbox's version, the relay's CloudEvents source and the protocol its connection speaks (MQTT 5, MQTT 3.1.1, NATS JetStream; empty until it connected).",
		read: func(s *Snapshot) []Sample {
			var protocol, source string
			if s.Relay != nil {
				protocol, source = ProtocolName(s.Relay.Protocol), s.Relay.Source
			}
			return []Sample{{LabelValues: labelValues(protocol, source, s.Version), Value: 1}}
		}},

	{name: "outbox_published_total", typ: Counter, relay: true,
		help: "Messages the broker acknowledged, since the relay was created.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Relay.Published)) }},
	{name: "outbox_no_subscribers_total", typ: Counter, relay: true,
		help: "Messages the broker acknowledged saying that no subscription matched their topic (MQTT 5 PUBACK 0x10), in outbox_published_total too: they reached nobody unless a persistent session held them. The status page and the log name the topics.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Relay.NoSubscribers)) }},
	{name: "outbox_dead_lettered_total", typ: Counter, relay: true,
		help: "Messages the relay parked as dead, since it was created.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Relay.DeadLettered)) }},
	{name: "outbox_attempts_charged_total", typ: Counter, relay: true,
		help: "Failed attempts charged against messages (each adds one to a row's attempts; outages never count).",
		read: func(s *Snapshot) []Sample { return one(float64(s.Relay.AttemptsCharged)) }},
	{name: "outbox_connected", typ: Gauge, relay: true,
		help: "1 while the relay has a connection to the broker, else 0.",
		read: func(s *Snapshot) []Sample { return one(b2f(s.Relay.Connected)) }},
	{name: "outbox_connection_attempts_total", typ: Counter, relay: true,
		help: "Connection attempts to the broker, successful ones included.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Relay.ConnectionAttempts)) }},
	{name: "outbox_disconnected_seconds_total", typ: Counter, relay: true,
		help: "Time the running relay spent without a connection to the broker (the current outage included; the wait for the lease not).",
		read: func(s *Snapshot) []Sample { return one(s.Relay.Disconnected.Seconds()) }},
	{name: "outbox_in_flight_messages", typ: Gauge, relay: true,
		help: "Messages published and awaiting their acknowledgement or their mark.",
		read: func(s *Snapshot) []Sample { return one(float64(s.Relay.InFlight)) }},
	{name: "outbox_lease_held", typ: Gauge, relay: true,
		help: "1 while this relay holds the relay lease (it is the one draining this database), else 0.",
		read: func(s *Snapshot) []Sample { return one(b2f(s.Relay.HoldsLease)) }},
	{name: "outbox_last_write_ok", typ: Gauge, relay: true,
		help: "1 if the relay's last database write (a mark, a lease renewal) succeeded, else 0.",
		read: func(s *Snapshot) []Sample { return one(b2f(s.Relay.LastWriteOK)) }},
	{name: "outbox_broker_unavailable_seconds", typ: Gauge, relay: true,
		help: "How long the broker has said it cannot take messages for a reason of its own (busy, quota exceeded, shutting down…; nothing is charged meanwhile), until a message is acknowledged; 0 while it does not say so. The status page says what it says.",
		read: func(s *Snapshot) []Sample {
			if s.Relay.BrokerUnavailable == "" {
				return one(0)
			}
			return one(max(s.Now.Sub(s.Relay.BrokerUnavailableSince).Seconds(), 0))
		}},
	{name: "outbox_publish_ack_seconds", typ: Histogram, relay: true,
		help: "Time from handing a message to the MQTT client to its PUBACK, by the monotonic clock.",
		read: func(s *Snapshot) []Sample { return histogram(s.Relay.PublishAck) }},
	{name: "outbox_commit_ack_seconds", typ: Histogram, relay: true,
		help: "Time from a message's commit to its PUBACK, outages included: the row's created_at (the writer's wall clock) to the relay's wall clock at the PUBACK. A clock jump between the two shifts it by the jump; what would be negative counts as 0.",
		read: func(s *Snapshot) []Sample { return histogram(s.Relay.CommitAck) }},
}

// Definitions returns the outbox's metric families without samples: those
// of an outbox, and with relay those of its relay too.
func Definitions(relay bool) []Family {
	var out []Family
	for i := range defs {
		if d := &defs[i]; relay || !d.relay {
			out = append(out, Family{Name: d.name, Help: d.help, Type: d.typ, Labels: d.labels})
		}
	}
	return out
}

// Outbox reads the outbox's metric families from s: the same families as
// Definitions(s.Relay != nil), in the same order.
func Outbox(s Snapshot) []Family {
	out := Definitions(s.Relay != nil)
	i := 0
	for j := range defs {
		d := &defs[j]
		if d.relay && s.Relay == nil {
			continue
		}
		if d.gauges && s.GaugesErr != nil {
			out[i].Err = s.GaugesErr
		} else {
			out[i].Samples = d.read(&s)
		}
		i++
	}
	return out
}

func one(v float64) []Sample { return []Sample{{Value: v}} }

// byPriority is one sample per priority, labelled with it.
func byPriority(ps []outbox.PriorityStats, value func(outbox.PriorityStats) float64) []Sample {
	out := make([]Sample, 0, len(ps))
	for _, p := range ps {
		out = append(out, Sample{LabelValues: []string{strconv.Itoa(p.Priority)}, Value: value(p)})
	}
	return out
}

func histogram(h outbox.Histogram) []Sample {
	return []Sample{{Hist: &HistogramValue{Bounds: outbox.HistogramBounds(), Counts: h.Counts[:], Count: h.Count, Sum: h.Sum}}}
}

// labelValues makes label values valid UTF-8, as the exposition requires
// (a source or a version comes from configuration).
func labelValues(vs ...string) []string {
	for i, v := range vs {
		vs[i] = strings.ToValidUTF8(v, "\uFFFD")
	}
	return vs
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
