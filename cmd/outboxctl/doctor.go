package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/metrics"
	"github.com/edgeoutbox/outbox/internal/reserve"
	"github.com/edgeoutbox/outbox/natsjs"
)

// doctor answers a technician's "it stopped sending" with findings, each
// with what to do, read from the file without writing anything (inspect)
// and, given a broker, from one connection attempt.

// A finding's level: whether it needs a person.
const (
	levelOK   = "ok"   // nothing to do
	levelNote = "note" // worth knowing; the relay copes
	levelAct  = "act"  // someone must act: doctor exits 1
)

// doctorLargeWAL is a WAL size worth a note: checkpoints keep it far
// smaller while nothing holds them back.
const doctorLargeWAL = 64 << 20

// finding is one thing doctor looked at.
type finding struct {
	Check string `json:"check"`
	Level string `json:"level"` // ok, note or act
	Found string `json:"found"` // what was found, in words
	Do    string `json:"do,omitempty"`
}

// doctorJSON is the stable output of `doctor --json`.
type doctorJSON struct {
	DB       string    `json:"db"`
	OK       bool      `json:"ok"` // no finding needs a person
	Findings []finding `json:"findings"`
}

type doctorFlags struct {
	relay       relayFlags // the database and the broker's connection flags
	full        bool
	minFree     int64
	stale       time.Duration
	connectWait time.Duration
	asJSON      bool
}

