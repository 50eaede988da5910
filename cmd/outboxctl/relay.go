package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
	"github.com/edgeoutbox/outbox/internal/monitor"
	"github.com/edgeoutbox/outbox/natsjs"
)

type relayFlags struct {
	db            dbFlags
	brokers       []string
	clientID      string
	topicPrefix   string
	source        string
	username      string
	passwordFile  string
	passwordEnv   string
	caFile        string
	certFile      string
	keyFile       string
	serverName    string
	envelope      string
	mqttVersion   string
	window        int
	windowBytes   int
	backoffMax    time.Duration
	pollInterval  time.Duration
	retention     time.Duration
	maxAttempts   int
	shutdown      time.Duration
	statsInterval time.Duration
	metricsListen string
	tokenFile     string
	writersFull   bool
	batchEvents   int
	batchBytes    int
	batchDelay    time.Duration
	compress      string
	commands      []string
	commandsID    string
	natsToken     string
	natsNKey      string
	natsCreds     string
	stream        streamFlags
}

// streamFlags are the stream --create-stream asks for
// (natsjs.StreamSpec).
type streamFlags struct {
	name       string
	subjects   []string
	replicas   int
	maxBytes   int64
	maxAge     time.Duration
	duplicates time.Duration
}

func relayCmd(a *cli.App) *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay --db PATH --broker URL",
		Short: "Drain an outbox that other processes write to an MQTT broker or NATS JetStream",
		Long: `relay is the sidecar: it publishes the rows that any program — a Go app
through the library, or a Python, Node or shell program that only runs
INSERT INTO outbox (topic, payload) in its own transaction — writes to the
outbox table, in commit order, at QoS 1, as CloudEvents JSON (or raw).

It creates the schema if missing, holds the relay lease (a second relay on
the same file waits), notices other processes' commits within milliseconds,
reconnects with backoff for as long as it takes, and on SIGINT or SIGTERM
waits (bounded) for in-flight acknowledgements and exits 0.

The password is never a flag value (ps would show it): use --password-file
or --password-env. Certificates and keys are read again at every connection,
so they can be replaced on disk while the relay runs.

--metrics-listen ADDR serves, on ADDR, /metrics (Prometheus), /healthz,
/readyz and a status page at /. It is off unless asked; bind it to loopback
unless the LAN is trusted (SECURITY.md). The status page can requeue dead
messages and make the relay try to connect now only with --admin-token-file:
without one it is read-only.

With nats:// brokers it publishes to NATS JetStream: each event to the subject
of its topic (pos/a is pos.a), with its id as Nats-Msg-Id, into whatever
stream captures the subject, which the operator creates (or the relay, with
--create-stream, where the till may); while none does the events stay pending
and the relay says why. It logs in with --username and --password-file,
--nats-token-file, --nats-nkey-file or --nats-creds-file; --ca-file (and
--cert-file, --key-file for mutual TLS) make the nats:// connection TLS
(tls:// is MQTT's). Certificates and the NKey seed are read once, at start,
the creds file at every connection.`,
		Example: `  outboxctl relay --db /var/lib/till/till.db --broker tcp://127.0.0.1:1883
  outboxctl relay --db till.db --broker ssl://broker.example.com:8883 \
      --client-id store42-till7 --source /stores/42/tills/7 \
      --username till7 --password-file /etc/till/mqtt-password \
      --ca-file /etc/till/ca.pem --cert-file /etc/till/till.pem --key-file /etc/till/till.key
  MQTT_PASSWORD=secret outboxctl relay --db till.db --broker tcp://broker:1883 --username till7 --password-env MQTT_PASSWORD --log-format json
  outboxctl relay --db till.db --broker nats://nats-1:4222 --broker nats://nats-2:4222 --username till7 --password-file /etc/till/nats-password
  outboxctl relay --db till.db --broker tcp://127.0.0.1:1883 --metrics-listen 127.0.0.1:9464 --admin-token-file /etc/till/outbox-admin-token`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			jsOpts, onNATS, err := f.natsOptions()
			if err != nil {
				return cli.UsageError{Err: err}
			}
			var mopts outbox.MQTTOptions
			if !onNATS {
				if mopts, err = f.mqttOptions(); err != nil {
					return cli.UsageError{Err: err}
				}
			}
			mopts.Logger = a.Logger
			if f.window < 1 || f.window > 65535 {
				return cli.Usagef("--window %d: want 1 to 65535", f.window)
			}
			if f.maxAttempts < 1 {
				return cli.Usagef("--max-attempts %d: want at least 1", f.maxAttempts)
			}
			if f.backoffMax <= 0 || f.pollInterval <= 0 || f.shutdown <= 0 {
				return cli.Usagef("--backoff-max, --poll-interval and --shutdown-timeout must be positive")
			}
			envelope, err := outbox.ParseEnvelope(f.envelope)
			if err != nil {
				return cli.UsageError{Err: err}
			}
			batch, compression, err := f.batching(envelope, mopts.Protocol)
			if err != nil {
				return cli.UsageError{Err: err}
			}
			if f.topicPrefix != "" {
				if err := outbox.ValidateTopic(f.topicPrefix); err != nil {
					return cli.Usagef("--topic-prefix: %w", err)
				}
			}
			if err := f.checkCommands(); err != nil {
				return cli.UsageError{Err: err}
			}
			var token string
			if f.tokenFile != "" {
				if f.metricsListen == "" {
					return cli.Usagef("--admin-token-file needs --metrics-listen")
				}
				b, err := os.ReadFile(f.tokenFile)
				if err != nil {
					return cli.Usagef("--admin-token-file: %w", err)
				}
				token = strings.TrimRight(string(b), "\r\n")
				if len(token) < 8 {
					return cli.Usagef("--admin-token-file: the token must have at least 8 characters")
				}
			}
			var pub outbox.Publisher
			if onNATS {
				if jsOpts.CreateStream != nil {
					jsOpts.CreateStream.Logger = a.Logger
				}
				if pub, err = natsjs.New(jsOpts); err != nil {
					return cli.UsageError{Err: err}
				}
			} else {
				mp, err := outbox.NewMQTTPublisher(mopts)
				if err != nil {
					return cli.UsageError{Err: err}
				}
				defer mp.Close()
				pub = mp
			}
			// Everything that can fail is tried before the database is
			// opened, which creates the file and its disk reserve: a
			// relay that cannot start leaves nothing behind. (The
			// publisher has read the URLs and TLS files.)
			var ln net.Listener
			if f.metricsListen != "" {
				if ln, err = monitor.Listen(f.metricsListen); err != nil {
					return fmt.Errorf("--metrics-listen: %w", err)
				}
				defer ln.Close()
			}
			ob, err := f.db.open(cmd.Context(), a, create)
			if err != nil {
				return err
			}
			defer ob.Close()
			recv, err := f.commandReceiver(ob, mopts)
			if err != nil {
				return cli.UsageError{Err: err}
			}
			relay, err := ob.NewRelay(pub, outbox.RelayOptions{
				Envelope:        envelope,
				Source:          f.source,
				Window:          f.window,
				WindowBytes:     f.windowBytes,
				Reconnect:       outbox.Backoff{Max: f.backoffMax},
				PollInterval:    f.pollInterval,
				Retention:       f.retention,
				Retry:           outbox.DefaultRetryPolicy{MaxAttempts: f.maxAttempts},
				ShutdownTimeout: f.shutdown,
				TopicPrefix:     f.topicPrefix,
				WritersAtFull:   f.writersFull,
				Batch:           batch,
				Compress:        compression,
			})
			if err != nil {
				return cli.UsageError{Err: err}
			}
			if f.statsInterval > 0 {
				go logStats(cmd, a, relay, f.statsInterval)
			}
			if ln != nil {
				defer serveMetrics(a, ln, ob, relay, token)()
			}
			a.Logger.Info("outboxctl relay", "db", f.db.path, "brokers", len(f.brokers), "nats", onNATS, "client_id", mopts.ClientID)
			if recv == nil {
				return relay.Run(cmd.Context())
			}
			// The receiver beside the relay, until the relay ends.
			ctx, cancel := context.WithCancel(cmd.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = recv.Run(ctx)
			}()
			a.Logger.Info("outboxctl relay: receiving commands", "topics", f.commands, "client_id", f.commandsID)
			if f.statsInterval > 0 {
				go logCommandStats(ctx, a, recv, f.statsInterval)
			}
			err = relay.Run(ctx)
			cancel()
			<-done
			return err
		},
	}
	f.db.register(cmd)
	fl := cmd.Flags()
	fl.StringArrayVar(&f.brokers, "broker", nil, "broker URL: tcp://, mqtt://, ssl://, tls:// or mqtts://HOST:PORT (required), or nats://HOST:4222 for NATS JetStream (each event with its id as Nats-Msg-Id, into the stream that captures its subject; TLS with --ca-file); repeat it for the nodes of a cluster: after a failed or lost connection the relay moves to the next")
	fl.StringVar(&f.clientID, "client-id", "", "MQTT client id, unique per broker (default outbox-HOST-PID)")
	fl.StringVar(&f.topicPrefix, "topic-prefix", "", "park as dead, at once, any message whose topic does not start with this (e.g. acme/till-7/)")
	fl.StringVar(&f.source, "source", "", "CloudEvents source naming this device (default /outbox/HOST)")
	fl.StringVar(&f.username, "username", "", "the broker's user name (MQTT or NATS)")
	fl.StringVar(&f.passwordFile, "password-file", "", "read the broker's password (MQTT or NATS) from this file (trailing newline ignored)")
	fl.StringVar(&f.passwordEnv, "password-env", "", "read the broker's password (MQTT or NATS) from this environment variable")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM CA bundle to verify the broker (default: system roots)")
	fl.StringVar(&f.certFile, "cert-file", "", "PEM client certificate for mutual TLS")
	fl.StringVar(&f.keyFile, "key-file", "", "PEM private key of the client certificate")
	fl.StringVar(&f.serverName, "tls-server-name", "", "name to verify in the broker's certificate (default: the URL's host)")
	fl.StringVar(&f.envelope, "envelope", "cloudevents", "cloudevents (structured), binary (CloudEvents binary mode: attributes as MQTT 5 user properties, the payload untouched; structured on 3.1.1) or raw (raw puts no id on the wire)")
	fl.StringVar(&f.mqttVersion, "mqtt-version", "auto", "MQTT version: auto (5, falling back to 3.1.1 for a broker without 5), 5, or 3.1.1 (also written 4, its protocol level)")
	fl.IntVar(&f.window, "window", 64, "publishes awaiting PUBACK at once (1-65535)")
	fl.IntVar(&f.windowBytes, "window-bytes", 256<<10, "payload bytes awaiting PUBACK at once, beside --window (negative: --window alone)")
	fl.DurationVar(&f.backoffMax, "backoff-max", 30*time.Second, "cap on the wait between connection attempts")
	fl.DurationVar(&f.pollInterval, "poll-interval", 2*time.Millisecond, "how often to check for other processes' commits")
	fl.DurationVar(&f.retention, "retention", time.Hour, "how long sent messages are kept; negative deletes them at once")
	fl.IntVar(&f.maxAttempts, "max-attempts", 5, "failures of a message by itself before it is parked as dead")
	fl.DurationVar(&f.shutdown, "shutdown-timeout", 5*time.Second, "wait for in-flight acknowledgements when stopping")
	fl.DurationVar(&f.statsInterval, "stats-interval", time.Minute, "log the relay's counters this often (0: never)")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "serve /metrics, /healthz, /readyz and the status page on this address, e.g. 127.0.0.1:9464 (default: off)")
	fl.BoolVar(&f.writersFull, "writers-full", false, "declare that every program writing the database commits at synchronous=FULL: publish without an fsync of the relay's first (declared wrongly, a power cut can undo a commit whose event went out)")
	fl.IntVar(&f.batchEvents, "batch-max-events", 0, "publish up to N events of one topic in one MQTT message (0 or 1: one event a message)")
	fl.IntVar(&f.batchBytes, "batch-max-bytes", 0, "bytes of a batch at most, before compression (0: 65536)")
	fl.DurationVar(&f.batchDelay, "batch-max-delay", 0, "how long a batch may wait for more events of its topic (0: never; what is pending goes at once)")
	fl.StringVar(&f.compress, "compress", "none", "compress batches and single events of 256 bytes or more: none, gzip or zstd")
	fl.StringArrayVar(&f.commands, "commands", nil, "receive commands on this topic filter (repeatable) beside the relay, on a second connection with a persistent session, storing each in outbox_command before acknowledging it (docs/commands.md)")
	fl.StringVar(&f.commandsID, "commands-client-id", "", "the commands connection's client id (default: --client-id + \"-commands\"); fixed, for its persistent session")
	fl.StringVar(&f.natsToken, "nats-token-file", "", "with nats://: log in with the token in this file (trailing newline ignored)")
	fl.StringVar(&f.natsNKey, "nats-nkey-file", "", "with nats://: log in with the NKey seed in this file")
	fl.StringVar(&f.natsCreds, "nats-creds-file", "", "with nats://: log in with this credentials file (a user JWT and its NKey seed, as an operator-mode account issues them)")
	fl.StringVar(&f.stream.name, "create-stream", "", "with nats:// brokers: create this stream at each connection unless one of its name exists (which is used as it is), with file storage, limits retention and discard new (a full stream keeps events pending); needs --stream-subject. Off by default: streams are the operator's")
	fl.StringArrayVar(&f.stream.subjects, "stream-subject", nil, "a subject the created stream captures, e.g. 'pos.>' for the topics pos/… (repeatable; required with --create-stream)")
	fl.IntVar(&f.stream.replicas, "stream-replicas", 1, "nodes of the cluster that hold the created stream")
	fl.Int64Var(&f.stream.maxBytes, "stream-max-bytes", 0, "bytes the created stream holds at most before it refuses new events (0: the account's limit)")
	fl.DurationVar(&f.stream.maxAge, "stream-max-age", 0, "how long the created stream keeps a message (0: until removed)")
	fl.DurationVar(&f.stream.duplicates, "stream-duplicate-window", 0, "the created stream's duplicate window: exactly once into the stream holds for re-sends within it (0: 2m, NATS's default)")
	fl.StringVar(&f.tokenFile, "admin-token-file", "", "enable the status page's buttons (requeue, try to connect now), with the token in this file (default: read-only page)")
	return cmd
}

