package examples_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// subscribedAs is the consumer's line once subscribed; it names its client id.
var subscribedAs = regexp.MustCompile(`(?m)^subscribed to \S+ at \S+ as (\S+)$`)

// TestConsumerClientIDsDistinct: following examples/README.md (and the
// consumer's doc comment) in order never gives two consumers one client id.
// A broker keeps one session per id, so a SQLite consumer and a PostgreSQL
// one under the same id would take each other's subscriptions and events.
// The default id is read from the program itself (its demo says which it
// used), and a PostgreSQL consumer without --client-id is refused.
func TestConsumerClientIDsDistinct(t *testing.T) {
	t.Parallel()
	bin := build(t, "consumer")
	m := subscribedAs.FindStringSubmatch(run(t, bin, "--demo", "--count", "1"))
	require.NotNil(t, m, "the demo names its client id")
	def := m[1]

	for _, doc := range []string{"README.md", "consumer/main.go"} {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		roles := map[string]string{} // client id -> the command that uses it
		for _, line := range strings.Split(string(text), "\n") {
			_, cmd, ok := strings.Cut(line, "go run ./examples/consumer")
			if !ok || strings.Contains(cmd, "--demo") {
				continue
			}
			args := strings.Fields(strings.NewReplacer("'", "", "&", "").Replace(cmd))
			id, postgres := "", false
			for i, a := range args {
				switch {
				case a == "--client-id" && i+1 < len(args):
					id = args[i+1]
				case a == "--postgres":
					postgres = true
				}
			}
			if id == "" {
				require.False(t, postgres, "%s: a PostgreSQL consumer without --client-id: %s", doc, cmd)
				id = def
			}
			require.NotContains(t, roles, id, "%s: client id %q used by two consumers:\n%s\n%s", doc, id, roles[id], cmd)
			roles[id] = cmd
		}
		require.GreaterOrEqual(t, len(roles), 2, "%s: the consumer commands were found", doc)
	}

	// Consumers sharing PostgreSQL must each name themselves: the default
	// would be one id for all of them. Refused before anything connects.
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--broker", "tcp://127.0.0.1:1", "--postgres", "postgres://nobody@127.0.0.1:1/x").CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "%v: %s", err, out)
	require.Equal(t, 2, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "with --postgres give each consumer its own --client-id")
}
