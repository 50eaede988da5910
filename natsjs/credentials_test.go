package natsjs_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/harness/natsauth"
	"github.com/edgeoutbox/outbox/natsjs"
)

// credentialCase is one way a fleet logs its tills in to NATS.
type credentialCase struct {
	name string
	conf []string // the server's configuration
	// admin logs the test's own connection in, to make the stream.
	admin []nats.Option
	// good logs in; bad is refused, and wantErr is in Connect's error.
	good, bad natsjs.Options
	wantErr   []string
	// secrets must appear in no error and no log line.
	secrets []string
}

func credentialCases(t *testing.T) []credentialCase {
	nk, otherNK := natsauth.NewNKeyUser(t), natsauth.NewNKeyUser(t)
	op := natsauth.NewOperator(t)
	creds, foreign := op.Creds(t, "till-7"), op.ForeignCreds(t, "impostor")
	pki := harness.NewBrokerTLS(t)
	tlsConfig := func(caFile string, client *harness.KeyPair) *tls.Config {
		f := outbox.TLSFiles{CAFile: caFile}
		if client != nil {
			f.CertFile, f.KeyFile = client.CertFile, client.KeyFile
		}
		c, err := f.Config()
		require.NoError(t, err)
		return c
	}
	serverTLS := func(verify bool) string {
		return fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: %t }", pki.Server.CertFile, pki.Server.KeyFile, pki.CAFile, verify)
	}
	return []credentialCase{{
		name:    "user and password",
		conf:    []string{`authorization { user: till7, password: "s3cret-pw" }`},
		admin:   []nats.Option{nats.UserInfo("till7", "s3cret-pw")},
		good:    natsjs.Options{User: "till7", Password: "s3cret-pw"},
		bad:     natsjs.Options{User: "till7", Password: "wr0ng-pw"},
		wantErr: []string{"Authorization Violation", `logging in with user "till7" with a password`},
		secrets: []string{"s3cret-pw", "wr0ng-pw"},
	}, {
		name:    "token",
		conf:    []string{`authorization { token: "t0ken-s3cret" }`},
		admin:   []nats.Option{nats.Token("t0ken-s3cret")},
		good:    natsjs.Options{Token: "t0ken-s3cret"},
		bad:     natsjs.Options{Token: "t0ken-wr0ng"},
		wantErr: []string{"Authorization Violation", "logging in with a token"},
		secrets: []string{"t0ken-s3cret", "t0ken-wr0ng"},
	}, {
		name:    "NKey seed file",
		conf:    []string{fmt.Sprintf("authorization { users: [ { nkey: %s } ] }", nk.Public)},
		admin:   []nats.Option{nkeyOption(t, nk.SeedFile)},
		good:    natsjs.Options{NKeySeedFile: nk.SeedFile},
		bad:     natsjs.Options{NKeySeedFile: otherNK.SeedFile},
		wantErr: []string{"Authorization Violation", "logging in with the NKey seed file " + otherNK.SeedFile},
		secrets: []string{nk.Seed, otherNK.Seed},
	}, {
		name:    "creds file (operator mode)",
		conf:    op.Conf(),
		admin:   []nats.Option{nats.UserCredentials(creds)},
		good:    natsjs.Options{CredsFile: creds},
		bad:     natsjs.Options{CredsFile: foreign},
		wantErr: []string{"Authorization Violation", "logging in with the creds file " + foreign},
		secrets: append(seedsIn(t, creds), seedsIn(t, foreign)...),
	}, {
		name:    "TLS",
		conf:    []string{serverTLS(false)},
		admin:   []nats.Option{nats.Secure(tlsConfig(pki.CAFile, nil))},
		good:    natsjs.Options{TLS: tlsConfig(pki.CAFile, nil)},
		bad:     natsjs.Options{TLS: tlsConfig(pki.OtherCAFile, nil)},
		wantErr: []string{"certificate signed by unknown authority"},
	}, {
		name:    "mutual TLS",
		conf:    []string{serverTLS(true)},
		admin:   []nats.Option{nats.Secure(tlsConfig(pki.CAFile, &pki.Client))},
		good:    natsjs.Options{TLS: tlsConfig(pki.CAFile, &pki.Client)},
		bad:     natsjs.Options{TLS: tlsConfig(pki.CAFile, &pki.Rogue)},
		wantErr: []string{"logging in with a client certificate"},
		secrets: append(keyBody(t, pki.Client.KeyFile), keyBody(t, pki.Rogue.KeyFile)...),
	}}
}

