package outbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/edgeoutbox/outbox/internal/migrate"
)

// SchemaVersion is the newest schema version this code knows. A database
// whose schema is newer is refused with ErrSchemaTooNew, never downgraded.
const SchemaVersion = 10

// The schema is SQL, in schema/: outbox.sql is the newest, what a new
// database gets in one step; outbox/NNN_*.sql brings version NNN-1 to NNN and
// is never edited once released; recount.sql counts the limits' counters
// again, on every Open. The consumer's inbox has its own, in
// consumer/schema/.
//
//go:embed schema/outbox.sql schema/recount.sql schema/outbox/*.sql
var schemaFiles embed.FS

var (
	outboxSchema     = schemaFile("schema/outbox.sql")
	outboxMigrations = schemaDir("schema/outbox")
	recountSQL       = schemaFile("schema/recount.sql")
)

func schemaFile(name string) string { return migrate.File(schemaFiles, name) }

// schemaDir returns the migrations in dir, in the order of their numbers.
func schemaDir(dir string) []string { return migrate.Steps(schemaFiles, dir) }

// migrateOutbox applies the outbox's missing migrations.
func migrateOutbox(ctx context.Context, db *sql.DB) error {
	return migrate.SQLite(ctx, db, "outbox_schema", outboxMigrations, outboxSchema, ErrSchemaTooNew)
}

// outboxNames are the names of the schema's tables and views.
var outboxNames = func() []string {
	return append(migrate.NamesAfter(outboxSchema, "CREATE TABLE ", true, ""),
		migrate.NamesAfter(outboxSchema, "CREATE VIEW ", true, "")...)
}()

// foreignTable returns an error matching ErrForeignTable when db has no
// outbox schema but a table or view of one of its names: creating the
// schema would fail on it ("table outbox already exists"), and an operator
// told "no outbox, create one" would try just that.
func foreignTable(ctx context.Context, db querier) error {
	var typ, name string
	err := db.QueryRowContext(ctx, `SELECT type, name FROM sqlite_schema
		WHERE type IN ('table', 'view') AND name IN (SELECT value FROM json_each(?))
		AND NOT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'outbox_schema')
		ORDER BY name <> 'outbox', name LIMIT 1`, `["`+strings.Join(outboxNames, `","`)+`"]`).Scan(&typ, &name)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	return &reasonError{fmt.Sprintf("this database has a %s named %s that is not an outbox's (no outbox_schema table): use another file, or rename that %s", typ, name, typ), ErrForeignTable}
}

// readSchemaVersion reports the schema version without changing anything;
// 0 means the database has no outbox schema.
func readSchemaVersion(ctx context.Context, db querier) (int, error) {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'outbox_schema'`).Scan(&n); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	var version int
	err := db.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM outbox_schema`).Scan(&version)
	return version, err
}