func (f *relayFlags) mqttOptions() (outbox.MQTTOptions, error) {
	if len(f.brokers) == 0 {
		return outbox.MQTTOptions{}, errors.New("--broker is required")
	}
	if f.natsToken != "" || f.natsNKey != "" || f.natsCreds != "" {
		return outbox.MQTTOptions{}, errors.New("--nats-token-file, --nats-nkey-file and --nats-creds-file are NATS's: not with an MQTT broker")
	}
	if f.db.path == "" {
		return outbox.MQTTOptions{}, errors.New("--db is required")
	}
	return f.connOptions()
}

// connOptions reads the flags of the connection to the broker: its URLs,
// client id, version, credentials and TLS files.
func (f *relayFlags) connOptions() (outbox.MQTTOptions, error) {
	o := outbox.MQTTOptions{Brokers: f.brokers, ClientID: f.clientID, Username: f.username}
	proto, err := outbox.ParseMQTTProtocol(f.mqttVersion)
	if err != nil {
		return o, fmt.Errorf("--mqtt-version: %w", err)
	}
	o.Protocol = proto
	if o.Password, err = f.password(); err != nil {
		return o, err
	}
	var tlsURL bool
	for i, b := range f.brokers {
		u, err := outbox.ParseBrokerURL(b)
		if err != nil {
			return o, err
		}
		t := map[string]bool{"ssl": true, "tls": true, "mqtts": true}[strings.ToLower(u.Scheme)]
		if i > 0 && t != tlsURL {
			return o, fmt.Errorf("--broker: mix of TLS and plain URLs")
		}
		tlsURL = t
	}
	if !tlsURL && (f.caFile != "" || f.certFile != "" || f.keyFile != "") {
		return o, fmt.Errorf("--ca-file, --cert-file and --key-file need a TLS URL (ssl://, tls:// or mqtts://)")
	}
	if tlsURL {
		// Read again at every connection: renewed files need no restart.
		o.TLSFiles = &outbox.TLSFiles{CAFile: f.caFile, CertFile: f.certFile, KeyFile: f.keyFile, ServerName: f.serverName}
	}
	return o, nil
}

