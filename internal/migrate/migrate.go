// Package migrate brings a schema kept as numbered SQL files up to date:
// the steps from the version a database has to the newest, in one
// transaction, keeping the application's own triggers on tables a step
// rebuilds.
package migrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// File returns the file name of fsys, an embedded schema; a missing file is
// a bug of the build, and panics.
func File(fsys fs.FS, name string) string {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		panic("outbox: embedded schema: " + err.Error())
	}
	return string(b)
}

// Steps returns the migrations in dir of fsys, NNN_*.sql, in the order of
// their numbers; a gap in the numbers panics.
func Steps(fsys fs.FS, dir string) []string {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		panic("outbox: embedded schema: " + err.Error())
	}
	var steps []string
	for i, e := range entries { // ReadDir sorts by name
		if want := fmt.Sprintf("%03d_", i+1); !strings.HasPrefix(e.Name(), want) {
			panic("outbox: embedded schema: " + dir + "/" + e.Name() + " out of sequence, want " + want + "*")
		}
		steps = append(steps, File(fsys, dir+"/"+e.Name()))
	}
	return steps
}

// nowMillisSQL is the current time in Unix milliseconds, written with
// julianday so that writers on old SQLite libraries (no unixepoch) can use
// the table contract too.
const nowMillisSQL = `CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)`

// SQLite brings a schema whose version is kept in table up to
// len(steps): steps[i] goes from version i to i+1; a database without the
// schema gets fresh instead, when given, which creates the newest at once
// (running every migration would create old tables only to drop them,
// leaving their pages free in the file). All run in one IMMEDIATE
// transaction, so a crash leaves the old schema or the new one, and two
// processes migrating at once do not both start from the same version.
func SQLite(ctx context.Context, db *sql.DB, table string, steps []string, fresh string, tooNew error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// auto_vacuum can only change before the first table exists; on a
	// fresh database it lets retention hand space back to the file system.
	var tables int
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema`).Scan(&tables); err != nil {
		return err
	}
	if tables == 0 {
		if _, err := conn.ExecContext(ctx, `PRAGMA auto_vacuum = INCREMENTAL`); err != nil {
			return err
		}
	}
	// A migration that rebuilds a table renames the new one into place.
	// Since SQLite 3.26 a rename checks every trigger and view of the
	// schema, and one of the application's that names the table (a trigger
	// on orders that inserts into outbox) names a table that, at that
	// moment, does not exist: the rename fails. The legacy behaviour leaves
	// other objects alone; they name the table again once it is back.
	if _, err := conn.ExecContext(ctx, `PRAGMA legacy_alter_table = ON`); err != nil {
		return err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA legacy_alter_table = OFF`)
	// BEGIN IMMEDIATE by hand: the caller's DSN may not ask for it.
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return err
	}
	if err := migrateLocked(ctx, conn, table, steps, fresh, tooNew); err != nil {
		conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return err
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return err
	}
	return nil
}

func migrateLocked(ctx context.Context, conn *sql.Conn, table string, steps []string, fresh string, tooNew error) error {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
		version    INTEGER NOT NULL,
		applied_at INTEGER NOT NULL DEFAULT (`+nowMillisSQL+`))`); err != nil {
		return err
	}
	var version int
	if err := conn.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+table).Scan(&version); err != nil {
		return err
	}
	if version > len(steps) {
		return fmt.Errorf("%w: %s says schema version %d, this code knows up to %d", tooNew, table, version, len(steps))
	}
	if version == len(steps) {
		return nil
	}
	if version == 0 && fresh != "" {
		if _, err := conn.ExecContext(ctx, fresh); err != nil {
			return fmt.Errorf("%s: creating schema %d: %w", table, len(steps), err)
		}
		_, err := conn.ExecContext(ctx, `INSERT INTO `+table+` (version) VALUES (?)`, len(steps))
		return err
	}
	kept, err := foreignTriggers(ctx, conn, steps, version, fresh)
	if err != nil {
		return err
	}
	for v := version; v < len(steps); v++ {
		if _, err := conn.ExecContext(ctx, steps[v]); err != nil {
			return fmt.Errorf("%s migration %d: %w", table, v+1, err)
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO `+table+` (version) VALUES (?)`, v+1); err != nil {
			return err
		}
	}
	return restoreTriggers(ctx, conn, table, kept)
}