// TestCredentialsAsAFleetUsesThem: against nats-server, for each way of
// logging in, a Publisher with the right credentials publishes into the
// stream, and one with wrong ones fails Connect with an error that says
// what was refused and with what; a relay with the wrong ones says so, and
// neither its error nor its log holds a secret.
func TestCredentialsAsAFleetUsesThem(t *testing.T) {
	for _, c := range credentialCases(t) {
		t.Run(c.name, func(t *testing.T) {
			n := harness.StartNATSWith(t, c.conf)
			url := "nats://" + n.Addr
			nc, err := nats.Connect(url, c.admin...)
			require.NoError(t, err)
			defer nc.Close()
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			st, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "POS", Subjects: []string{"pos.>"}})
			require.NoError(t, err)

			c.good.Servers = []string{url}
			pub, err := natsjs.New(c.good)
			require.NoError(t, err)
			require.NoError(t, pub.Connect(context.Background()))
			defer pub.Disconnect()
			tok := pub.Publish("pos/orders", []byte(`{"specversion":"1.0","id":"ev-1","source":"/t"}`))
			select {
			case <-tok.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("no PubAck")
			}
			require.NoError(t, tok.Error())
			require.Equal(t, []string{"ev-1"}, msgIDs(stored(t, st)))

			c.bad.Servers = []string{url}
			bad, err := natsjs.New(c.bad)
			require.NoError(t, err)
			err = bad.Connect(context.Background())
			require.Error(t, err)
			for _, want := range c.wantErr {
				require.ErrorContains(t, err, want)
			}
			noSecret(t, c.secrets, "Connect's error", err.Error())

			var logs harness.LogBuffer
			ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"),
				outbox.Options{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			require.NoError(t, err)
			defer ob.Close()
			commit(t, ob, "pos/orders", 1)
			r := runRelay(t, ob, bad, outbox.EnvelopeCloudEvents)
			waitFor(t, 10*time.Second, "the relay says why it cannot connect", func() bool {
				st, err := r.Stats(context.Background())
				require.NoError(t, err)
				return strings.Contains(st.LastError, c.wantErr[0]) && strings.Contains(logs.String(), c.wantErr[0])
			})
			rs, err := r.Stats(context.Background())
			require.NoError(t, err)
			noSecret(t, c.secrets, "RelayStats.LastError", rs.LastError)
			noSecret(t, c.secrets, "the relay's log", logs.String())
		})
	}
}

// noSecret fails t if text holds any of secrets.
func noSecret(t *testing.T, secrets []string, where, text string) {
	t.Helper()
	for _, s := range secrets {
		require.NotEmpty(t, s)
		require.NotContains(t, text, s, "a secret in %s", where)
	}
}

func nkeyOption(t *testing.T, seedFile string) nats.Option {
	o, err := nats.NkeyOptionFromSeed(seedFile)
	require.NoError(t, err)
	return o
}

// seedsIn are the NKey seeds in a creds file.
func seedsIn(t *testing.T, file string) []string {
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var seeds []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "SU") {
			seeds = append(seeds, strings.TrimSpace(l))
		}
	}
	require.NotEmpty(t, seeds)
	return seeds
}

// keyBody is the base64 lines of a PEM private key.
func keyBody(t *testing.T, file string) []string {
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "-----") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestExpiredCredentialsSaid: when the user JWT of a creds file expires,
// the server ends the connection saying so, and the Publisher tells the
// relay why (outbox.LossExplainer) rather than only that it was lost; the
// next Connect is refused, naming the creds file.
func TestExpiredCredentialsSaid(t *testing.T) {
	op := natsauth.NewOperator(t)
	n := harness.StartNATSWith(t, op.Conf())
	expires := time.Now().Add(2 * time.Second).Truncate(time.Second)
	creds := op.ExpiringCreds(t, "till-7", expires)
	pub, err := natsjs.New(natsjs.Options{Servers: []string{"nats://" + n.Addr}, CredsFile: creds})
	require.NoError(t, err)
	var le outbox.LossExplainer = pub
	require.NoError(t, pub.Connect(context.Background()))
	defer pub.Disconnect()
	require.NoError(t, le.LostReason(), "connected: no reason")
	select {
	case <-pub.ConnectionLost():
	case <-time.After(10 * time.Second):
		t.Fatal("the server kept the connection of an expired user")
	}
	require.ErrorContains(t, le.LostReason(), "ended the connection: nats: authentication expired")
	require.ErrorIs(t, le.LostReason(), nats.ErrAuthExpired)
	// A JWT's expiry is in whole seconds: within its last one it still
	// logs in.
	waitFor(t, 5*time.Second, "the JWT's expiry second past", func() bool { return time.Now().Unix() > expires.Unix() })
	err = pub.Connect(context.Background())
	require.ErrorContains(t, err, "logging in with the creds file "+creds)
	noSecret(t, seedsIn(t, creds), "Connect's error", err.Error())
}
