package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox"
)

func (a *app) requeueCmd() *cobra.Command {
	var db dbFlags
	var ids []string
	var allDead bool
	cmd := &cobra.Command{
		Use:   "requeue --db PATH (--id ID... | --all-dead)",
		Short: "Make dead messages pending again",
		Long: `requeue makes dead messages pending again, with their attempts reset; the
relay publishes them on its next pass. Every --id must name a dead message,
or nothing is changed.`,
		Example: `  outboxctl requeue --db till.db --id 019ad2f4-5c1e-7a3b-9f00-3c5e8d1b2a47
  outboxctl requeue --db till.db --all-dead`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (len(ids) == 0) == !allDead {
				return usageError{errors.New("give either --id (one or more) or --all-dead")}
			}
			ob, err := db.open(cmd.Context(), a, existing)
			if err != nil {
				return err
			}
			defer ob.Close()
			var n int64
			if allDead {
				n, err = ob.RequeueDead(cmd.Context())
			} else {
				for _, id := range ids {
					r, err := ob.Get(cmd.Context(), id)
					if err != nil {
						return db.explain(err)
					}
					if r.State != outbox.StateDead {
						return fmt.Errorf("message %s is %s, not dead; nothing requeued", id, r.State)
					}
				}
				n, err = ob.Requeue(cmd.Context(), ids...)
			}
			if err != nil {
				return db.explain(err)
			}
			fmt.Fprintf(a.stdout, "requeued %d message(s)\n", n)
			return nil
		},
	}
	db.register(cmd)
	cmd.Flags().StringSliceVar(&ids, "id", nil, "id of a dead message (repeat or comma-separate)")
	cmd.Flags().BoolVar(&allDead, "all-dead", false, "requeue every dead message")
	return cmd
}
