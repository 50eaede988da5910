package main

import (
	varint "encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestRelayRawBatchNeedsMQTT5: --envelope raw with batching or compression
// on --mqtt-version 3.1.1 is a usage error that says why and what to use
// instead, before anything is written or connects.
func TestRelayRawBatchNeedsMQTT5(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "never.db")
	for _, flags := range [][]string{
		{"--batch-max-events", "16"},
		{"--compress", "zstd"},
		{"--batch-max-events", "16", "--compress", "gzip", "--batch-max-delay", "5ms"},
	} {
		args := append([]string{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--envelope", "raw", "--mqtt-version", "3.1.1"}, flags...)
		r := ctl(t, args...)
		require.Equal(t, 2, r.Code, "%v: %s", flags, r.Stderr)
		require.Equal(t, "outboxctl: --envelope raw with --batch-max-events or --compress needs MQTT 5: 3.1.1 has no properties, "+
			"so nothing could tell a raw batch or a compressed raw payload from one event's bytes; use --mqtt-version 5 (or auto), or --envelope cloudevents\n", r.Stderr, flags)
		left, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, left, "%v: nothing written", flags)
	}
}

// TestRelayBatchFlags: the flags reach the relay. A backlog of 40 events
// goes out in batches no larger than --batch-max-events, or
// --batch-max-bytes before compression, compressed as --compress says:
// structured over 3.1.1 (a zstd frame holding a JSON array), raw over 5 (a
// gzip member holding length-prefixed payloads, marked by its properties);
// every event once, in commit order.
func TestRelayBatchFlags(t *testing.T) {
	for _, c := range []struct {
		envelope, version, compress string
		maxEvents, maxBytes, pad    int
	}{
		{"cloudevents", "3.1.1", "zstd", 16, 0, 100},
		{"raw", "5", "gzip", 100, 4096, 1000},
	} {
		t.Run(c.envelope+" over "+c.version, func(t *testing.T) {
			m := harness.StartMochi(t, harness.MochiOptions{})
			var mu sync.Mutex
			var got []wireBatch
			require.NoError(t, m.Subscribe("shop/#", func(msg harness.Message) {
				w := readWireBatch(msg, c.envelope == "raw")
				mu.Lock()
				got = append(got, w)
				mu.Unlock()
			}))
			path, ob := newOutbox(t)
			var want []string
			var msgs []outbox.Message
			for i := range 40 {
				p := fmt.Sprintf(`{"n":%d,"pad":%q}`, i, strings.Repeat("x", c.pad))
				want = append(want, p)
				msgs = append(msgs, outbox.Message{Topic: "shop/9/sales", Payload: []byte(p)})
			}
			enqueue(t, ob, msgs...)

			cmd := exec.Command(binary, "relay", "--db", path, "--broker", "tcp://"+m.Addr(), "--envelope", c.envelope, "--mqtt-version", c.version,
				"--batch-max-events", fmt.Sprint(c.maxEvents), "--batch-max-bytes", fmt.Sprint(c.maxBytes), "--compress", c.compress,
				"--log-format", "json", "--stats-interval", "0")
			var stderr harness.LogBuffer
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			defer cmd.Process.Kill()
			events := func() (n int) {
				mu.Lock()
				defer mu.Unlock()
				for _, w := range got {
					n += len(w.payloads)
				}
				return n
			}
			harness.Eventually(t, 10*time.Second, "40 events delivered", func() bool { return events() >= 40 })
			stopRelay(t, cmd, &stderr)

			mu.Lock()
			defer mu.Unlock()
			var delivered []string
			batches := 0
			for i, w := range got {
				require.NoError(t, w.err, "message %d", i)
				require.Equal(t, c.compress, w.compressed, "message %d compressed", i)
				require.LessOrEqual(t, len(w.payloads), c.maxEvents, "message %d: over --batch-max-events", i)
				if c.maxBytes > 0 {
					require.LessOrEqual(t, w.size, c.maxBytes, "message %d: over --batch-max-bytes", i)
				}
				if len(w.payloads) > 1 {
					batches++
				}
				delivered = append(delivered, w.payloads...)
			}
			require.Equal(t, want, delivered, "every event once, in commit order")
			require.Positive(t, batches, "no batch among %d messages", len(got))
			t.Logf("40 events in %d messages, %d of them batches", len(got), batches)
		})
	}
}

// wireBatch is one MQTT message read as a consumer reads it
// (DecodeEventsMQTT, DecodeRawMQTT): its events' payloads, in order.
type wireBatch struct {
	payloads   []string
	compressed string // "" when not compressed
	size       int    // a raw batch's bytes before compression
	err        error
}

func readWireBatch(msg harness.Message, raw bool) (w wireBatch) {
	user := make([]outbox.UserProperty, len(msg.User))
	for i, u := range msg.User {
		user[i] = outbox.UserProperty{Key: u.Key, Value: u.Val}
		if u.Key == "content-encoding" {
			w.compressed = u.Val
		}
	}
	if raw {
		ps, err := outbox.DecodeRawMQTT(msg.Payload, msg.ContentType, user)
		for _, p := range ps {
			w.payloads = append(w.payloads, string(p))
			w.size += len(varint.AppendUvarint(nil, uint64(len(p)))) + len(p)
		}
		w.err = err
		return w
	}
	// Over 3.1.1 the magic bytes say it.
	if alg := compress.Sniff(msg.Payload); alg != compress.None && w.compressed == "" {
		w.compressed = alg.String()
	}
	evs, err := outbox.DecodeEventsMQTT(msg.Payload, msg.ContentType, user)
	for _, ev := range evs {
		w.payloads = append(w.payloads, string(ev.Data))
	}
	w.err = err
	return w
}
