package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/cli"
)

func initCmd(a *cli.App) *cobra.Command {
	var db dbFlags
	cmd := &cobra.Command{
		Use:   "init --db PATH [--max-pending-messages N] [--max-pending-bytes B] [--max-payload-bytes B]",
		Short: "Create or migrate the outbox schema, and set its limits",
		Long: `init creates the database file (readable by its owner only) if it does not
exist, and creates or migrates the outbox schema in it. It is idempotent.
A database whose schema is newer than this outboxctl is refused, never
downgraded.

--max-pending-messages and --max-pending-bytes set the limits stored in the
database, which every writer is held to (plain SQL included): an INSERT
beyond them fails with "outbox full: pending limit reached". 0 keeps what is
stored, a negative value removes the limit. status shows them.

--max-payload-bytes sets the payload limit stored in the database (a new
one stores 262144, at most 199229440): an INSERT of a longer payload fails
with "outbox: payload too large", and the relay parks a longer one already
stored dead without reading it. 0 keeps what is stored.`,
		Example: `  outboxctl init --db /var/lib/till/till.db
  outboxctl init --db /var/lib/till/till.db --max-pending-messages 100000 --max-pending-bytes 64000000
  outboxctl init --db /var/lib/till/till.db --max-pending-bytes -1   # remove the byte limit`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, statErr := os.Stat(db.path)
			ob, st, err := db.openStats(cmd.Context(), a, create)
			if err != nil {
				return err
			}
			defer ob.Close()
			what := "existing file"
			if errors.Is(statErr, os.ErrNotExist) {
				what = "new file"
			}
			fmt.Fprintf(a.Stdout, "%s: outbox schema version %d (%s), limits: %s, payloads up to %s\n", db.path, st.SchemaVersion, what,
				limitsText(st.MaxPendingMessages, st.MaxPendingBytes), bytesText(int64(ob.MaxPayloadBytes())))
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().Int64Var(&db.maxMessages, "max-pending-messages", 0, "pending messages at most (0 keeps the stored limit, negative removes it)")
	cmd.Flags().Int64Var(&db.maxBytes, "max-pending-bytes", 0, "pending payload bytes at most (0 keeps the stored limit, negative removes it)")
	cmd.Flags().IntVar(&db.maxPayload, "max-payload-bytes", 0, "bytes of one payload at most (0 keeps the stored limit)")
	return cmd
}