func doctorCmd(a *cli.App) *cobra.Command {
	var f doctorFlags
	f.relay.stream.replicas = 1 // the relay's default: doctor creates no stream
	cmd := &cobra.Command{
		Use:   "doctor --db PATH [--broker URL] [--json]",
		Short: "Say what is wrong with a till that stopped sending, and what to do",
		Long: `doctor looks at an outbox the way a technician would on a till that
"stopped sending", and says what it found and what to do about each thing:
the file's integrity (PRAGMA quick_check; --full runs integrity_check), the
schema version, the WAL's size, the free disk space and the disk reserve,
the relay lease (who holds it, and whether that process still runs), and
the pending, dead and expired messages with the oldest pending. With
--broker it also tries one connection to the broker (as the relay would,
with the same connection flags; nats:// for NATS JetStream) and says in
words how it went.

It opens the database read-only and creates nothing: no -wal, -shm or
-reserve file; it may run beside a running relay.

It exits 0 when nothing needs a person, 1 when something does (each such
finding is marked "act"), 2 for a wrong command line. --json prints one
object: db, ok, and findings, a list of {check, level (ok, note or act),
found, do}.`,
		Example: `  outboxctl doctor --db /var/lib/till/till.db
  outboxctl doctor --db /var/lib/till/till.db --broker ssl://broker.example.com:8883 \
      --username till7 --password-file /etc/till/mqtt-password --ca-file /etc/till/ca.pem
  outboxctl doctor --db till.db --json | jq '.findings[] | select(.level == "act")'`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.relay.db.path == "" {
				return cli.Usagef("--db is required")
			}
			var try func() finding
			if len(f.relay.brokers) > 0 {
				if f.connectWait <= 0 {
					return cli.Usagef("--connect-timeout must be positive")
				}
				jsOpts, onNATS, err := f.relay.natsOptions()
				switch {
				case err != nil:
					return cli.UsageError{Err: err}
				case onNATS:
					jsOpts.ConnectTimeout = f.connectWait
					try = func() finding {
						pub, err := natsjs.New(jsOpts)
						if err != nil {
							return finding{Check: "broker", Level: levelAct, Found: err.Error()}
						}
						return tryBroker(cmd.Context(), pub, len(jsOpts.Servers), f.connectWait)
					}
				default:
					mopts, err := f.relay.mqttOptions()
					if err != nil {
						return cli.UsageError{Err: err}
					}
					mopts.ConnectTimeout, mopts.Logger = f.connectWait, a.Logger
					try = func() finding {
						pub, err := outbox.NewMQTTPublisher(mopts)
						if err != nil {
							return finding{Check: "broker", Level: levelAct, Found: err.Error()}
						}
						defer pub.Close()
						return tryBroker(cmd.Context(), pub, len(mopts.Brokers), f.connectWait)
					}
				}
			}
			out := doctorJSON{DB: f.relay.db.path, OK: true}
			out.Findings = examine(cmd.Context(), a, &f)
			if try != nil {
				out.Findings = append(out.Findings, try())
			}
			acts := 0
			for _, x := range out.Findings {
				if x.Level == levelAct {
					acts++
				}
			}
			out.OK = acts == 0
			var err error
			if f.asJSON {
				err = writeJSON(a.Stdout, out)
			} else {
				err = writeFindings(a, out)
			}
			if err != nil {
				return err
			}
			if acts > 0 {
				if acts == 1 {
					return errors.New("1 finding needs a person (marked act)")
				}
				return fmt.Errorf("%d findings need a person (marked act)", acts)
			}
			return nil
		},
	}
	f.relay.db.register(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&f.full, "full", false, "check the file with PRAGMA integrity_check (slower: reads every index) instead of quick_check")
	fl.Int64Var(&f.minFree, "min-free", 64<<20, "less free space than this, in bytes, on the database's file system needs a person")
	fl.DurationVar(&f.stale, "stale", 5*time.Minute, "a pending message older than this needs a person")
	fl.BoolVar(&f.asJSON, "json", false, "print JSON")
	fl.StringArrayVar(&f.relay.brokers, "broker", nil, "try one connection to this broker URL, as the relay's --broker (repeat it for the nodes of a cluster: one attempt each)")
	fl.StringVar(&f.relay.clientID, "client-id", "", "MQTT client id of the test connection (default outbox-HOST-PID; never the running relay's: the broker would disconnect it)")
	fl.StringVar(&f.relay.username, "username", "", "MQTT user name")
	fl.StringVar(&f.relay.passwordFile, "password-file", "", "read the MQTT password from this file (trailing newline ignored)")
	fl.StringVar(&f.relay.passwordEnv, "password-env", "", "read the MQTT password from this environment variable")
	fl.StringVar(&f.relay.caFile, "ca-file", "", "PEM CA bundle to verify the broker (default: system roots)")
	fl.StringVar(&f.relay.certFile, "cert-file", "", "PEM client certificate for mutual TLS")
	fl.StringVar(&f.relay.keyFile, "key-file", "", "PEM private key of the client certificate")
	fl.StringVar(&f.relay.serverName, "tls-server-name", "", "name to verify in the broker's certificate (default: the URL's host)")
	fl.StringVar(&f.relay.natsToken, "nats-token-file", "", "with nats://: log in with the token in this file (trailing newline ignored)")
	fl.StringVar(&f.relay.natsNKey, "nats-nkey-file", "", "with nats://: log in with the NKey seed in this file")
	fl.StringVar(&f.relay.natsCreds, "nats-creds-file", "", "with nats://: log in with this credentials file")
	fl.StringVar(&f.relay.mqttVersion, "mqtt-version", "auto", "MQTT version: auto (5, falling back to 3.1.1), 5 or 3.1.1")
	fl.DurationVar(&f.connectWait, "connect-timeout", 10*time.Second, "how long the test connection may take")
	return cmd
}

// examine reads the database's findings. A file that cannot be opened is
// one finding.
func examine(ctx context.Context, a *cli.App, f *doctorFlags) []finding {
	db := &f.relay.db
	var out []finding
	ob, err := db.open(ctx, a, inspect)
	if err != nil {
		return append(out, finding{Check: "database", Level: levelAct, Found: err.Error(), Do: openAdvice(err.Error())})
	}
	defer ob.Close()
	out = append(out, integrity(ctx, ob.DB(), db.path, f.full))
	st, err := ob.Stats(ctx)
	if err != nil {
		return append(out, finding{Check: "database", Level: levelAct, Found: db.explain(err).Error()})
	}
	out = append(out, schemaFinding(st.SchemaVersion, db.path), walFinding(db.path), diskFinding(db.path, f.minFree), reserveFinding(db.path, st))
	out = append(out, leaseFinding(ctx, ob.DB(), st))
	out = append(out, backlogFindings(db.path, st, f.stale)...)
	return out
}

