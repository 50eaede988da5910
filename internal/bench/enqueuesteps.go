package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox"
)

// stepNames are the steps from the bare row to Enqueue, each one more
// part of the outbox's schema than the one before: the message's own
// fields, the table's other columns, its CHECK, its indexes, its trigger
// (the outbox table itself, through SQL), then the library's Go side.
var stepNames = []string{"bare", "plain", "columns", "check", "indexes", "trigger", "library"}

// enqueueSteps measures what each step costs, one transaction at a time:
// the steps take turns transaction by transaction, in a new random order
// each turn, and each step's figure is the median time of its transactions.
// A median leaves out the checkpoints (every few hundred transactions, a
// few milliseconds each, charged to whichever transaction ran into one),
// which is what makes rounds of hundreds of transactions disagree by as much
// as the differences they measure: step by step, a part of the schema that
// costs a microsecond shows. The rounds' ratios, checkpoints shared, stay
// the judge of throughput.
//
// The steps' tables are made from the outbox table's own SQL as the file
// holds it, so the steps follow the schema.
func (r *runner) enqueueSteps(ctx context.Context, ob *outbox.Outbox, mode string, variants []enqueueVariant, cycles int) error {
	tables, err := stepTables(ctx, ob.DB())
	if err != nil {
		return fmt.Errorf("%s steps: %w", mode, err)
	}
	pl := payload(0, payloadLen)
	byKey := map[string]func(context.Context, int) error{}
	for _, v := range variants {
		byKey[v.key] = v.tx
	}
	for step, table := range tables {
		st, err := ob.DB().PrepareContext(ctx, `INSERT INTO `+table+` (id, topic, payload, type, created_at) VALUES (?, ?, ?, ?, ?)`)
		if err != nil {
			return fmt.Errorf("%s steps: %w", mode, err)
		}
		defer st.Close()
		byKey[step] = floorTx(ob, st, plainRow(pl))
	}
	order := slices.Clone(stepNames)
	times := make(map[string][]float64, len(order))
	rng := rand.New(rand.NewPCG(1, 2))
	n := 0
	// A tenth of the turns warm up, untimed.
	for turn := -cycles / 10; turn < cycles && ctx.Err() == nil; turn++ {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, step := range order {
			n++
			start := time.Now()
			if err := byKey[step](ctx, n); err != nil {
				return fmt.Errorf("%s step %s: %w", mode, step, err)
			}
			if turn >= 0 {
				times[step] = append(times[step], float64(time.Since(start))/float64(time.Microsecond))
			}
		}
	}
	med := map[string]float64{}
	for _, step := range stepNames {
		med[step] = median(times[step])
		r.rep.set("enqueue_"+mode+"_step_"+step+"_us", med[step])
	}
	r.rep.set("enqueue_"+mode+"_pertx_plain_vs_bare", med["bare"]/med["plain"])
	r.rep.set("enqueue_"+mode+"_pertx_library_vs_bare", med["bare"]/med["library"])
	var line strings.Builder
	for i, step := range stepNames {
		if i == 0 {
			fmt.Fprintf(&line, "%s %.1f µs", step, med[step])
			continue
		}
		fmt.Fprintf(&line, ", %s %+.1f", step, med[step]-med[stepNames[i-1]])
	}
	r.progress("  %s, per transaction (median): %s; library / bare %.2f", mode, line.String(), med["bare"]/med["library"])
	return nil
}

// stepTables makes the steps' tables from the outbox table's SQL and
// returns each schema step's table: "plain" is the bench's own, "trigger"
// the outbox table itself.
func stepTables(ctx context.Context, db *sql.DB) (map[string]string, error) {
	var table string
	if err := db.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'outbox'`).Scan(&table); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'outbox' AND sql IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	var indexes []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return nil, err
		}
		indexes = append(indexes, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	unchecked, err := withoutChecks(table)
	if err != nil {
		return nil, err
	}
	ddl := []string{
		renameTable(unchecked, "outbox_step_columns"),
		renameTable(table, "outbox_step_check"),
		renameTable(table, "outbox_step_indexes"),
	}
	for i, ix := range indexes {
		// CREATE [UNIQUE] INDEX name ON outbox (…) becomes one on the step's
		// table, under a name of its own.
		on := strings.Index(ix, " ON outbox ")
		if on < 0 {
			return nil, fmt.Errorf("index not on outbox: %s", ix)
		}
		head := "CREATE INDEX"
		if strings.HasPrefix(ix, "CREATE UNIQUE INDEX") {
			head = "CREATE UNIQUE INDEX"
		}
		ddl = append(ddl, fmt.Sprintf("%s IF NOT EXISTS outbox_step_index_%d ON outbox_step_indexes %s", head, i, ix[on+len(" ON outbox "):]))
	}
	for _, s := range ddl {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return nil, fmt.Errorf("%w: %s", err, s)
		}
	}
	return map[string]string{
		"plain":   "outbox_plain",
		"columns": "outbox_step_columns",
		"check":   "outbox_step_check",
		"indexes": "outbox_step_indexes",
		"trigger": "outbox",
	}, nil
}

// renameTable turns CREATE TABLE outbox (…) into CREATE TABLE IF NOT
// EXISTS name (…).
func renameTable(create, name string) string {
	return strings.Replace(create, "CREATE TABLE outbox ", "CREATE TABLE IF NOT EXISTS "+name+" ", 1)
}

// withoutChecks removes every CHECK (…) constraint from a CREATE TABLE
// statement, minding parentheses and quoted strings.
func withoutChecks(create string) (string, error) {
	var out strings.Builder
	s := create
	for {
		i := strings.Index(s, "CHECK (")
		if i < 0 {
			out.WriteString(s)
			return out.String(), nil
		}
		out.WriteString(s[:i])
		depth, quoted, end := 0, false, -1
		for j := i + len("CHECK "); j < len(s) && end < 0; j++ {
			switch c := s[j]; {
			case c == '\'':
				quoted = !quoted
			case quoted:
			case c == '(':
				depth++
			case c == ')':
				depth--
				if depth == 0 {
					end = j + 1
				}
			}
		}
		if end < 0 {
			return "", errors.New("unbalanced CHECK in the outbox table's SQL")
		}
		s = s[end:]
	}
}
