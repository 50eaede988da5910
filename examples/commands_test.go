package examples_test

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

var (
	commandSent     = regexp.MustCompile(`(?m)^sent command id=(\S+) item=(\S+) price_cents=(\d+)$`)
	commandAnswer   = regexp.MustCompile(`(?m)^answer command=(\S+) status=(\S+)(.*)$`)
	commandsSummary = regexp.MustCompile(`(?m)^answered (\d+) of (\d+), duplicates (\d+)$`)
	tillSettled     = regexp.MustCompile(`(?m)^(\S+) command=(\S+) type=(\S+)$`)
	tillPrice       = regexp.MustCompile(`(?m)^price item=(\S+) price_cents=(\d+) command=(\S+)$`)
)

// TestCommands runs the commands example against a Mosquitto: the
// backend sends three price changes to the till over MQTT 5 with a
// Response Topic and Correlation Data, the till applies each once and
// answers through its outbox, and the backend gets each answer, "applied",
// once; the till's tables changed once per command.
func TestCommands(t *testing.T) {
	t.Parallel()
	tillBin, backendBin := build(t, "commands/till"), build(t, "commands/backend")
	mq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	db := t.TempDir() + "/till.db"

	till := start(t, tillBin, "--broker", mq.URL(), "--db", db, "--count", "3")
	till.waitFor(t, "listening on tills/1/commands")
	out := run(t, backendBin, "--broker", mq.URL(), "--count", "3", "--wait", "30s")
	require.Equal(t, []int{3, 3, 0}, numbers(t, commandsSummary, out), "answered, of, duplicates")
	sent := map[string]string{} // command id -> item
	for _, m := range commandSent.FindAllStringSubmatch(out, -1) {
		sent[m[1]] = m[2]
	}
	require.Len(t, sent, 3, out)
	answered := map[string]int{}
	for _, m := range commandAnswer.FindAllStringSubmatch(out, -1) {
		require.Equal(t, "applied", m[2], "answer to %s: %s", m[1], m[0])
		require.Contains(t, m[3], `result={"item":"`+sent[m[1]]+`"`, "the answer carries the handler's result")
		answered[m[1]]++
	}
	require.Len(t, answered, 3, out)
	for id := range sent {
		require.Equal(t, 1, answered[id], "command %s answered once", id)
	}

	tillOut := till.wait(t)
	settled := map[string]int{}
	for _, m := range tillSettled.FindAllStringSubmatch(tillOut, -1) {
		require.Equal(t, "applied", m[1], m[0])
		require.Equal(t, "com.example.price.set", m[3])
		settled[m[2]]++
	}
	require.Len(t, settled, 3, tillOut)
	prices := map[string]string{} // item -> command id
	for _, m := range tillPrice.FindAllStringSubmatch(tillOut, -1) {
		prices[m[1]] = m[3]
	}
	require.Len(t, prices, 3, tillOut)
	for id, item := range sent {
		require.Equal(t, 1, settled[id], "command %s settled once", id)
		require.Equal(t, id, prices[item], "the price of %s set by its command", item)
	}

	// The till's tables changed once per command, and its commands are
	// applied, each with one answer in its outbox.
	d, err := outbox.OpenDB(db, outbox.DBOptions{})
	require.NoError(t, err)
	defer d.Close()
	history := map[string]int{}
	rows, err := d.Query(`SELECT command_id FROM price_history`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		history[id]++
	}
	require.NoError(t, rows.Err())
	require.Len(t, history, 3)
	for id := range sent {
		require.Equal(t, 1, history[id], "price_history rows of command %s", id)
	}
	var applied, answers int
	require.NoError(t, d.QueryRow(`SELECT count(*) FROM outbox_command WHERE state = 'applied'`).Scan(&applied))
	require.NoError(t, d.QueryRow(`SELECT count(*) FROM outbox WHERE type = 'outbox.command.answer'`).Scan(&answers))
	require.Equal(t, []int{3, 3}, []int{applied, answers}, "commands applied, answers in the outbox")
}
