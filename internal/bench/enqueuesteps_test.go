package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox"
)

func TestWithoutChecks(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"none", "CREATE TABLE t (a INTEGER)", "CREATE TABLE t (a INTEGER)"},
		{"nested", "CREATE TABLE t (a TEXT CHECK (length(a) > 0 AND instr(a, '+') = 0), b INTEGER)", "CREATE TABLE t (a TEXT , b INTEGER)"},
		{"quoted parenthesis", "CREATE TABLE t (a TEXT CHECK (a <> ')' AND a <> '('), b TEXT CHECK (b <> ''))", "CREATE TABLE t (a TEXT , b TEXT )"},
		{"escaped quote", "CREATE TABLE t (a TEXT CHECK (a <> 'it''s)'), b INTEGER)", "CREATE TABLE t (a TEXT , b INTEGER)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := withoutChecks(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	for _, in := range []string{"CREATE TABLE t (a TEXT CHECK (length(a) > 0", "CREATE TABLE t (a TEXT CHECK (a <> ')))"} {
		_, err := withoutChecks(in)
		require.Error(t, err, in)
	}
}

// TestStepTables checks that each step's table holds what its step names,
// made from the real schema: the columns step takes any topic, the check
// step refuses a wildcard, the indexes step refuses a chosen id twice, and
// every step takes the row the bench writes.
func TestStepTables(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	ob, err := outbox.Open(ctx, filepath.Join(t.TempDir(), "steps.db"), outbox.Options{ReserveBytes: -1})
	require.NoError(t, err)
	defer ob.Close()
	db := ob.DB()
	_, err = db.ExecContext(ctx, `CREATE TABLE outbox_plain (seq INTEGER PRIMARY KEY, id TEXT, topic TEXT, payload BLOB, type TEXT, created_at INTEGER)`)
	require.NoError(t, err)

	tables, err := stepTables(ctx, db)
	require.NoError(t, err)
	for _, step := range stepNames[1 : len(stepNames)-1] {
		require.Contains(t, tables, step)
	}
	// Made twice (a second run on the same file), nothing fails.
	_, err = stepTables(ctx, db)
	require.NoError(t, err)

	insert := func(table, id, topic string) error {
		_, err := db.ExecContext(ctx, `INSERT INTO `+table+` (id, topic, payload, type, created_at) VALUES (?, ?, ?, ?, ?)`, id, topic, []byte(`{}`), benchType, 1)
		return err
	}
	for step, table := range tables {
		require.NoError(t, insert(table, outbox.NewID(), benchTopic), step)
	}

	var sqlText string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE name = 'outbox_step_columns'`).Scan(&sqlText))
	require.NotContains(t, sqlText, "CHECK")
	require.NoError(t, insert("outbox_step_columns", outbox.NewID(), "a/+"))
	require.Error(t, insert("outbox_step_check", outbox.NewID(), "a/+"))

	var onOutbox, onStep int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'outbox' AND sql IS NOT NULL`).Scan(&onOutbox))
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'outbox_step_indexes'`).Scan(&onStep))
	require.Positive(t, onOutbox)
	require.Equal(t, onOutbox, onStep)
	require.NoError(t, insert("outbox_step_check", "order-1", benchTopic))
	require.NoError(t, insert("outbox_step_check", "order-1", benchTopic), "no index on the check step")
	require.NoError(t, insert("outbox_step_indexes", "order-1", benchTopic))
	err = insert("outbox_step_indexes", "order-1", benchTopic)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "UNIQUE"), err.Error())

	var triggers int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND tbl_name LIKE 'outbox_step_%'`).Scan(&triggers))
	require.Zero(t, triggers, "no step before the trigger step has a trigger")
}