// openAdvice says what to do about a file that cannot be read, unless the
// explained error (dbFlags.explain) says it already.
func openAdvice(explained string) string {
	switch {
	case strings.HasSuffix(explained, ": no such file"), strings.Contains(explained, "is a directory"):
		return "check the path: the application's configuration names the file"
	case strings.Contains(explained, "no permission"):
		return "run doctor as the user the relay runs as, or with sudo"
	}
	return ""
}

func integrity(ctx context.Context, db *sql.DB, path string, full bool) finding {
	pragma := "quick_check"
	if full {
		pragma = "integrity_check"
	}
	x := finding{Check: "integrity"}
	rows, err := db.QueryContext(ctx, "PRAGMA "+pragma+"(5)")
	var said []string
	if err == nil {
		for rows.Next() {
			var s string
			if err = rows.Scan(&s); err != nil {
				break
			}
			// A row may hold several lines, headed by the schema's name.
			for _, line := range strings.Split(s, "\n") {
				if line != "" && !strings.HasPrefix(line, "*** ") && len(said) < 3 {
					said = append(said, line)
				}
			}
		}
		if err == nil {
			err = rows.Err()
		}
		rows.Close()
	}
	switch {
	case err != nil:
		x.Level, x.Found = levelAct, fmt.Sprintf("%s could not be checked: %v", pragma, err)
	case len(said) == 1 && said[0] == "ok":
		x.Level, x.Found = levelOK, pragma+": ok"
	default:
		x.Level, x.Found = levelAct, "the file is damaged ("+pragma+": "+strings.Join(said, "; ")+")"
	}
	if x.Level == levelAct {
		x.Do = fmt.Sprintf("stop the application and the relay, copy %s (and %s-wal if there) aside, and restore a backup; the copy may still be read with sqlite3's .recover", path, path)
	}
	return x
}

func schemaFinding(v int, path string) finding {
	x := finding{Check: "schema", Level: levelOK, Found: fmt.Sprintf("version %d", v)}
	switch {
	case v < outbox.SchemaVersion:
		x.Level = levelNote
		x.Found += fmt.Sprintf(", older than this outboxctl's %d", outbox.SchemaVersion)
		x.Do = "the relay migrates it when it starts; or: outboxctl init --db " + path
	case v > outbox.SchemaVersion:
		x.Level = levelAct
		x.Found += fmt.Sprintf(", newer than this outboxctl's %d", outbox.SchemaVersion)
		x.Do = "use the outboxctl that came with the application"
	}
	return x
}

func walFinding(path string) finding {
	n := fileSize(path + "-wal")
	x := finding{Check: "wal", Level: levelOK, Found: fmt.Sprintf("%s of write-ahead log", bytesText(n))}
	if n > doctorLargeWAL {
		x.Level = levelNote
		x.Do = "checkpoints are held back: close any long-running reader of the file (a backup, an open sqlite3 shell)"
	}
	return x
}

func diskFinding(path string, minFree int64) finding {
	free, known := reserve.FreeBytes(path)
	if !known {
		return finding{Check: "disk", Level: levelNote, Found: "free space unknown on this platform"}
	}
	x := finding{Check: "disk", Level: levelOK, Found: bytesText(free) + " free"}
	if free < minFree {
		x.Level = levelAct
		x.Found += " (nearly full: writes to the outbox fail once it is)"
		x.Do = "free space on this file system (old logs, crash dumps); the relay frees more once it can send"
	}
	return x
}

