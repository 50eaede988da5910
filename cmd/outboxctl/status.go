package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/edgeoutbox/outbox/internal/metrics"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/cli"
)

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
	Expired            int64      `json:"expired"`
	Sent               int64      `json:"sent"`
	MaxPendingMessages int64      `json:"max_pending_messages"`
	MaxPendingBytes    int64      `json:"max_pending_bytes"`
	LeaseOwner         string     `json:"lease_owner"`
	LeaseExpiresAt     *time.Time `json:"lease_expires_at"`
	Protocol           *string    `json:"protocol"` // what the lease holder speaks; null: not known
	// BrokerUnavailable is what the broker says of itself while it says it
	// cannot take messages, as the lease holder recorded it; null: it
	// does not say so.
	BrokerUnavailable      *string    `json:"broker_unavailable"`
	BrokerUnavailableSince *time.Time `json:"broker_unavailable_since"`
	// NoSubscribers counts the messages the broker took with no subscriber
	// since the lease holder started, as it last recorded them; the last
	// topic and when (null when none).
	NoSubscribers      int64      `json:"no_subscribers"`
	NoSubscribersTopic *string    `json:"no_subscribers_topic"`
	NoSubscribersAt    *time.Time `json:"no_subscribers_at"`
	FileBytes          int64      `json:"file_bytes"`
	WALBytes           int64      `json:"wal_bytes"`
	// Priorities are the pending messages by priority, highest first, one
	// for each priority that has any; an empty array when none.
	Priorities []priorityJSON `json:"priorities"`
	// Commands counts the commands received from the backend by state;
	// all 0 when none was (or the schema is older than commands).
	Commands commandsJSON `json:"commands"`
}

// commandsJSON counts the commands in outbox_command by state, in
// statusJSON.
type commandsJSON struct {
	Waiting   int64 `json:"waiting"`
	Applied   int64 `json:"applied"`
	Expired   int64 `json:"expired"`
	Failed    int64 `json:"failed"`
	Malformed int64 `json:"malformed"`
}

// some says whether there is a command at all.
func (c commandsJSON) some() bool {
	return c.Waiting+c.Applied+c.Expired+c.Failed+c.Malformed > 0
}

// priorityJSON is what waits at one priority, in statusJSON.
type priorityJSON struct {
	Priority          int       `json:"priority"`
	Pending           int64     `json:"pending"`
	OldestPendingAt   time.Time `json:"oldest_pending_at"`
	OldestPendingAgeS float64   `json:"oldest_pending_age_seconds"`
}

