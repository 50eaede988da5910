package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/edgeoutbox/outbox/internal/cli"
)

// commandJSON is one command in the stable output of `list --commands
// --json`. A command's data is never shown: it may hold prices, names or
// payment details, and a technician needs its state, not its content.
type commandJSON struct {
	Seq           int64      `json:"seq"`
	ID            string     `json:"id"`
	Source        string     `json:"source"`
	Topic         string     `json:"topic"`
	Type          string     `json:"type"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	Reason        string     `json:"reason"`
	ResponseTopic *string    `json:"response_topic"`
	ReceivedAt    time.Time  `json:"received_at"`
	AgeS          float64    `json:"age_seconds"`
	DoneAt        *time.Time `json:"done_at"`
}

// commandStates are the states --state takes with --commands: the
// table's, and "waiting" for "received", the word status uses.
var commandStates = map[string]string{
	"waiting": "received", "received": "received", "applied": "applied",
	"expired": "expired", "failed": "failed", "malformed": "malformed",
}

// listCommands prints the commands in outbox_command in arrival order,
// those in state (the table's word; empty: all), after the sequence
// number after, at most limit. It reads the table through the SQL
// contract (docs/commands.md), so it shows what any writer put there; a
// file of a schema before commands has none.
func listCommands(ctx context.Context, a *cli.App, db *sql.DB, state string, after int64, limit int, asJSON bool) error {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'outbox_command'`).Scan(&n); err != nil {
		return fmt.Errorf("list commands: %w", err)
	}
	out := []commandJSON{}
	if n > 0 {
		var err error
		if out, err = readCommands(ctx, db, state, after, limit); err != nil {
			return err
		}
	}
	if asJSON {
		return writeJSON(a.Stdout, out)
	}
	w := tabwriter.NewWriter(a.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SEQ\tID\tTOPIC\tSTATE\tATTEMPTS\tREASON\tRECEIVED")
	for _, c := range out {
		state := c.State
		if state == "received" {
			state = "waiting" // status's word
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s ago\n", c.Seq, shown(c.ID), shown(c.Topic), shown(state), c.Attempts,
			orDash(shown(c.Reason)), ageText(c.AgeS))
	}
	return w.Flush()
}

func readCommands(ctx context.Context, db *sql.DB, state string, after int64, limit int) ([]commandJSON, error) {
	where := `seq > ?`
	args := []any{after}
	if state != "" {
		where += ` AND state = ?`
		args = append(args, state)
	}
	rows, err := db.QueryContext(ctx, `SELECT seq, id, source, topic, type, state, attempts, coalesce(reason, ''), response_topic,
		received_at, done_at FROM outbox_command WHERE `+where+` ORDER BY seq LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	defer rows.Close()
	now := time.Now()
	out := []commandJSON{}
	for rows.Next() {
		var c commandJSON
		var response sql.NullString
		var received int64
		var done sql.NullInt64
		if err := rows.Scan(&c.Seq, &c.ID, &c.Source, &c.Topic, &c.Type, &c.State, &c.Attempts, &c.Reason, &response,
			&received, &done); err != nil {
			return nil, fmt.Errorf("list commands: %w", err)
		}
		c.ReceivedAt = time.UnixMilli(received).UTC()
		c.AgeS = now.Sub(c.ReceivedAt).Seconds()
		if response.Valid {
			c.ResponseTopic = &response.String
		}
		if done.Valid {
			t := time.UnixMilli(done.Int64).UTC()
			c.DoneAt = &t
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	return out, nil
}

// shown makes a string from the broker or from a handler's error fit for a
// terminal's table: control characters (an escape sequence, a tab or a
// newline that would break the columns) become U+FFFD.
func shown(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return unicode.ReplacementChar
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
