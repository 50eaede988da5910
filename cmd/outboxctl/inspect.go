package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
)

func (a *app) initCmd() *cobra.Command {
	var db dbFlags
	cmd := &cobra.Command{
		Use:   "init --db PATH [--max-pending-messages N] [--max-pending-bytes B]",
		Short: "Create or migrate the outbox schema, and set its limits",
		Long: `init creates the database file (readable by its owner only) if it does not
exist, and creates or migrates the outbox schema in it. It is idempotent.
A database whose schema is newer than this outboxctl is refused, never
downgraded.

--max-pending-messages and --max-pending-bytes set the limits stored in the
database, which every writer is held to (plain SQL included): an INSERT
beyond them fails with "outbox full: pending limit reached". 0 keeps what is
stored, a negative value removes the limit. status shows them.`,
		Example: `  outboxctl init --db /var/lib/till/till.db
  outboxctl init --db /var/lib/till/till.db --max-pending-messages 100000 --max-pending-bytes 64000000
  outboxctl init --db /var/lib/till/till.db --max-pending-bytes -1   # remove the byte limit`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, statErr := os.Stat(db.path)
			ob, err := db.open(cmd.Context(), a, create)
			if err != nil {
				return err
			}
			defer ob.Close()
			st, err := ob.Stats(cmd.Context())
			if err != nil {
				return db.explain(err)
			}
			what := "existing file"
			if errors.Is(statErr, os.ErrNotExist) {
				what = "new file"
			}
			fmt.Fprintf(a.stdout, "%s: outbox schema version %d (%s), limits: %s\n", db.path, st.SchemaVersion, what,
				limitsText(st.MaxPendingMessages, st.MaxPendingBytes))
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().Int64Var(&db.maxMessages, "max-pending-messages", 0, "pending messages at most (0 keeps the stored limit, negative removes it)")
	cmd.Flags().Int64Var(&db.maxBytes, "max-pending-bytes", 0, "pending payload bytes at most (0 keeps the stored limit, negative removes it)")
	return cmd
}

// statusJSON is the stable output of `status --json`. Times are RFC 3339 in
// UTC, or null; ages and sizes are numbers.
type statusJSON struct {
	DB                 string     `json:"db"`
	SchemaVersion      int        `json:"schema_version"`
	Pending            int64      `json:"pending"`
	PendingBytes       int64      `json:"pending_bytes"`
	OldestPendingAt    *time.Time `json:"oldest_pending_at"`
	OldestPendingAgeS  *float64   `json:"oldest_pending_age_seconds"`
	Dead               int64      `json:"dead"`
	Sent               int64      `json:"sent"`
	MaxPendingMessages int64      `json:"max_pending_messages"`
	MaxPendingBytes    int64      `json:"max_pending_bytes"`
	LeaseOwner         string     `json:"lease_owner"`
	LeaseExpiresAt     *time.Time `json:"lease_expires_at"`
	FileBytes          int64      `json:"file_bytes"`
	WALBytes           int64      `json:"wal_bytes"`
}

func (a *app) statusCmd() *cobra.Command {
	var db dbFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status --db PATH [--json]",
		Short: "Show what is in an outbox",
		Long: `status shows the pending messages (count, bytes, age of the oldest), dead
messages, sent messages still kept, the limits, the relay lease, the schema
version and the file sizes. It never writes anything: no schema is created
or migrated (a file of the previous schema version is read as it is; an
older one gets a line saying that init migrates it), no disk reserve is
written, and a database closed cleanly gets no -wal or -shm file.

--json prints one object with these keys: db, schema_version, pending,
pending_bytes, oldest_pending_at, oldest_pending_age_seconds, dead, sent,
max_pending_messages, max_pending_bytes, lease_owner, lease_expires_at,
file_bytes, wal_bytes. Times are RFC 3339 UTC or null.`,
		Example: `  outboxctl status --db /var/lib/till/till.db
  outboxctl status --db /var/lib/till/till.db --json | jq .pending`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ob, err := db.open(cmd.Context(), a, inspect)
			if err != nil {
				return err
			}
			defer ob.Close()
			st, err := ob.Stats(cmd.Context())
			if err != nil {
				return db.explain(err)
			}
			out := statusJSON{
				DB: db.path, SchemaVersion: st.SchemaVersion,
				Pending: st.Pending, PendingBytes: st.PendingBytes,
				Dead: st.Dead, Sent: st.Sent,
				MaxPendingMessages: st.MaxPendingMessages, MaxPendingBytes: st.MaxPendingBytes,
				LeaseOwner: st.LeaseOwner,
				FileBytes:  fileSize(db.path), WALBytes: fileSize(db.path + "-wal"),
			}
			if !st.OldestPending.IsZero() {
				t := st.OldestPending.UTC()
				age := time.Since(st.OldestPending).Seconds()
				out.OldestPendingAt, out.OldestPendingAgeS = &t, &age
			}
			if st.LeaseOwner != "" && !st.LeaseExpires.IsZero() {
				t := st.LeaseExpires.UTC()
				out.LeaseExpiresAt = &t
			}
			if asJSON {
				return writeJSON(a.stdout, out)
			}
			w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "database\t%s\n", out.DB)
			fmt.Fprintf(w, "schema version\t%d\n", out.SchemaVersion)
			fmt.Fprintf(w, "pending\t%d messages, %s\n", out.Pending, bytesText(out.PendingBytes))
			if out.OldestPendingAt != nil {
				fmt.Fprintf(w, "oldest pending\t%s ago (%s)\n", ageText(*out.OldestPendingAgeS), out.OldestPendingAt.Format(time.RFC3339))
			} else {
				fmt.Fprintf(w, "oldest pending\t-\n")
			}
			fmt.Fprintf(w, "dead\t%d\n", out.Dead)
			fmt.Fprintf(w, "sent (kept)\t%d\n", out.Sent)
			fmt.Fprintf(w, "limits\t%s\n", limitsText(out.MaxPendingMessages, out.MaxPendingBytes))
			if out.LeaseOwner != "" {
				fmt.Fprintf(w, "relay lease\t%s, until %s\n", out.LeaseOwner, out.LeaseExpiresAt.Format(time.RFC3339))
			} else {
				fmt.Fprintf(w, "relay lease\tfree\n")
			}
			fmt.Fprintf(w, "file\t%s (+ %s WAL)\n", bytesText(out.FileBytes), bytesText(out.WALBytes))
			return w.Flush()
		},
	}
	db.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// recordJSON is one message in the stable output of `list --json`.