// password reads --password-file or --password-env.
func (f *relayFlags) password() (string, error) {
	var pw string
	switch {
	case f.passwordFile != "" && f.passwordEnv != "":
		return "", errors.New("give --password-file or --password-env, not both")
	case f.passwordFile != "":
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return "", fmt.Errorf("--password-file: %w", err)
		}
		pw = strings.TrimRight(string(b), "\r\n")
	case f.passwordEnv != "":
		v, ok := os.LookupEnv(f.passwordEnv)
		if !ok {
			return "", fmt.Errorf("--password-env: environment variable %s is not set", f.passwordEnv)
		}
		pw = v
	}
	if pw != "" && f.username == "" {
		return "", errors.New("a password needs --username")
	}
	return pw, nil
}

// natsOptions reads --broker as NATS JetStream servers when they are
// nats:// URLs (onNATS), with the credentials and TLS files; onNATS is
// false when none is. What only MQTT has (batches, compression,
// --commands, --mqtt-version) is refused with them.
func (f *relayFlags) natsOptions() (o natsjs.Options, onNATS bool, err error) {
	n := 0
	for _, b := range f.brokers {
		if strings.HasPrefix(strings.ToLower(b), "nats://") {
			n++
		}
	}
	stream := f.stream.name != "" || len(f.stream.subjects) > 0 || f.stream.replicas != 1 || f.stream.maxBytes != 0 || f.stream.maxAge != 0 || f.stream.duplicates != 0
	switch {
	case n == 0 && stream:
		return o, false, errors.New("--create-stream and --stream-* are NATS JetStream's: they need nats:// brokers")
	case n == 0:
		return o, false, nil
	case stream && f.stream.name == "":
		return o, true, errors.New("--stream-* need --create-stream")
	case n < len(f.brokers):
		return o, true, errors.New("--broker: mix of nats:// and MQTT URLs")
	case f.db.path == "":
		return o, true, errors.New("--db is required")
	case f.batchEvents > 1 || f.batchBytes > 0 || f.batchDelay > 0 || !strings.EqualFold(f.compress, "none") && f.compress != "":
		return o, true, errors.New("--batch-max-* and --compress are MQTT's: NATS JetStream carries one event per message")
	case len(f.commands) > 0:
		return o, true, errors.New("--commands is MQTT's: not on NATS JetStream yet")
	case f.mqttVersion != "auto":
		return o, true, errors.New("--mqtt-version is MQTT's: not with a nats:// broker")
	}
	o = natsjs.Options{Servers: f.brokers, User: f.username, Name: f.clientID, NKeySeedFile: f.natsNKey, CredsFile: f.natsCreds}
	if f.stream.name != "" {
		o.CreateStream = &natsjs.StreamSpec{Name: f.stream.name, Subjects: f.stream.subjects, Replicas: f.stream.replicas,
			MaxBytes: f.stream.maxBytes, MaxAge: f.stream.maxAge, Duplicates: f.stream.duplicates}
	}
	if o.Password, err = f.password(); err != nil {
		return o, true, err
	}
	if err := f.natsLogin(&o); err != nil {
		return o, true, err
	}
	if f.caFile != "" || f.certFile != "" || f.keyFile != "" || f.serverName != "" {
		if o.TLS, err = (outbox.TLSFiles{CAFile: f.caFile, CertFile: f.certFile, KeyFile: f.keyFile, ServerName: f.serverName}).Config(); err != nil {
			return o, true, err
		}
	}
	return o, true, nil
}