// reserveFinding looks at the file of zeros the relay deletes when the disk
// fills (internal/reserve).
func reserveFinding(path string, st outbox.Stats) finding {
	fi, err := os.Stat(path + "-reserve")
	switch {
	case err == nil:
		return finding{Check: "reserve", Level: levelOK, Found: bytesText(fi.Size()) + " held back in " + path + "-reserve"}
	case errors.Is(err, os.ErrNotExist):
		x := finding{Check: "reserve", Level: levelNote, Found: "no reserve file"}
		if st.LeaseOwner != "" {
			x.Found += " (the relay releases it when the disk fills, and writes it again once there is room)"
			x.Do = "free disk space if the disk is full; otherwise nothing"
		} else {
			x.Do = "nothing: the application or the relay writes it when it opens the outbox"
		}
		return x
	}
	return finding{Check: "reserve", Level: levelNote, Found: err.Error()}
}

// leaseFinding says who holds the relay lease and whether that process
// runs, as far as this host can tell (internal/lease).
func leaseFinding(ctx context.Context, db *sql.DB, st outbox.Stats) finding {
	x := finding{Check: "relay"}
	if st.LeaseOwner == "" {
		x.Level, x.Found = levelOK, "no relay holds the lease"
		if st.Pending > 0 {
			x.Level = levelAct
			x.Found += fmt.Sprintf(" and %d messages are pending", st.Pending)
			x.Do = "start the relay (outboxctl relay, or the application's)"
		}
		return x
	}
	x.Level, x.Found = levelOK, "held by "+st.LeaseOwner
	var h lease.Holder
	err := db.QueryRowContext(ctx, `SELECT host, machine_id, boot_id, pid, pid_start, pid_ns FROM outbox_lease WHERE name = ?`, lease.Name).
		Scan(&h.Host, &h.MachineID, &h.BootID, &h.PID, &h.PIDStart, &h.PIDNS)
	if err != nil {
		x.Found += " (where it runs is not recorded)"
		return x
	}
	self := lease.ThisHolder()
	switch {
	case h.DeadTo(self, lease.ReadProc):
		x.Found += fmt.Sprintf(", process %d on this host, which is gone", h.PID)
		if st.Pending > 0 {
			x.Level = levelAct
			x.Do = "start the relay: it takes the lease at once from a process that is gone"
		} else {
			x.Level = levelNote
			x.Do = "start the relay if this till should be sending"
		}
	case h.Host == self.Host && h.BootID == self.BootID && h.PIDNS == self.PIDNS && h.PID > 0:
		if p, known := lease.ReadProc(h.PID); known && p.Exists && p.Start == h.PIDStart {
			x.Found += fmt.Sprintf(", process %d on this host, running", h.PID)
		} else {
			x.Found += fmt.Sprintf(", process %d on this host (cannot tell whether it runs)", h.PID)
		}
	default:
		x.Found += fmt.Sprintf(", on host %q (cannot tell from here whether it runs)", h.Host)
	}
	if !st.LeaseExpires.IsZero() && st.LeaseExpires.Before(time.Now()) {
		x.Found += ", lease lapsed at " + st.LeaseExpires.UTC().Format(time.RFC3339)
	}
	return x
}