type recordJSON struct {
	Seq           int64      `json:"seq"`
	ID            string     `json:"id"`
	Topic         string     `json:"topic"`
	Type          string     `json:"type"`
	ContentType   string     `json:"content_type"`
	Size          int        `json:"size"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error"`
	CreatedAt     time.Time  `json:"created_at"`
	AgeS          float64    `json:"age_seconds"`
	SentAt        *time.Time `json:"sent_at"`
	DeadAt        *time.Time `json:"dead_at"`
	PayloadBase64 *string    `json:"payload_base64,omitempty"`
}

func (a *app) listCmd() *cobra.Command {
	var db dbFlags
	var state string
	var limit int
	var after int64
	var asJSON, payload bool
	cmd := &cobra.Command{
		Use:   "list --db PATH [--state pending|dead|sent] [--limit N] [--json]",
		Short: "List messages in an outbox",
		Long: `list prints messages in sequence order: sequence number, id, topic, type,
size, age, attempts and last error. Payloads are shown only with --payload.
Like status, it never writes anything.

--json prints an array of objects with these keys: seq, id, topic, type,
content_type, size, state, attempts, last_error, created_at, age_seconds,
sent_at, dead_at, and payload_base64 with --payload.`,
		Example: `  outboxctl list --db till.db
  outboxctl list --db till.db --state dead --json
  outboxctl list --db till.db --after 1500 --limit 50 --payload`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st := outbox.State(state)
			if st != outbox.StatePending && st != outbox.StateDead && st != outbox.StateSent {
				return usageError{fmt.Errorf("--state %q: want pending, dead or sent", state)}
			}
			if limit < 1 {
				return usageError{fmt.Errorf("--limit %d: want at least 1", limit)}
			}
			ob, err := db.open(cmd.Context(), a, inspect)
			if err != nil {
				return err
			}
			defer ob.Close()
			recs, err := ob.List(cmd.Context(), outbox.ListOptions{State: st, Limit: limit, AfterSeq: after, WithPayload: payload})
			if err != nil {
				return db.explain(err)
			}
			now := time.Now()
			out := make([]recordJSON, 0, len(recs))
			for _, r := range recs {
				j := recordJSON{
					Seq: r.Seq, ID: r.ID, Topic: r.Topic, Type: r.Type, ContentType: r.ContentType,
					Size: r.Size, State: string(r.State), Attempts: r.Attempts, LastError: r.LastError,
					CreatedAt: r.CreatedAt.UTC(), AgeS: now.Sub(r.CreatedAt).Seconds(),
					SentAt: timeOrNil(r.SentAt), DeadAt: timeOrNil(r.DeadAt),
				}
				if payload {
					p := base64.StdEncoding.EncodeToString(r.Payload)
					j.PayloadBase64 = &p
				}
				out = append(out, j)
			}
			if asJSON {
				return writeJSON(a.stdout, out)
			}
			w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			header := "SEQ\tID\tTOPIC\tTYPE\tSIZE\tAGE\tATTEMPTS\tLAST ERROR"
			if payload {
				header += "\tPAYLOAD"
			}
			fmt.Fprintln(w, header)
			for i, r := range out {
				line := fmt.Sprintf("%d\t%s\t%s\t%s\t%d\t%s\t%d\t%s", r.Seq, r.ID, r.Topic, orDash(r.Type), r.Size, ageText(r.AgeS), r.Attempts, orDash(r.LastError))
				if payload {
					line += "\t" + fmt.Sprintf("%q", recs[i].Payload)
				}
				fmt.Fprintln(w, line)
			}
			return w.Flush()
		},
	}
	db.register(cmd)
	cmd.Flags().StringVar(&state, "state", "pending", "pending, dead or sent")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many messages")
	cmd.Flags().Int64Var(&after, "after", 0, "only messages with a larger sequence number (for paging)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&payload, "payload", false, "include payloads (they may hold personal or payment data)")
	return cmd
}

