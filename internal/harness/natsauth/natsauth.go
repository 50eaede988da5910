// Package natsauth makes the credentials a NATS fleet logs in with, for
// tests against a real nats-server: an operator with one account that has
// JetStream (operator mode, the way nsc sets a fleet up) and its users'
// creds files, and NKey users. It is a package of its own, apart from
// internal/harness, so that only tests link the JWT library.
package natsauth

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// Operator is an operator and one account of it with JetStream, unlimited.
type Operator struct {
	dir     string
	jwt     string
	account nkeys.KeyPair
	accJWT  string
	accPub  string
	sysJWT  string
	sysPub  string
}

// NewOperator makes an operator and its account, writing their JWTs in a
// directory of tb's.
func NewOperator(tb harness.TB) *Operator {
	tb.Helper()
	op := mustKey(tb, nkeys.CreateOperator)
	opPub := mustPub(tb, op)
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "fleet"
	opJWT, err := oc.Encode(op)
	check(tb, err, "operator JWT")

	acc := mustKey(tb, nkeys.CreateAccount)
	accPub := mustPub(tb, acc)
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "tills"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accJWT, err := ac.Encode(op)
	check(tb, err, "account JWT")

	// JetStream needs a system account in operator mode.
	sys := mustKey(tb, nkeys.CreateAccount)
	sysPub := mustPub(tb, sys)
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(op)
	check(tb, err, "system account JWT")

	o := &Operator{dir: tb.TempDir(), account: acc, accJWT: accJWT, accPub: accPub, sysJWT: sysJWT, sysPub: sysPub}
	o.jwt = o.write(tb, "operator.jwt", []byte(opJWT))
	return o
}

// Conf is what a nats-server configuration needs to trust the operator and
// know its accounts: the operator's JWT, the system account, and both
// accounts preloaded into a memory resolver.
func (o *Operator) Conf() []string {
	return []string{
		fmt.Sprintf("operator: %q", o.jwt),
		"system_account: " + o.sysPub,
		"resolver: MEMORY",
		fmt.Sprintf("resolver_preload: { %s: %q, %s: %q }", o.accPub, o.accJWT, o.sysPub, o.sysJWT),
	}
}

// Creds issues a user of the account, signed by it, and writes its creds
// file (the user JWT and its NKey seed, as nsc writes it); it returns the
// file's path.
func (o *Operator) Creds(tb harness.TB, name string) string {
	tb.Helper()
	return o.creds(tb, name, o.account, "", time.Time{})
}

// ExpiringCreds is Creds for a user whose JWT expires at expires: the
// server ends its connection then.
func (o *Operator) ExpiringCreds(tb harness.TB, name string, expires time.Time) string {
	tb.Helper()
	return o.creds(tb, name, o.account, "", expires)
}

// ForeignCreds issues a user of the account signed by a key that is not
// one of the account's: a creds file well formed and not trusted.
func (o *Operator) ForeignCreds(tb harness.TB, name string) string {
	tb.Helper()
	return o.creds(tb, name, mustKey(tb, nkeys.CreateAccount), o.accPub, time.Time{})
}

// creds writes a creds file of a user signed by signer; issuerAccount, if
// set, is the account whose signing key signer claims to be; expires, if
// set, is when the user's JWT expires.
func (o *Operator) creds(tb harness.TB, name string, signer nkeys.KeyPair, issuerAccount string, expires time.Time) string {
	tb.Helper()
	u := mustKey(tb, nkeys.CreateUser)
	uc := jwt.NewUserClaims(mustPub(tb, u))
	uc.Name = name
	uc.IssuerAccount = issuerAccount
	if !expires.IsZero() {
		uc.Expires = expires.Unix()
	}
	userJWT, err := uc.Encode(signer)
	check(tb, err, "user JWT")
	seed, err := u.Seed()
	check(tb, err, "user seed")
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	check(tb, err, "creds file")
	return o.write(tb, name+".creds", creds)
}

// NKeyUser is a user who logs in with an NKey: its public key, for the
// server's configuration, its seed file, and the seed itself, for tests
// that check it is never shown.
type NKeyUser struct {
	Public   string
	SeedFile string
	Seed     string
}

// NewNKeyUser makes an NKey user, writing its seed file in a directory of
// tb's.
func NewNKeyUser(tb harness.TB) NKeyUser {
	tb.Helper()
	u := mustKey(tb, nkeys.CreateUser)
	seed, err := u.Seed()
	check(tb, err, "user seed")
	file := filepath.Join(tb.TempDir(), "till.nk")
	check(tb, os.WriteFile(file, append(seed, '\n'), 0o600), "seed file")
	return NKeyUser{Public: mustPub(tb, u), SeedFile: file, Seed: string(seed)}
}

func (o *Operator) write(tb harness.TB, name string, b []byte) string {
	tb.Helper()
	p := filepath.Join(o.dir, name)
	check(tb, os.WriteFile(p, b, 0o600), name)
	return p
}

func mustKey(tb harness.TB, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	tb.Helper()
	kp, err := create()
	check(tb, err, "nkey")
	return kp
}

func mustPub(tb harness.TB, kp nkeys.KeyPair) string {
	tb.Helper()
	pub, err := kp.PublicKey()
	check(tb, err, "nkey public key")
	return pub
}

func check(tb harness.TB, err error, what string) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("natsauth: %s: %v", what, err)
	}
}
