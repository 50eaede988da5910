package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/cli"
)

// dbFlags are the flags of every command that opens a database.
type dbFlags struct {
	path    string
	timeout time.Duration
	// Stored limits to set (init only): 0 keeps, negative removes (but
	// the payload limit, which cannot be removed).
	maxMessages, maxBytes int64
	maxPayload            int
}

func (f *dbFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "db", "", "path of the SQLite database (required)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for a database locked by another process")
}

// openMode says what a command may do to the database it opens.
type openMode int

const (
	// inspect reads only: nothing is created, migrated or written, not
	// even the disk reserve (status, list).
	inspect openMode = iota
	// existing writes to an outbox that must exist, migrating it if it is
	// older (requeue, purge).
	existing
	// create creates the file and schema when missing (init, relay).
	create
)

// open opens the outbox at --db as mode allows.
func (f *dbFlags) open(ctx context.Context, a *cli.App, mode openMode) (*outbox.Outbox, error) {
	if f.path == "" {
		return nil, cli.Usagef("--db is required")
	}
	opts := outbox.Options{
		BusyTimeout: f.timeout,
		MustExist:   mode != create,
		ReadOnly:    mode == inspect,
		Logger:      a.Logger,

		MaxPendingMessages: f.maxMessages,
		MaxPendingBytes:    f.maxBytes,
		MaxPayloadBytes:    f.maxPayload,
	}
	ob, err := outbox.Open(ctx, f.path, opts)
	if err != nil {
		return nil, f.explain(err)
	}
	return ob, nil
}

// openStats opens the outbox at --db as mode allows and reads its Stats;
// the caller closes the outbox.
func (f *dbFlags) openStats(ctx context.Context, a *cli.App, mode openMode) (*outbox.Outbox, outbox.Stats, error) {
	ob, err := f.open(ctx, a, mode)
	if err != nil {
		return nil, outbox.Stats{}, err
	}
	st, err := ob.Stats(ctx)
	if err != nil {
		ob.Close()
		return nil, outbox.Stats{}, f.explain(err)
	}
	return ob, st, nil
}

// explain turns an error about the database into one line an operator can
// act on.
func (f *dbFlags) explain(err error) error {
	msg := err.Error()
	dir := filepath.Dir(f.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, derr := os.Stat(dir); errors.Is(derr, os.ErrNotExist) {
			return fmt.Errorf("%s: the directory %s does not exist (create it first, or give another --db)", f.path, dir)
		}
		return fmt.Errorf("%s: no such file", f.path)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%s is a directory: --db takes the database file, e.g. %s", f.path, filepath.Join(f.path, "till.db"))
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%s: %s is not a directory", f.path, dir)
	case errors.Is(err, outbox.ErrForeignTable):
		// The library's words, which name the table, without its prefix.
		msg = strings.TrimPrefix(strings.TrimPrefix(msg, "outbox: open "+f.path+": "), "outbox: ")
		return fmt.Errorf("%s: %s", f.path, msg)
	case errors.Is(err, outbox.ErrNoSchema):
		return fmt.Errorf("%s has no outbox (create one with: outboxctl init --db %s)", f.path, f.path)
	case strings.Contains(msg, "not a SQLite database"), strings.Contains(msg, "file is not a database"):
		return fmt.Errorf("%s is not a SQLite database", f.path)
	case strings.Contains(msg, "malformed"), strings.Contains(msg, "SQLITE_CORRUPT"):
		return fmt.Errorf("%s is corrupt (SQLite: database disk image is malformed); move it aside and restore a backup", f.path)
	case strings.Contains(msg, "database is locked"), strings.Contains(msg, "SQLITE_BUSY"):
		return fmt.Errorf("%s is locked by another process (waited %s; raise --timeout to wait longer)", f.path, f.timeout)
	case strings.Contains(msg, "readonly"), strings.Contains(msg, "read-only"), errors.Is(err, syscall.EROFS), errors.Is(err, os.ErrPermission),
		strings.Contains(msg, "unable to open database file"):
		return f.whyNotWritable(msg)
	case errors.Is(err, outbox.ErrSchemaTooNew):
		return fmt.Errorf("%s: %s; use a newer outboxctl", f.path, lastPart(msg))
	case errors.Is(err, outbox.ErrSchemaTooOld):
		return fmt.Errorf("%s: %s; outboxctl init --db %s migrates it (stop the relay that uses it first)", f.path, lastPart(msg), f.path)
	}
	return err
}

// whyNotWritable says why SQLite could not open or write the file: it needs
// to write the file and to create PATH-wal and PATH-shm beside it.
func (f *dbFlags) whyNotWritable(msg string) error {
	file, err := os.OpenFile(f.path, os.O_RDWR, 0)
	if err == nil {
		file.Close()
		probe, err := os.CreateTemp(filepath.Dir(f.path), ".outboxctl-probe-*")
		if err == nil {
			probe.Close()
			os.Remove(probe.Name())
			return fmt.Errorf("%s: %s", f.path, lastPart(msg))
		}
	}
	switch {
	case errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%s is on a read-only file system (SQLite needs to write it and create %s-wal and %s-shm)", f.path, filepath.Base(f.path), filepath.Base(f.path))
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: no permission to write it or its directory (SQLite needs to create %s-wal and %s-shm)", f.path, filepath.Base(f.path), filepath.Base(f.path))
	}
	return fmt.Errorf("%s cannot be written: %v", f.path, err)
}

// lastPart drops the "outbox: open PATH:" prefixes of a wrapped error.
func lastPart(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}