// natsLogin reads --nats-token-file and checks that one way of logging in
// is given at most, and that its files can be read.
func (f *relayFlags) natsLogin(o *natsjs.Options) error {
	ways := 0
	for _, given := range []bool{f.username != "", f.natsToken != "", f.natsNKey != "", f.natsCreds != ""} {
		if given {
			ways++
		}
	}
	if ways > 1 {
		return errors.New("give one of --username, --nats-token-file, --nats-nkey-file and --nats-creds-file")
	}
	if f.natsToken != "" {
		b, err := os.ReadFile(f.natsToken)
		if err != nil {
			return fmt.Errorf("--nats-token-file: %w", err)
		}
		if o.Token = strings.TrimRight(string(b), "\r\n"); o.Token == "" {
			return errors.New("--nats-token-file: the file is empty")
		}
	}
	if f.natsCreds != "" {
		if _, err := os.ReadFile(f.natsCreds); err != nil {
			return fmt.Errorf("--nats-creds-file: %w", err)
		}
	}
	return nil
}

// checkCommands checks the flags of --commands before anything is opened,
// and settles the commands connection's client id.
func (f *relayFlags) checkCommands() error {
	if len(f.commands) == 0 {
		if f.commandsID != "" {
			return errors.New("--commands-client-id needs --commands")
		}
		return nil
	}
	if f.commandsID == "" {
		if f.clientID == "" {
			return errors.New("--commands needs --client-id or --commands-client-id: a fixed client id, for the persistent session that keeps commands while the device is away")
		}
		f.commandsID = f.clientID + "-commands"
	}
	if f.commandsID == f.clientID {
		return errors.New("--commands-client-id must differ from --client-id: it is a second connection")
	}
	return nil
}

