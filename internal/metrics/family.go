// Package metrics defines the outbox's metrics once, as a table that reads
// a snapshot of an outbox and its relay into metric families, and writes
// families in Prometheus' text exposition format (version 0.0.4).
//
// Two things expose the table: outboxprom's Collector, which turns the
// families into client_golang metrics for an application's registry, and
// the till's outboxctl, which writes them with WriteText and so links no
// Prometheus client (its protobuf data model and package-level registry
// would be the heaviest part of the command). The families here are plain
// data so that both read the same names, help, types, labels and values.
package metrics

// Type is a metric family's type, as the exposition's # TYPE line says it.
type Type uint8

// The types the outbox's metrics use.
const (
	Counter Type = iota + 1
	Gauge
	Histogram
)

// String returns the type's name in the exposition format.
func (t Type) String() string {
	switch t {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	case Histogram:
		return "histogram"
	}
	return "untyped"
}

// Family is one metric family: its definition and, once read, its samples.
type Family struct {
	Name   string
	Help   string
	Type   Type
	Labels []string // the label names every sample has, in this order
	// Samples are the family's values: none when there is nothing to say
	// (the free space on a platform that does not tell), and then the
	// family is left out of an exposition.
	Samples []Sample
	// Err is why the family could not be read (the database failed);
	// such a family has no samples, and a Collector reports it invalid.
	Err error
}

// Sample is one value of a family: a counter's or a gauge's Value, or a
// histogram's Hist.
type Sample struct {
	LabelValues []string // one per Family.Labels
	Value       float64
	Hist        *HistogramValue
}

// HistogramValue is a histogram's state: Counts[i] observations were at
// most Bounds[i] (cumulative, as Prometheus wants them), Count in all.
type HistogramValue struct {
	Bounds []float64 // ascending, without +Inf
	Counts []uint64
	Count  uint64
	Sum    float64
}