func backlogFindings(path string, st outbox.Stats, stale time.Duration) []finding {
	p := finding{Check: "pending", Level: levelOK, Found: fmt.Sprintf("%d messages, %s", st.Pending, bytesText(st.PendingBytes))}
	if !st.OldestPending.IsZero() {
		age := time.Since(st.OldestPending)
		p.Found += fmt.Sprintf(", the oldest %s old (%s)", ageText(age.Seconds()), st.OldestPending.UTC().Format(time.RFC3339))
		if age > stale {
			p.Level = levelAct
			p.Do = "the relay is not getting them out: look at the relay finding, and test the broker with --broker"
		}
	}
	d := finding{Check: "dead", Level: levelOK, Found: fmt.Sprintf("%d messages", st.Dead)}
	if st.Dead > 0 {
		d.Level = levelAct
		d.Found += " parked as dead (the broker refused them, or they can never be sent)"
		d.Do = fmt.Sprintf("see why with: outboxctl list --db %s --state dead; then requeue --all-dead once fixed, or purge --dead", path)
	}
	e := finding{Check: "expired", Level: levelOK, Found: fmt.Sprintf("%d messages", st.Expired)}
	if st.Expired > 0 {
		e.Level = levelNote
		e.Found += " expired before their turn (not published)"
		e.Do = fmt.Sprintf("if they still matter: outboxctl requeue --db %s --all-expired", path)
	}
	return []finding{p, d, e}
}

// testConnection is what doctor needs of a publisher to try its brokers:
// MQTT's and NATS JetStream's.
type testConnection interface {
	Connect(context.Context) error
	Disconnect()
	Broker() string
	Protocol() string
}

// tryBroker makes one connection attempt for each of n brokers, each
// Connect trying the next, and says how it went.
func tryBroker(ctx context.Context, pub testConnection, n int, wait time.Duration) finding {
	x := finding{Check: "broker"}
	var err error
	var errs []string
	for range n {
		cctx, cancel := context.WithTimeout(ctx, wait)
		err = pub.Connect(cctx)
		cancel()
		if err == nil {
			x.Level, x.Found = levelOK, fmt.Sprintf("connected to %s (%s)", pub.Broker(), metrics.ProtocolName(pub.Protocol()))
			pub.Disconnect()
			return x
		}
		// The error repeats the URL after "connect to": said once.
		msg := err.Error()
		if _, rest, ok := strings.Cut(msg, pub.Broker()+": "); ok {
			msg = rest
		} else if _, rest, ok := strings.Cut(msg, pub.Broker()+", "); ok {
			msg = rest // natsjs: "…, logging in with …: …"
		}
		errs = append(errs, pub.Broker()+": "+msg)
	}
	x.Level = levelAct
	x.Found = "cannot connect to " + strings.Join(errs, "; ")
	x.Do = brokerAdvice(err)
	return x
}

// brokerAdvice says what to check for a failed connection.
func brokerAdvice(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens at that address: is the broker running, and are the host and port right?"
	case strings.Contains(msg, "no such host"):
		return "the host name does not resolve: check its spelling and this till's DNS"
	case errors.Is(err, context.DeadlineExceeded), strings.Contains(msg, "i/o timeout"):
		return "no answer in time: is the network up, and does a firewall let this port through?"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "no route to the broker: is this till's network up?"
	case strings.Contains(msg, "certificate"), strings.Contains(msg, "TLS"), strings.Contains(msg, "tls"):
		return "check --ca-file, --cert-file, --key-file and --tls-server-name, and this till's clock"
	case strings.Contains(msg, "user name or password"), strings.Contains(msg, "not authori"):
		return "check --username and the password file, and the broker's ACL for this client"
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return "the NATS server refused the login named: check that credential's file (--username and --password-file, --nats-token-file, --nats-nkey-file or --nats-creds-file) and the account's rights"
	case errors.Is(err, outbox.ErrBrokerUnavailable):
		return "the broker says it cannot take clients now: ask whoever runs it"
	}
	return "check the broker's URL and that it runs"
}

func writeFindings(a *cli.App, out doctorJSON) error {
	w := a.Stdout
	fmt.Fprintf(w, "database %s\n", out.DB)
	for _, x := range out.Findings {
		fmt.Fprintf(w, "%-4s  %-9s %s\n", x.Level, x.Check, x.Found)
		if x.Do != "" {
			fmt.Fprintf(w, "      %-9s → %s\n", "", x.Do)
		}
	}
	if out.OK {
		_, err := fmt.Fprintln(w, "nothing needs a person")
		return err
	}
	return nil
}
