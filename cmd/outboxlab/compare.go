package main

import (
	"github.com/spf13/cobra"

	"github.com/edgeoutbox/outbox/internal/bench"
	"github.com/edgeoutbox/outbox/internal/cli"
)

func benchCompareCmd(a *cli.App) *cobra.Command {
	return &cobra.Command{
		Use:   "compare A.json B.json | A.json… -- B.json…",
		Short: "Compare stored runs of bench --json, key by key",
		Long: `compare reads reports that bench --json wrote (docs/bench keeps some) and
prints, section by section, every figure that each run on both sides
measured: each run's value and the ratio of the means, B / A, as Markdown
tables. With several runs a side, put -- between the sides. A figure that
any run lacks (a section it did not run, Mosquitto absent, a key newer
than the run) is left out.`,
		Example: `  outboxlab bench compare docs/bench/2026-12-04-before-1.json docs/bench/2026-12-04-after-1.json
  outboxlab bench compare docs/bench/2026-12-04-before-*.json -- docs/bench/2026-12-04-after-*.json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			aPaths, bPaths, err := compareSides(args, cmd.ArgsLenAtDash())
			if err != nil {
				return err
			}
			var sides [2][]*bench.StoredReport
			for i, paths := range [][]string{aPaths, bPaths} {
				for _, p := range paths {
					r, err := bench.LoadReport(p)
					if err != nil {
						return err
					}
					sides[i] = append(sides[i], r)
				}
			}
			return bench.Compare(a.Stdout, sides[0], sides[1])
		},
	}
}

// compareSides splits the arguments at the dash, or, without one, takes
// exactly two files.
func compareSides(args []string, dash int) (a, b []string, err error) {
	switch {
	case dash < 0 && len(args) == 2:
		return args[:1], args[1:], nil
	case dash > 0 && dash < len(args):
		return args[:dash], args[dash:], nil
	}
	return nil, nil, cli.Usagef("give two reports (A.json B.json), or one or more a side with -- between (A1.json A2.json -- B1.json B2.json)")
}