func statusCmd(a *cli.App) *cobra.Command {
	var db dbFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status --db PATH [--json]",
		Short: "Show what is in an outbox",
		Long: `status shows the pending messages (count, bytes, age of the oldest; count
and age of the oldest by priority), dead
messages, expired ones (not published: their expiry ran out before their
turn), sent messages still kept, the commands received from the backend by
state (when there are any), the limits, the relay lease, the schema
version and the file sizes. It never writes anything: no schema is created
or migrated (a file of the previous schema version is read as it is; an
older one gets a line saying that init migrates it), no disk reserve is
written, and a database closed cleanly gets no -wal or -shm file.

--json prints one object with these keys: db, schema_version, pending,
pending_bytes, oldest_pending_at, oldest_pending_age_seconds, dead, expired, sent,
max_pending_messages, max_pending_bytes, lease_owner, lease_expires_at,
protocol (what the relay holding the lease speaks: "MQTT 5", "MQTT 3.1.1",
"NATS JetStream" or null), broker_unavailable and broker_unavailable_since (what the broker
says of itself while it says it cannot take messages, and since when; null
otherwise), no_subscribers, no_subscribers_topic and no_subscribers_at
(messages the broker took with no subscriber since the relay started, the
last topic and when), file_bytes, wal_bytes, and priorities: an array,
highest first, of one object for each priority that has pending messages,
with the keys priority, pending, oldest_pending_at and
oldest_pending_age_seconds; and commands: an object counting the commands
received from the backend by state, with the keys waiting, applied,
expired, failed and malformed (all 0 when none was; the text shows its line
only when there are some). Times are RFC 3339 UTC or null.`,
		Example: `  outboxctl status --db /var/lib/till/till.db
  outboxctl status --db /var/lib/till/till.db --json | jq .pending`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ob, st, err := db.openStats(cmd.Context(), a, inspect)
			if err != nil {
				return err
			}
			defer ob.Close()
			out := statusJSON{
				DB: db.path, SchemaVersion: st.SchemaVersion,
				Pending: st.Pending, PendingBytes: st.PendingBytes,
				Dead: st.Dead, Expired: st.Expired, Sent: st.Sent,
				MaxPendingMessages: st.MaxPendingMessages, MaxPendingBytes: st.MaxPendingBytes,
				LeaseOwner: st.LeaseOwner,
				FileBytes:  fileSize(db.path), WALBytes: fileSize(db.path + "-wal"),
				Priorities: []priorityJSON{},
				Commands: commandsJSON{Waiting: st.Commands.Waiting, Applied: st.Commands.Applied, Expired: st.Commands.Expired,
					Failed: st.Commands.Failed, Malformed: st.Commands.Malformed},
			}
			for _, p := range st.Priorities {
				out.Priorities = append(out.Priorities, priorityJSON{Priority: p.Priority, Pending: p.Pending,
					OldestPendingAt: p.OldestPending.UTC(), OldestPendingAgeS: time.Since(p.OldestPending).Seconds()})
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
			if st.LeaseOwner != "" && st.LeaseProtocol != "" {
				v := metrics.ProtocolName(st.LeaseProtocol)
				out.Protocol = &v
			}
			if st.LeaseOwner != "" && st.LeaseBrokerUnavailable != "" {
				v, t := st.LeaseBrokerUnavailable, st.LeaseBrokerUnavailableSince.UTC()
				out.BrokerUnavailable, out.BrokerUnavailableSince = &v, &t
			}
			if st.LeaseOwner != "" && st.LeaseNoSubscribers > 0 {
				topic, at := st.LeaseNoSubscribersTopic, st.LeaseNoSubscribersAt.UTC()
				out.NoSubscribers, out.NoSubscribersTopic, out.NoSubscribersAt = st.LeaseNoSubscribers, &topic, &at
			}
			if asJSON {
				return writeJSON(a.Stdout, out)
			}
			w := tabwriter.NewWriter(a.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "database\t%s\n", out.DB)
			fmt.Fprintf(w, "schema version\t%d\n", out.SchemaVersion)
			fmt.Fprintf(w, "pending\t%d messages, %s\n", out.Pending, bytesText(out.PendingBytes))
			if out.OldestPendingAt != nil {
				fmt.Fprintf(w, "oldest pending\t%s ago (%s)\n", ageText(*out.OldestPendingAgeS), out.OldestPendingAt.Format(time.RFC3339))
			} else {
				fmt.Fprintf(w, "oldest pending\t-\n")
			}
			for _, p := range out.Priorities {
				fmt.Fprintf(w, "  priority %d\t%d messages, oldest %s ago\n", p.Priority, p.Pending, ageText(p.OldestPendingAgeS))
			}
			fmt.Fprintf(w, "dead\t%d\n", out.Dead)
			fmt.Fprintf(w, "expired\t%d\n", out.Expired)
			fmt.Fprintf(w, "sent (kept)\t%d\n", out.Sent)
			if c := out.Commands; c.some() {
				fmt.Fprintf(w, "commands\t%d waiting, %d applied, %d expired, %d failed, %d malformed\n", c.Waiting, c.Applied, c.Expired, c.Failed, c.Malformed)
			}
			fmt.Fprintf(w, "limits\t%s\n", limitsText(out.MaxPendingMessages, out.MaxPendingBytes))
			if out.LeaseOwner != "" {
				if out.LeaseExpiresAt == nil {
					fmt.Fprintf(w, "relay lease\t%s\n", out.LeaseOwner)
				} else if out.LeaseExpiresAt.Before(time.Now()) {
					// An idle relay that watches its WAL renews only when a
					// message comes or another relay waits for the lease.
					fmt.Fprintf(w, "relay lease\t%s, lapsed at %s (the relay is idle, or gone)\n", out.LeaseOwner, out.LeaseExpiresAt.Format(time.RFC3339))
				} else {
					fmt.Fprintf(w, "relay lease\t%s, until %s\n", out.LeaseOwner, out.LeaseExpiresAt.Format(time.RFC3339))
				}
				if out.Protocol != nil {
					fmt.Fprintf(w, "protocol\t%s\n", *out.Protocol)
				}
				if out.NoSubscribers > 0 {
					fmt.Fprintf(w, "no subscriber\t%d messages reached the broker with no subscriber, last on %s at %s (%s ago): is the consumer subscribed, is the topic right?\n",
						out.NoSubscribers, *out.NoSubscribersTopic, out.NoSubscribersAt.Format(time.RFC3339), ageText(time.Since(*out.NoSubscribersAt).Seconds()))
				}
				if out.BrokerUnavailable != nil {
					fmt.Fprintf(w, "broker\t%s, since %s (%s ago); nothing is charged while it does\n", *out.BrokerUnavailable,
						out.BrokerUnavailableSince.Format(time.RFC3339), ageText(time.Since(*out.BrokerUnavailableSince).Seconds()))
				}
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

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
