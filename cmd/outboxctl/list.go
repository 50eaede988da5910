package main

import (
	"encoding/base64"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
)

// recordJSON is one message in the stable output of `list --json`.
type recordJSON struct {
	Seq           int64      `json:"seq"`
	Priority      int        `json:"priority"`
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

func listCmd(a *cli.App) *cobra.Command {
	var db dbFlags
	var state string
	var limit int
	var after int64
	var priority int
	var asJSON, payload, commands bool
	cmd := &cobra.Command{
		Use:   "list --db PATH [--commands] [--state STATE] [--priority P] [--limit N] [--json]",
		Short: "List messages in an outbox, or the commands received",
		Long: `list prints messages in sequence order (those in --state: pending, dead,
expired or sent; pending when not given): sequence number, priority, id,
topic, type, size, age, attempts and last error; --priority P only those of
priority P (0 to 9). Payloads are shown only with --payload. Like status, it
never writes anything.

--json prints an array of objects with these keys: seq, priority, id, topic, type,
content_type, size, state, attempts, last_error, created_at, age_seconds,
sent_at, dead_at (for a dead or expired message: when it was parked), and
payload_base64 with --payload.

--commands lists the commands received from the backend instead, in
arrival order, all of them unless --state says which (waiting, applied,
expired, failed, malformed): sequence number, id, topic, state, attempts,
reason (why it expired, failed or is malformed, or why it waits) and when it
was received. A command's data is never shown. With --json, an array of
objects with these keys: seq, id, source, topic, type, state (waiting is
"received" there, as in the table), attempts, reason, response_topic (null:
no answer is sent), received_at, age_seconds, done_at.`,
		Example: `  outboxctl list --db till.db
  outboxctl list --db till.db --state dead --json
  outboxctl list --db till.db --state expired
  outboxctl list --db till.db --priority 9
  outboxctl list --db till.db --after 1500 --limit 50 --payload
  outboxctl list --db till.db --commands --state failed`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if commands {
				return listCommandsCmd(cmd, a, &db, state, after, limit, asJSON, payload)
			}
			st := outbox.State(state)
			if st != outbox.StatePending && st != outbox.StateDead && st != outbox.StateExpired && st != outbox.StateSent {
				return cli.Usagef("--state %q: want pending, dead, expired or sent", state)
			}
			if limit < 1 {
				return cli.Usagef("--limit %d: want at least 1", limit)
			}
			opts := outbox.ListOptions{State: st, Limit: limit, AfterSeq: after, WithPayload: payload}
			if cmd.Flags().Changed("priority") {
				if priority < 0 || priority > outbox.MaxPriority {
					return cli.Usagef("--priority %d: want 0 to %d", priority, outbox.MaxPriority)
				}
				opts.Priority = &priority
			}
			ob, err := db.open(cmd.Context(), a, inspect)
			if err != nil {
				return err
			}
			defer ob.Close()
			recs, err := ob.List(cmd.Context(), opts)
			if err != nil {
				return db.explain(err)
			}
			now := time.Now()
			out := make([]recordJSON, 0, len(recs))
			for _, r := range recs {
				j := recordJSON{
					Seq: r.Seq, Priority: r.Priority, ID: r.ID, Topic: r.Topic, Type: r.Type, ContentType: r.ContentType,
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
				return writeJSON(a.Stdout, out)
			}
			w := tabwriter.NewWriter(a.Stdout, 0, 0, 2, ' ', 0)
			header := "SEQ\tPRIORITY\tID\tTOPIC\tTYPE\tSIZE\tAGE\tATTEMPTS\tLAST ERROR"
			if payload {
				header += "\tPAYLOAD"
			}
			fmt.Fprintln(w, header)
			for i, r := range out {
				line := fmt.Sprintf("%d\t%d\t%s\t%s\t%s\t%d\t%s\t%d\t%s", r.Seq, r.Priority, r.ID, r.Topic, orDash(r.Type), r.Size, ageText(r.AgeS), r.Attempts, orDash(r.LastError))
				if payload {
					line += "\t" + fmt.Sprintf("%q", recs[i].Payload)
				}
				fmt.Fprintln(w, line)
			}
			return w.Flush()
		},
	}
	db.register(cmd)
	cmd.Flags().StringVar(&state, "state", "pending", "pending, dead, expired or sent; with --commands waiting, applied, expired, failed or malformed (all when not given)")
	cmd.Flags().IntVar(&priority, "priority", 0, "only messages of this priority (0 to 9); all when not given")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many messages")
	cmd.Flags().Int64Var(&after, "after", 0, "only messages with a larger sequence number (for paging)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&payload, "payload", false, "include payloads (they may hold personal or payment data)")
	cmd.Flags().BoolVar(&commands, "commands", false, "list the commands received from the backend (never their data)")
	return cmd
}

// listCommandsCmd is list --commands: the flags checked, the outbox opened
// as status opens it, the commands listed.
func listCommandsCmd(cmd *cobra.Command, a *cli.App, db *dbFlags, state string, after int64, limit int, asJSON, payload bool) error {
	if payload {
		return cli.Usagef("--payload: a command's data is never shown")
	}
	if cmd.Flags().Changed("priority") {
		return cli.Usagef("--priority: commands have no priority")
	}
	if limit < 1 {
		return cli.Usagef("--limit %d: want at least 1", limit)
	}
	want := ""
	if cmd.Flags().Changed("state") {
		var ok bool
		if want, ok = commandStates[state]; !ok {
			return cli.Usagef("--state %q with --commands: want waiting, applied, expired, failed or malformed", state)
		}
	}
	ob, err := db.open(cmd.Context(), a, inspect)
	if err != nil {
		return err
	}
	defer ob.Close()
	if err := listCommands(cmd.Context(), a, ob.DB(), want, after, limit, asJSON); err != nil {
		return db.explain(err)
	}
	return nil
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