// commandReceiver returns the receiver --commands asks for (nil: none), on
// the relay's brokers, credentials, TLS files and version, with a client id
// of its own that stays the same across restarts (the relay's default
// names the process, which would lose the session at each).
func (f *relayFlags) commandReceiver(ob *outbox.Outbox, m outbox.MQTTOptions) (*outbox.MQTTCommandReceiver, error) {
	if len(f.commands) == 0 {
		return nil, nil
	}
	return ob.NewMQTTCommandReceiver(outbox.MQTTCommandOptions{
		Brokers: m.Brokers, ClientID: f.commandsID, Username: m.Username, Password: m.Password,
		TLSFiles: m.TLSFiles, Protocol: m.Protocol, Reconnect: outbox.Backoff{Max: f.backoffMax},
		Topics: f.commands, Logger: m.Logger,
	})
}

// batching reads the batch and compression flags. They are checked here,
// before anything is opened or connects, as NewRelay would check them: a
// relay that cannot start leaves no file behind.
func (f *relayFlags) batching(env outbox.Envelope, proto outbox.MQTTProtocol) (outbox.BatchOptions, outbox.Compressor, error) {
	b := outbox.BatchOptions{MaxEvents: f.batchEvents, MaxBytes: f.batchBytes, MaxDelay: f.batchDelay}
	switch {
	case b.MaxEvents < 0 || b.MaxEvents > 65535:
		return b, nil, fmt.Errorf("--batch-max-events %d: want 0 to 65535", b.MaxEvents)
	case b.MaxBytes < 0 || b.MaxBytes > outbox.MaxBatchBytesLimit:
		return b, nil, fmt.Errorf("--batch-max-bytes %d: want 0 to %d (16 MiB)", b.MaxBytes, outbox.MaxBatchBytesLimit)
	case b.MaxDelay < 0 || b.MaxDelay > time.Minute:
		return b, nil, fmt.Errorf("--batch-max-delay %s: want 0 to 1m", b.MaxDelay)
	}
	var c outbox.Compressor
	switch strings.ToLower(f.compress) {
	case "none", "":
	case "zstd":
		c = compression.Zstd()
	case "gzip":
		c = compression.Gzip()
	default:
		return b, nil, fmt.Errorf("--compress %q: want none, gzip or zstd", f.compress)
	}
	if env == outbox.EnvelopeRaw && proto == outbox.Protocol311 && (b.MaxEvents > 1 || c != nil) {
		return b, nil, errors.New("--envelope raw with --batch-max-events or --compress needs MQTT 5: 3.1.1 has no properties, so nothing could tell a raw batch " +
			"or a compressed raw payload from one event's bytes; use --mqtt-version 5 (or auto), or --envelope cloudevents")
	}
	return b, c, nil
}

