package harness

import (
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Decoder reads an event's id and sequence number from a message's
// payload; the outbox's tests pass one built on outbox.DecodeEvent.
type Decoder func(payload []byte) (id string, seq int64, err error)

// EventLog records what a subscriber received: every delivery, the first
// delivery of each event id in order, duplicates and decoding errors.
type EventLog struct {
	decode Decoder

	mu         sync.Mutex
	deliveries int
	seen       map[string]int64 // id -> sequence
	firstSeqs  []int64
	dups       int
	decodeErrs int
	disorder   []string // first deliveries that broke commit order
}

// NewEventLog returns an empty log that reads payloads with decode.
func NewEventLog(decode Decoder) *EventLog {
	return &EventLog{decode: decode, seen: map[string]int64{}}
}

// Add records one delivery.
func (l *EventLog) Add(payload []byte) {
	id, seq, err := l.decode(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliveries++
	if err != nil {
		l.decodeErrs++
		return
	}
	if _, ok := l.seen[id]; ok {
		l.dups++
		return
	}
	l.seen[id] = seq
	if n := len(l.firstSeqs); n > 0 && seq <= l.firstSeqs[n-1] && len(l.disorder) < 20 {
		l.disorder = append(l.disorder, fmt.Sprintf("seq %d first delivered after seq %d", seq, l.firstSeqs[n-1]))
	}
	l.firstSeqs = append(l.firstSeqs, seq)
}

// Unique is how many distinct events arrived.
func (l *EventLog) Unique() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.firstSeqs)
}

// Has says whether the event with this id arrived.
func (l *EventLog) Has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.seen[id]
	return ok
}

// Received is what an EventLog holds at one moment.
type Received struct {
	Deliveries   int              // every delivery, duplicates and undecodable ones too
	FirstSeqs    []int64          // sequence numbers in order of first delivery
	Seen         map[string]int64 // event id -> sequence
	Duplicates   int
	DecodeErrors int
	Disorder     []string // first deliveries that broke commit order (the first 20)
}

// Snapshot returns a copy of what the log holds now.
func (l *EventLog) Snapshot() Received {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Received{
		Deliveries: l.deliveries, FirstSeqs: slices.Clone(l.firstSeqs), Seen: maps.Clone(l.seen),
		Duplicates: l.dups, DecodeErrors: l.decodeErrs, Disorder: slices.Clone(l.disorder),
	}
}