func (a *app) requeueCmd() *cobra.Command {
	var db dbFlags
	var ids []string
	var allDead bool
	cmd := &cobra.Command{
		Use:   "requeue --db PATH (--id ID... | --all-dead)",
		Short: "Make dead messages pending again",
		Long: `requeue makes dead messages pending again, with their attempts reset; the
relay publishes them on its next pass. Every --id must name a dead message,
or nothing is changed.`,
		Example: `  outboxctl requeue --db till.db --id 019ad2f4-5c1e-7a3b-9f00-3c5e8d1b2a47
  outboxctl requeue --db till.db --all-dead`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (len(ids) == 0) == !allDead {
				return usageError{errors.New("give either --id (one or more) or --all-dead")}
			}
			ob, err := db.open(cmd.Context(), a, existing)
			if err != nil {
				return err
			}
			defer ob.Close()
			var n int64
			if allDead {
				n, err = ob.RequeueDead(cmd.Context())
			} else {
				for _, id := range ids {
					r, err := ob.Get(cmd.Context(), id)
					if err != nil {
						return db.explain(err)
					}
					if r.State != outbox.StateDead {
						return fmt.Errorf("message %s is %s, not dead; nothing requeued", id, r.State)
					}
				}
				n, err = ob.Requeue(cmd.Context(), ids...)
			}
			if err != nil {
				return db.explain(err)
			}
			fmt.Fprintf(a.stdout, "requeued %d message(s)\n", n)
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().StringSliceVar(&ids, "id", nil, "id of a dead message (repeat or comma-separate)")
	cmd.Flags().BoolVar(&allDead, "all-dead", false, "requeue every dead message")
	return cmd
}

func (a *app) purgeCmd() *cobra.Command {
	var db dbFlags
	var sentBefore time.Duration
	var dead bool
	cmd := &cobra.Command{
		Use:   "purge --db PATH (--sent-before DURATION | --dead)",
		Short: "Delete sent or dead messages",
		Long: `purge deletes sent messages acknowledged more than DURATION ago (the relay
does this by itself after its retention period), or every dead message.
Pending messages are never deleted. Deletes run in bounded batches so that
writers are not held up.`,
		Example: `  outboxctl purge --db till.db --sent-before 24h
  outboxctl purge --db till.db --dead`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			given := cmd.Flags().Changed("sent-before")
			if given == dead {
				return usageError{errors.New("give either --sent-before DURATION or --dead")}
			}
			if given && sentBefore < 0 {
				return usageError{fmt.Errorf("--sent-before %s: want a duration of zero or more", sentBefore)}
			}
			ob, err := db.open(cmd.Context(), a, existing)
			if err != nil {
				return err
			}
			defer ob.Close()
			var n int64
			if dead {
				n, err = ob.PurgeDead(cmd.Context())
			} else {
				n, err = ob.PurgeSent(cmd.Context(), time.Now().Add(-sentBefore))
			}
			if err != nil {
				return db.explain(err)
			}
			fmt.Fprintf(a.stdout, "deleted %d message(s)\n", n)
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().DurationVar(&sentBefore, "sent-before", 0, "delete sent messages acknowledged longer ago than this (e.g. 24h)")
	cmd.Flags().BoolVar(&dead, "dead", false, "delete every dead message")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func ageText(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < 0:
		return "in the future (clock changed)"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func limitsText(count, bytes int64) string {
	if count == 0 && bytes == 0 {
		return "none"
	}
	s := ""
	if count > 0 {
		s = fmt.Sprintf("%d messages", count)
	}
	if bytes > 0 {
		if s != "" {
			s += ", "
		}
		s += bytesText(bytes)
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
