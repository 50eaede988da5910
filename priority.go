package outbox

import (
	"strconv"
	"strings"
)

// Priorities: a message's priority (0 to MaxPriority, higher first) and the
// SQL that says, for a row, what its priority's mark is and whether it is
// pending (schema/outbox.sql). Every statement that tests "sent" or
// "pending" in Go builds it from these, so that the model has one text.

// MaxPriority is the highest Message.Priority: priorities run from 0 (the
// default) to MaxPriority, higher first.
const MaxPriority = 9

// markOfSQL is the SQL of the mark of priority prio (an SQL expression) in
// st, the outbox_state row: CASE prio WHEN 0 THEN st.sent_seq_0 ... END.
func markOfSQL(prio, st string) string {
	var b strings.Builder
	b.WriteString("CASE ")
	b.WriteString(prio)
	for p := 0; p <= MaxPriority; p++ {
		b.WriteString(" WHEN " + strconv.Itoa(p) + " THEN " + st + ".sent_seq_" + strconv.Itoa(p))
	}
	b.WriteString(" END")
	return b.String()
}

// pendingSQL is the SQL condition that the outbox row o is pending, given
// st, the outbox_state row: not dead, above the common mark and above its
// priority's.
func pendingSQL(o, st string) string {
	return "(" + o + ".dead_at IS NULL AND " + o + ".seq > " + st + ".sent_seq AND " +
		o + ".seq > " + markOfSQL(o+".priority", st) + ")"
}

// liveOfSQL is the SQL condition that a row is live (not dead) and of
// priority p, in the terms that let SQLite seek the outbox_priority index
// for a priority above 0.
func liveOfSQL(p int) string {
	if p == 0 {
		return `priority = 0 AND dead_at IS NULL`
	}
	return `priority = ` + strconv.Itoa(p) + ` AND priority > 0 AND dead_at IS NULL`
}