func logStats(cmd *cobra.Command, a *cli.App, r *outbox.Relay, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-cmd.Context().Done():
			return
		case <-t.C:
		}
		s, err := r.Stats(cmd.Context())
		if err != nil {
			continue
		}
		a.Logger.Info("outbox relay stats", "connected", s.Connected, "protocol", s.Protocol, "pending", s.Pending, "pending_bytes", s.PendingBytes,
			"in_flight", s.InFlight, "sent", s.SentSince, "no_subscribers", s.NoSubscribers, "dead", s.Dead, "wal_syncs", s.WALSyncs, "last_error", s.LastError)
	}
}

// logCommandStats logs the command receiver's counters every interval
// until ctx ends.
func logCommandStats(ctx context.Context, a *cli.App, r *outbox.MQTTCommandReceiver, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := r.Stats()
		a.Logger.Info("outbox commands stats", "connected", s.Connected, "protocol", s.Protocol, "stored", s.Stored,
			"duplicates", s.Duplicates, "store_errors", s.StoreErrors, "expired", s.Expired, "last_error", s.LastError)
	}
}

// serveMetrics serves the monitor's endpoints on ln until stop: the same
// as outboxprom's Handler, with /metrics written without Prometheus's
// client, which would be the heaviest thing a till links after the library.
func serveMetrics(a *cli.App, ln net.Listener, ob *outbox.Outbox, relay *outbox.Relay, token string) (stop func()) {
	mon := monitor.New(ob, monitor.Options{Relay: relay, Version: version, AdminToken: token, Logger: a.Logger})
	srv := monitor.NewServer(mon.Handler(mon.TextMetrics()), a.Logger)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.Logger.Error("outboxctl relay: the metrics listener failed", "err", err)
		}
	}()
	a.Logger.Info("outboxctl relay: serving metrics and the status page", "addr", ln.Addr().String(), "requeue", token != "")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		mon.Close()
	}
}