// NamesAfter returns the names (SQL words: letters, digits, _) that follow
// each prefix in sql, at the start of a line if lineStart, skipping an
// optional "IF NOT EXISTS ", and followed by end if end is not empty. (Not
// a regexp: the package would add about 30 KB to every program.)
func NamesAfter(sql, prefix string, lineStart bool, end string) []string {
	var names []string
	for i := 0; ; {
		j := strings.Index(sql[i:], prefix)
		if j < 0 {
			return names
		}
		at := i + j
		i = at + len(prefix)
		if lineStart && at > 0 && sql[at-1] != '\n' {
			continue
		}
		rest, ok := strings.CutPrefix(sql[i:], "IF NOT EXISTS ")
		name, found := nameAt(rest, end)
		if !found && ok {
			name, found = nameAt(sql[i:], end)
		}
		if found {
			names = append(names, name)
		}
	}
}

// nameAt returns the name at the start of s, if end follows it.
func nameAt(s, end string) (string, bool) {
	n := 0
	for n < len(s) && isWordByte(s[n]) {
		n++
	}
	return s[:n], n > 0 && strings.HasPrefix(s[n:], end)
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// trigger is one trigger of the database, as sqlite_schema keeps it.
type trigger struct{ name, table, sql string }

// foreignTriggers returns the application's triggers on the tables that
// the steps from version on drop and rebuild: DROP TABLE takes a table's
// triggers with it. Triggers that any step or fresh creates are the schema's
// own.
func foreignTriggers(ctx context.Context, conn *sql.Conn, steps []string, version int, fresh string) ([]trigger, error) {
	var rebuilt, own []string
	for _, s := range steps[version:] {
		rebuilt = append(rebuilt, NamesAfter(s, "DROP TABLE ", true, ";")...)
	}
	for _, s := range append(slices.Clone(steps), fresh) {
		own = append(own, NamesAfter(s, "CREATE TRIGGER ", false, "")...)
	}
	if len(rebuilt) == 0 {
		return nil, nil
	}
	rows, err := conn.QueryContext(ctx, `SELECT name, tbl_name, sql FROM sqlite_schema WHERE type = 'trigger' AND sql IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []trigger
	for rows.Next() {
		var t trigger
		if err := rows.Scan(&t.name, &t.table, &t.sql); err != nil {
			return nil, err
		}
		if slices.Contains(rebuilt, t.table) && !slices.Contains(own, t.name) {
			out = append(out, t)
		}
	}
	return out, rows.Err()
}

// restoreTriggers creates again the application's triggers that a
// migration dropped with their table, where the table exists again, and
// checks that they compile on the new schema: SQLite creates a trigger
// without resolving its columns, so one that names a column the new schema
// lacks would otherwise fail every write to the table later.
func restoreTriggers(ctx context.Context, conn *sql.Conn, schemaTable string, kept []trigger) error {
	tables := map[string][]string{}
	for _, t := range kept {
		var gone bool
		if err := conn.QueryRowContext(ctx, `SELECT NOT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'trigger' AND name = ?1)
			AND EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?2)`, t.name, t.table).Scan(&gone); err != nil {
			return err
		}
		if !gone {
			continue
		}
		if _, err := conn.ExecContext(ctx, t.sql); err != nil {
			return fmt.Errorf("%s migration: your trigger %s on %s cannot be created again on the new schema (%w); drop or change it and open the database again", schemaTable, t.name, t.table, err)
		}
		tables[t.table] = append(tables[t.table], t.name)
	}
	for table, names := range tables {
		if err := compileWrites(ctx, conn, table); err != nil {
			return fmt.Errorf("%s migration: one of your triggers on %s (%s) does not compile on the new schema (%w); drop or change it and open the database again",
				schemaTable, table, strings.Join(names, ", "), err)
		}
	}
	return nil
}

// compileWrites prepares, without running, an INSERT, an UPDATE of every
// column and a DELETE on table, which compiles every trigger on it.
func compileWrites(ctx context.Context, conn *sql.Conn, table string) error {
	rows, err := conn.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		return err
	}
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return err
		}
		cols = append(cols, `"`+strings.ReplaceAll(c, `"`, `""`)+`"`)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	set := make([]string, len(cols))
	for i, c := range cols {
		set[i] = c + " = " + c
	}
	q := `"` + strings.ReplaceAll(table, `"`, `""`) + `"`
	for _, stmt := range []string{
		`INSERT INTO ` + q + ` SELECT * FROM ` + q + ` WHERE 0`,
		`UPDATE ` + q + ` SET ` + strings.Join(set, ", ") + ` WHERE 0`,
		`DELETE FROM ` + q + ` WHERE 0`,
	} {
		st, err := conn.PrepareContext(ctx, stmt)
		if err != nil {
			return err
		}
		st.Close()
	}
	return nil
}
