package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/bench"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// natsInstalled is whether the harness finds nats-server, as section 11
// looks for it.
func natsInstalled() bool {
	if _, err := exec.LookPath("nats-server"); err == nil {
		return true
	}
	for _, p := range []string{"/usr/sbin/nats-server", "/usr/bin/nats-server"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// TestBenchSmoke runs every section of outboxlab bench at tiny sizes
// through the built binary and checks the JSON report's keys, so that the
// command cannot rot.
func TestBenchSmoke(t *testing.T) {
	r := lab(t, "bench", "--smoke", "--json", "--quiet", "--mosquitto", "none")
	require.Equal(t, 0, r.Code, r.Stderr)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &rep), r.Stdout)
	for _, k := range []string{"mode", "date", "cpu", "nproc", "go_version", "sqlite_version", "seconds", "targets", "notes"} {
		require.Contains(t, rep, k)
	}
	require.Equal(t, "smoke", rep["mode"])
	require.NotEmpty(t, rep["sqlite_version"])
	// Every documented figure is there, measured or null.
	for _, k := range bench.Keys() {
		require.Contains(t, rep, k)
	}
	// One figure of each section that runs in smoke mode was measured.
	for _, k := range []string{
		"enqueue_normal_library_vs_raw", "enqueue_normal_library_vs_plain", "enqueue_normal_pertx_library_vs_bare", "enqueue_allocs_per_message",
		"drain_mochi_w64_library_msgs_per_s", "drain_mochi_w64_ratio",
		"latency_library_mochi_delivered_p99_ms", "latency_sidecar_mochi_puback_p50_ms", "latency_sidecar_mochi_to_publish_p99_ms", "latency_library_mochi_publish_to_puback_p99_ms",
		"catchup_seconds", "catchup_enqueue_p99_ms",
		"memory_peak_heap_mib", "memory_peak_rss_mib",
		"baseline_ours_steady_p50_ms", "baseline_articles_outage_attempts_charged",
		"durable_full_backlog_msgs_per_s", "durable_normal_backlog_msgs_per_s", "durable_normal_trickle_puback_p99_ms",
		"link_bytes_structured311_publish", "link_bytes_binary5_publish", "link_drain_structured5_w64_msgs_per_s",
		"link_drain_structured5_w64_limit_msgs_per_s", "link_day_seconds_estimated",
		"drain_mochi_w64_library_p9_msgs_per_s", "drain_mochi_w64_mix_vs_p0",
		"link_prio_unbatched_bound_ms", "link_prio_unbatched_connack_ms", "link_prio_unbatched_outage_vs_bound",
		"link_prio_batched_bound_ms", "link_prio_batched_connack_ms", "link_prio_batched_outage_ms",
	} {
		v, ok := rep[k].(float64)
		require.True(t, ok, "%s = %v", k, rep[k])
		require.GreaterOrEqual(t, v, 0.0, k)
	}
	require.Equal(t, true, rep["drain_mochi_order_held"])
	require.Equal(t, rep["baseline_ours_outage_committed"], rep["baseline_ours_outage_delivered"], "ours loses nothing in an outage")
	require.Nil(t, rep["drain_mosquitto_w64_ratio"], "--mosquitto none")
	// A sidecar's rows are synced before publishing unless its writers are
	// declared at FULL (RelayOptions.WritersAtFull).
	undeclared, ok := rep["latency_sidecar_mochi_fsyncs_per_event"].(float64)
	declared, ok2 := rep["latency_sidecar_full_mochi_fsyncs_per_event"].(float64)
	require.True(t, ok && ok2, "the sidecar cases' fsyncs are reported")
	require.Positive(t, undeclared, "undeclared sidecar: fsyncs before publishing")
	require.Zero(t, declared, "declared sidecar: no fsync before publishing")
	// Durable before publish: at NORMAL at most one fsync per batch read,
	// and some; at FULL none, since the events were committed by Transact,
	// whose COMMIT synced them.
	for _, m := range []string{"full", "normal"} {
		perK, ok := rep["durable_"+m+"_backlog_fsyncs_per_1000"].(float64)
		perEvent, ok2 := rep["durable_"+m+"_trickle_fsyncs_per_event"].(float64)
		require.True(t, ok && ok2, "%s: the batch reads' fsyncs are reported", m)
		if m == "full" {
			require.Zero(t, perK, "FULL backlog: fsyncs per 1,000 events")
			require.Zero(t, perEvent, "FULL trickle: fsyncs per event")
		} else {
			require.True(t, perK > 0 && perK <= 4, "%s backlog: %v fsyncs per 1,000 events", m, perK)
			require.True(t, perEvent > 0 && perEvent <= 1, "%s trickle: %v fsyncs per event", m, perEvent)
		}
		_, ok = rep["durable_"+m+"_backlog_mark_fsyncs_per_1000"].(float64)
		require.True(t, ok, "%s backlog: the marks' fsyncs are reported", m)
	}
	// The slow link: the MQTT packets counted to the byte (a PUBLISH of
	// the 200-byte payload alone to bench/stores/42/orders is 1 + 2 + 24 +
	// 2 + 200 bytes, its PUBACK 4; MQTT 5 structured mode adds the
	// property length and the 31-byte Content Type), and a drain at window
	// 64 near the link's limit: a link that delayed packets one after the
	// other instead of together would be far below it.
	require.EqualValues(t, 229, rep["link_bytes_raw311_publish"])
	require.EqualValues(t, 4, rep["link_bytes_raw311_puback"])
	require.EqualValues(t, rep["link_bytes_structured311_publish"].(float64)+32, rep["link_bytes_structured5_publish"])
	require.Equal(t, "window", rep["link_drain_structured5_w64_bound"])
	vs, _ := rep["link_drain_structured5_w64_vs_limit"].(float64)
	require.True(t, vs > 0.5 && vs < 1.2, "window 64 over the slow link: %v of its limit", vs)
	require.Nil(t, rep["link_day_seconds"], "the day is drained whole only in --full")
	// Priority 9 after an outage goes before the backlog of priority 0:
	// 500 events, about 8 windows one event a message; batched, 5
	// messages, all of them in the first window, so only the event
	// committed during the outage can overtake them.
	for _, k := range []string{"unbatched_connack", "unbatched_outage", "batched_outage"} {
		ahead, _ := rep["link_prio_"+k+"_ahead"].(float64)
		require.Less(t, ahead, rep["link_prio_backlog"], "%s: the priority-9 event waited for the whole backlog", k)
	}

	// Batching and compression, on order events: the relay's batches are
	// on the wire (many events a message), batched with zstd an event
	// costs at most a quarter of its bytes unbatched, the day's drain
	// delivers every event once in commit order, and compression's cost and
	// online latency on and off are measured.
	for _, k := range []string{
		"link_orders_payload_mean_bytes", "compress_zstd_ns_per_event", "compress_gzip_ns_per_event",
		"link_orders_day_batched_zstd_seconds_estimated", "link_orders_day_unbatched_seconds_estimated",
		"latency_batch_off_mochi_puback_p99_ms", "latency_batch_on_mochi_puback_p99_ms", "latency_batch_on_vs_off_mochi_puback_p99",
	} {
		v, ok := rep[k].(float64)
		require.True(t, ok && v > 0, "%s = %v", k, rep[k])
	}
	for _, k := range []string{"link_orders_batched_events_per_message", "link_orders_batched_zstd_events_per_message", "link_orders_day_batched_zstd_events_per_message"} {
		require.Greater(t, rep[k], 10.0, "%s: batches on the wire", k)
	}
	require.EqualValues(t, 1, rep["link_orders_unbatched_events_per_message"])
	vsUnbatched, _ := rep["link_orders_batched_zstd_vs_unbatched"].(float64)
	require.True(t, vsUnbatched > 0 && vsUnbatched <= 0.25, "batched with zstd: %v of the bytes unbatched", vsUnbatched)
	require.Equal(t, true, rep["link_orders_day_batched_zstd_order_held"])
	require.Equal(t, true, rep["link_orders_day_unbatched_order_held"])
	require.Nil(t, rep["link_orders_day_batched_zstd_seconds"], "the day of order events is drained whole in quick and full mode")
	// The flash, counted by powerfs where FUSE is (else the section says
	// why not): a commit at FULL fsyncs and writes at least a page of WAL,
	// one at NORMAL does not fsync; the drains are counted whole; the slow
	// card's first delay runs in smoke mode, the second does not.
	notes, _ := rep["notes"].(map[string]any)
	if _, err := os.Stat("/dev/fuse"); err != nil || runtime.GOOS != "linux" || runtime.GOARCH == "arm" {
		require.Contains(t, fmt.Sprint(notes["10"]), "not run", "section 10 without FUSE")
	} else {
		fullPerK, _ := rep["flash_enqueue_full_fsyncs_per_1000"].(float64)
		normalPerK, _ := rep["flash_enqueue_normal_fsyncs_per_1000"].(float64)
		require.GreaterOrEqual(t, fullPerK, 1000.0, "FULL: an fsync per commit")
		require.Less(t, normalPerK, fullPerK, "NORMAL: fewer fsyncs than FULL")
		for _, k := range []string{"flash_enqueue_full_bytes_per_event", "flash_enqueue_normal_page_bytes_per_event"} {
			v, _ := rep[k].(float64)
			require.GreaterOrEqual(t, v, 4096.0, "%s: a commit writes at least a page of WAL", k)
		}
		for _, k := range []string{"flash_drain", "flash_drain_batched"} {
			require.EqualValues(t, 500, rep[k+"_events"], k)
			v, _ := rep[k+"_bytes_per_event"].(float64)
			require.Positive(t, v, k)
		}
		vs, _ := rep["flash_slow10_link_vs_limit"].(float64)
		require.Positive(t, vs, "the drain on a slow card")
		require.EqualValues(t, 500, rep["flash_slow10_batched_link_events"], "the drains' backlog over the link in batches")
		_, ok := rep["flash_slow10_batched_link_fsyncs_per_1000"].(float64)
		require.True(t, ok, "the batched drain's fsyncs over the link")
		require.Nil(t, rep["flash_slow50_link_vs_limit"], "smoke: 10 ms only")
	}

	// NATS JetStream where nats-server is installed: the drains beside raw
	// nats.go at R1 and R3, and the consumers with 1, 2 and 4 members
	// where PostgreSQL is too.
	if natsInstalled() {
		for _, k := range []string{"jetstream_drain_r1_w64_ratio", "jetstream_drain_r3_w64_ratio",
			"jetstream_drain_r1_w64_library_cpu_us_per_msg", "jetstream_drain_r1_w64_raw_nats_cpu_us_per_msg",
			"jetstream_drain_instant_msgs_per_s", "jetstream_drain_instant_cpu_us_per_msg"} {
			v, ok := rep[k].(float64)
			require.True(t, ok && measured(k, v), "%s = %v", k, rep[k])
		}
		if harness.PostgresBinDir() != "" {
			for _, k := range []string{"jetstream_consumer_m1_events_per_s", "jetstream_consumer_m2_vs_m1", "jetstream_consumer_m4_vs_m1",
				"jetstream_consumer_m1_postgres_cpu_us_per_event", "jetstream_consumer_m4_cpu_share"} {
				v, ok := rep[k].(float64)
				require.True(t, ok && measured(k, v), "%s = %v", k, rep[k])
			}
		}
	} else {
		require.Contains(t, fmt.Sprint(notes["11"]), "not run", "section 11 without nats-server")
	}

	// The Markdown form has a table per section.
	r = lab(t, "bench", "--smoke", "--quiet", "--mosquitto", "none", "--sections", "1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "## 1. Enqueue overhead")
	require.Contains(t, r.Stdout, "| FULL: library / business alone |")
	require.True(t, strings.Contains(r.Stdout, "**met**") || strings.Contains(r.Stdout, "**MISSED**"))

	r = lab(t, "bench", "--sections", "12")
	require.Equal(t, 2, r.Code, r.Stderr)

	// One window of section 2: its cells, and no others.
	r = lab(t, "bench", "--smoke", "--quiet", "--json", "--mosquitto", "none", "--sections", "2", "--windows", "16")
	require.Equal(t, 0, r.Code, r.Stderr)
	one := map[string]any{}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &one))
	require.NotNil(t, one["drain_mochi_w16_ratio"])
	require.Nil(t, one["drain_mochi_w64_ratio"])
	r = lab(t, "bench", "--windows", "0")
	require.Equal(t, 2, r.Code, r.Stderr)
}

// measured reports whether v is a figure of key k as smoke mode gives it:
// a rate or a ratio above 0; a CPU reading at least 0, since another
// process's CPU is counted in ticks of /proc (10 ms), which a smoke run's
// few messages may not reach.
func measured(k string, v float64) bool {
	if strings.Contains(k, "_cpu_") {
		return v >= 0
	}
	return v > 0
}
