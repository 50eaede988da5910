package bench

import (
	"fmt"
	"strings"
)

// keyDoc documents one key of the JSON report (and one row of the table).
type keyDoc struct {
	key     string
	section int
	label   string
	unit    string
	target  string
}

// keys is every figure of the report, in print order. The JSON object has
// each key, null when the figure was not measured (a section not selected,
// Mosquitto not installed, no Go toolchain for the size builds). Keys are a
// stable interface: new ones may be added, none renamed or removed.
var keys = func() []keyDoc {
	var k []keyDoc
	add := func(section int, key, label, unit, target string) {
		k = append(k, keyDoc{key, section, label, unit, target})
	}

	// 1. Enqueue overhead.
	for _, m := range []struct{ key, name string }{{"full", "FULL"}, {"normal", "NORMAL"}} {
		p := "enqueue_" + m.key + "_"
		add(1, p+"business_tx_per_s", m.name+": business transaction alone", "tx/s", "")
		add(1, p+"raw_tx_per_s", m.name+": + one raw SQL outbox insert", "tx/s", "")
		add(1, p+"library_tx_per_s", m.name+": + Enqueue (library)", "tx/s", "")
		vsBusiness := ""
		if m.key == "full" {
			vsBusiness = "≥ 0.90"
		}
		add(1, p+"library_vs_business", m.name+": library / business alone", "ratio", vsBusiness)
		add(1, p+"library_vs_raw", m.name+": library / raw SQL insert", "ratio", "≥ 0.95")
		add(1, p+"added_us", m.name+": time the library adds per transaction", "µs", "")
		add(1, p+"raw10_tx_per_s", m.name+": + 10 raw SQL inserts", "tx/s", "")
		add(1, p+"library10_tx_per_s", m.name+": + Enqueue of 10 messages", "tx/s", "")
		add(1, p+"library10_vs_raw10", m.name+": library / raw SQL, 10 messages", "ratio", "")
		add(1, p+"bare_tx_per_s", m.name+": + one row in a bare table (the floor of any outbox row)", "tx/s", "")
		add(1, p+"bare_vs_business", m.name+": bare table / business alone (the most any outbox table reaches)", "ratio", "")
		add(1, p+"library_vs_bare", m.name+": library / bare table", "ratio", "")
		add(1, p+"plain_tx_per_s", m.name+": + the fields Enqueue writes, in a table with no constraint, index or trigger", "tx/s", "")
		add(1, p+"plain_vs_bare", m.name+": plain table / bare table (what the message's own fields cost)", "ratio", "")
		add(1, p+"library_vs_plain", m.name+": library / plain table (what the outbox's guarantees cost)", "ratio", "")
		add(1, p+"library_p9_tx_per_s", m.name+": + Enqueue of a message of priority 9", "tx/s", "")
		add(1, p+"library_p9_vs_library", m.name+": library, priority 9 / priority 0", "ratio", "")
		for _, st := range []struct{ key, label string }{
			{"bare", "the business transaction + a bare row"},
			{"plain", "+ the fields Enqueue binds"},
			{"columns", "+ the outbox table's other columns"},
			{"check", "+ its CHECK"},
			{"indexes", "+ its indexes"},
			{"trigger", "+ its trigger (the outbox table, by SQL)"},
			{"library", "+ Enqueue's Go side"},
		} {
			add(1, p+"step_"+st.key+"_us", m.name+", per transaction (median): "+st.label, "µs", "")
		}
		add(1, p+"pertx_plain_vs_bare", m.name+", per transaction: plain / bare (medians)", "ratio", "")
		add(1, p+"pertx_library_vs_bare", m.name+", per transaction: library / bare (medians)", "ratio", "")
	}

	// 2. Drain rate.
	for _, b := range []struct{ key, name string }{{"mochi", "mochi"}, {"mosquitto", "Mosquitto"}} {
		for _, w := range []int{1, 16, 64, 256} {
			p := fmt.Sprintf("drain_%s_w%d_", b.key, w)
			target := "≥ 0.90"
			if w == 1 {
				target = "≥ 0.80"
			}
			add(2, p+"raw_msgs_per_s", fmt.Sprintf("%s, window %d, MQTT 3.1.1: raw paho", b.name, w), "msg/s", "")
			add(2, p+"library_msgs_per_s", fmt.Sprintf("%s, window %d, MQTT 3.1.1: relay", b.name, w), "msg/s", "")
			add(2, p+"ratio", fmt.Sprintf("%s, window %d, MQTT 3.1.1: relay / raw", b.name, w), "ratio", target)
			add(2, p+"raw5_msgs_per_s", fmt.Sprintf("%s, window %d, MQTT 5: raw paho.golang", b.name, w), "msg/s", "")
			add(2, p+"library5_msgs_per_s", fmt.Sprintf("%s, window %d, MQTT 5: relay", b.name, w), "msg/s", "")
			add(2, p+"ratio5", fmt.Sprintf("%s, window %d, MQTT 5: relay / raw", b.name, w), "ratio", target)
			for _, dp := range drainPrios {
				add(2, p+"library_"+dp.key+"_msgs_per_s", fmt.Sprintf("%s, window %d, MQTT 3.1.1: relay, %s", b.name, w, dp.name), "msg/s", "")
				add(2, p+dp.key+"_vs_p0", fmt.Sprintf("%s, window %d, MQTT 3.1.1: relay, %s / all at priority 0", b.name, w, dp.name), "ratio", "")
			}
		}
		add(2, "drain_"+b.key+"_order_held", b.name+": every message delivered in commit order", "bool", "yes")
		add(2, "drain_"+b.key+"_duplicates", b.name+": duplicates delivered", "count", "")
	}

	// 3. Latency online.
	for _, c := range []struct{ key, name string }{{"raw", "raw paho, no database (the floor)"}, {"library", "commits through the library"}, {"sidecar", "rows inserted by another process"}, {"sidecar_full", "rows inserted by another process at FULL, declared (WritersAtFull)"}} {
		for _, b := range []struct{ key, name string }{{"mochi", "mochi"}, {"mosquitto", "Mosquitto"}} {
			for _, what := range []struct{ key, name string }{{"puback", "commit → PUBACK"}, {"delivered", "commit → subscriber"}} {
				p := fmt.Sprintf("latency_%s_%s_%s_", c.key, b.key, what.key)
				target := "≤ 5 ms"
				if c.key == "raw" {
					target = ""
				}
				add(3, p+"p50_ms", fmt.Sprintf("%s, %s: %s p50", c.name, b.name, what.name), "ms", "")
				add(3, p+"p99_ms", fmt.Sprintf("%s, %s: %s p99", c.name, b.name, what.name), "ms", target)
				add(3, p+"max_ms", fmt.Sprintf("%s, %s: %s max", c.name, b.name, what.name), "ms", "")
			}
		}
	}
	for _, c := range []struct{ key, name string }{{"library", "commits through the library"}, {"sidecar", "rows inserted by another process"}, {"sidecar_full", "rows inserted by another process at FULL, declared"}} {
		for _, b := range []struct{ key, name string }{{"mochi", "mochi"}, {"mosquitto", "Mosquitto"}} {
			for _, leg := range []struct{ key, name string }{{"to_publish", "commit → the relay's call to Publish"}, {"publish_to_puback", "the relay's call to Publish → PUBACK (the broker's round trip through the relay's client)"}} {
				p := fmt.Sprintf("latency_%s_%s_%s_", c.key, b.key, leg.key)
				add(3, p+"p50_ms", fmt.Sprintf("%s, %s: %s p50", c.name, b.name, leg.name), "ms", "")
				add(3, p+"p99_ms", fmt.Sprintf("%s, %s: %s p99", c.name, b.name, leg.name), "ms", "")
			}
		}
	}
	for _, c := range []struct{ key, name string }{{"sidecar", "rows inserted by another process"}, {"sidecar_full", "rows inserted by another process at FULL, declared"}} {
		for _, b := range []struct{ key, name string }{{"mochi", "mochi"}, {"mosquitto", "Mosquitto"}} {
			add(3, fmt.Sprintf("latency_%s_%s_fsyncs_per_event", c.key, b.key), fmt.Sprintf("%s, %s: the relay's fsyncs of the WAL before publishing, per event", c.name, b.name), "fsyncs", "")
		}
	}
	add(3, "latency_events", "events per case", "count", "")
	add(3, "latency_rate_per_s", "commit rate", "/s", "")
	add(3, "latency_batch_rounds", "batching online: rounds of each case, taking turns", "count", "")
	add(3, "latency_batch_events", "batching online: order events per case", "count", "")
	for _, c := range latencyBatchCases {
		p := "latency_batch_" + c.key + "_mochi_"
		name := "order events, " + c.name + ", mochi"
		add(3, p+"puback_p50_ms", name+": commit → PUBACK p50", "ms", "")
		add(3, p+"puback_p99_ms", name+": commit → PUBACK p99", "ms", "")
		add(3, p+"delivered_p50_ms", name+": commit → subscriber p50", "ms", "")
		add(3, p+"delivered_p99_ms", name+": commit → subscriber p99", "ms", "")
		add(3, p+"events_per_message", name+": events per MQTT message", "events", "")
	}
	add(3, "latency_batch_on_vs_off_mochi_puback_p99", "order events, mochi: commit → PUBACK p99, batching on / off", "ratio", "≤ 1.10")
	add(3, "latency_batch_zstd_vs_off_mochi_puback_p99", "order events, mochi: commit → PUBACK p99, batching on with zstd / off", "ratio", "")

	// 4. Catch-up.
	add(4, "catchup_backlog", "backlog built during the outage", "count", "")
	add(4, "catchup_rate_per_s", "new orders arriving meanwhile", "/s", "")
	add(4, "catchup_seconds", "time until the backlog is gone", "s", "")
	add(4, "catchup_drain_msgs_per_s", "backlog drained per second (new orders on top)", "msg/s", "")
	add(4, "catchup_enqueue_idle_p50_ms", "order transaction, relay idle: p50", "ms", "")
	add(4, "catchup_enqueue_idle_p99_ms", "order transaction, relay idle: p99", "ms", "")
	add(4, "catchup_enqueue_p50_ms", "order transaction during catch-up: p50", "ms", "")
	add(4, "catchup_enqueue_p99_ms", "order transaction during catch-up: p99", "ms", "")
	add(4, "catchup_enqueue_max_ms", "order transaction during catch-up: max", "ms", "")
	add(4, "catchup_orders_achieved_per_s", "orders committed per second during catch-up", "/s", "")

	// 5. Memory.
	add(5, "memory_backlog", "backlog drained by the relay process", "count", "")
	add(5, "memory_peak_heap_mib", "relay process: peak Go heap (live + not yet swept)", "MiB", "≤ 32 MiB")
	add(5, "memory_peak_heap_inuse_mib", "relay process: peak heap spans in use", "MiB", "")
	add(5, "memory_peak_rss_mib", "relay process: peak RSS (VmHWM, incl. SQLite's page cache)", "MiB", "")
	add(5, "memory_drain_msgs_per_s", "relay process: drain rate (window 64, mochi in the parent)", "msg/s", "")
	add(5, "enqueue_allocs_per_message", "heap allocations per enqueued message (Enqueue alone)", "allocs", "")
	add(5, "enqueue_alloc_bytes_per_message", "heap bytes allocated per enqueued message", "B", "")
	add(5, "enqueue_allocs_per_message_batch10", "heap allocations per message, 10 per Enqueue", "allocs", "")
	add(5, "enqueue_business_allocs_per_tx", "heap allocations of the business transaction alone (database/sql + driver)", "allocs", "")

	// 6. Size. The targets are the till's: on arm64, outboxctl and the
	// library beside the floor.
	for _, prog := range sizePrograms {
		for _, arch := range sizeTargets {
			add(6, fmt.Sprintf("size_%s_%s_bytes", prog.key, arch.key), fmt.Sprintf("%s, %s", prog.name, arch.key), "bytes", "")
		}
		if prog.key == "floor" {
			continue
		}
		for _, arch := range sizeTargets {
			target := ""
			if arch.key == "arm64" && prog.arm64Max > 0 {
				target = fmt.Sprintf("≤ %.2f", prog.arm64Max)
			}
			add(6, fmt.Sprintf("size_%s_%s_vs_floor", prog.key, arch.key), fmt.Sprintf("%s / floor, %s", prog.key, arch.key), "ratio", target)
		}
	}

	// 7. Baseline.
	add(7, "baseline_steady_rate_per_s", "steady workload: orders per second (both outboxes)", "/s", "")
	add(7, "baseline_steady_committed", "steady workload: orders committed (each)", "count", "")
	for _, x := range []struct{ key, name string }{{"ours", "ours"}, {"articles", "articles'"}} {
		p := "baseline_" + x.key + "_steady_"
		add(7, p+"delivered", x.name+": delivered by the end of the observation", "count", "")
		add(7, p+"p50_ms", x.name+": commit → subscriber p50", "ms", "")
		add(7, p+"p99_ms", x.name+": commit → subscriber p99", "ms", "")
		add(7, p+"max_ms", x.name+": commit → subscriber max", "ms", "")
	}
	add(7, "baseline_articles_drain_msgs_per_s", "articles': drain ceiling measured (50 per 2 s poll)", "msg/s", "")
	add(7, "baseline_outage_seconds", "outage: broker down for", "s", "")
	add(7, "baseline_outage_rate_per_s", "outage: orders per second (both outboxes)", "/s", "")
	for _, x := range []struct{ key, name string }{{"ours", "ours"}, {"articles", "articles'"}} {
		p := "baseline_" + x.key + "_outage_"
		add(7, p+"committed", x.name+": orders committed", "count", "")
		add(7, p+"delivered", x.name+": delivered", "count", "")
		add(7, p+"abandoned", x.name+": never delivered (given up, or dead)", "count", "")
		add(7, p+"attempts_charged", x.name+": failed attempts counted against messages", "count", "")
		add(7, p+"duplicates", x.name+": duplicates", "count", "")
		add(7, p+"out_of_order", x.name+": delivered out of order", "count", "")
		add(7, p+"recovery_seconds", x.name+": broker back → all deliverable delivered", "s", "")
		add(7, p+"p99_ms", x.name+": commit → subscriber p99, whole run (delivered messages)", "ms", "")
	}

	// 8. Durable before publish.
	add(8, "durable_backlog_events", "backlog committed while the broker is away", "count", "")
	add(8, "durable_trickle_events", "trickle: events, each committed once the previous one is acknowledged", "count", "")
	for _, m := range []struct{ key, name string }{{"full", "FULL"}, {"normal", "NORMAL"}} {
		p := "durable_" + m.key + "_"
		add(8, p+"backlog_msgs_per_s", m.name+": backlog drained (mochi)", "msg/s", "")
		add(8, p+"backlog_fsyncs_per_1000", m.name+": backlog: WAL fsyncs per 1,000 events for the batch reads (durable before publish)", "fsyncs", "≤ 4")
		add(8, p+"backlog_mark_fsyncs_per_1000", m.name+": backlog: WAL fsyncs per 1,000 events for the marks (a power cut duplicates at most Window + max(Window, 256))", "fsyncs", "")
		add(8, p+"trickle_fsyncs_per_event", m.name+": trickle: WAL fsyncs per event", "fsyncs", "≤ 1")
		add(8, p+"trickle_puback_p50_ms", m.name+": trickle: commit → PUBACK p50", "ms", "")
		add(8, p+"trickle_puback_p99_ms", m.name+": trickle: commit → PUBACK p99", "ms", "")
	}

	// 9. A slow link used to its limit.
	add(9, "link_rtt_ms", "link: round trip (half each way)", "ms", "")
	add(9, "link_bytes_per_s", "link: bandwidth each way (2 Mbit/s)", "B/s", "")
	for _, e := range linkEncodings {
		p := "link_bytes_" + e.key + "_"
		add(9, p+"payload", e.name+": payload of the PUBLISH", "B", "")
		add(9, p+"publish", e.name+": MQTT bytes up per event (PUBLISH)", "B", "")
		add(9, p+"puback", e.name+": MQTT bytes down per event (PUBACK)", "B", "")
	}
	for _, d := range linkDrains {
		p := linkDrainKey(d.enc, d.window)
		name := fmt.Sprintf("%s, window %d", linkEncodingOf(d.enc).name, d.window)
		add(9, p+"events", name+": events drained", "count", "")
		add(9, p+"window", name+": effective window (the broker's Receive Maximum caps it)", "count", "")
		add(9, p+"limit_msgs_per_s", name+": the link's limit, min(window / RTT, bandwidth / bytes per event)", "msg/s", "")
		add(9, p+"bound", name+": what sets the limit", "text", "")
		add(9, p+"msgs_per_s", name+": drain rate", "msg/s", "")
		add(9, p+"vs_limit", name+": drain rate / the link's limit", "ratio", "≥ 0.90")
		add(9, p+"longest_gap_ms", name+": longest pause between two deliveries", "ms", "")
		add(9, p+"fsyncs_per_1000", name+": the relay's WAL fsyncs per 1,000 events (batch reads and marks)", "fsyncs", "")
	}
	add(9, "link_day_events", "a busy till's day offline: events of 200 B", "count", "")
	add(9, "link_day_limit_seconds", "the day at the link's limit (window 64, structured, MQTT 5)", "s", "")
	add(9, "link_day_seconds_estimated", "the day: drain time estimated from the window-64 drain", "s", "")
	add(9, "link_day_seconds", "the day: drain time measured whole (--full only)", "s", "")
	add(9, "link_day_msgs_per_s", "the day: drain rate measured whole (--full only)", "msg/s", "")
	add(9, "link_day_vs_limit", "the day: drain rate / the link's limit (--full only)", "ratio", "≥ 0.90")
	add(9, "link_day_longest_gap_ms", "the day: longest pause between two deliveries (--full only)", "ms", "")

	// 9, a backlog spread over priorities 0, 5 and 9, at window 64.
	p := "link_drain_spread_structured5_w64_"
	name := "spread over priorities 0, 5, 9 (structured, MQTT 5), window 64"
	add(9, p+"events", name+": events drained", "count", "")
	add(9, p+"msgs_per_s", name+": drain rate", "msg/s", "")
	add(9, p+"vs_limit", name+": drain rate / the link's limit", "ratio", "≥ 0.90")
	add(9, p+"vs_one_priority", name+": drain rate / the same drain all at priority 0", "ratio", "≥ 0.95")

	// 9, priority 9 after an outage.
	add(9, "link_prio_backlog", "priority 9 after an outage: events of priority 0 waiting", "count", "")
	for _, c := range prioCases {
		p := "link_prio_" + c.key + "_"
		name := "priority 9 after an outage, " + c.name
		add(9, p+"message_bytes", name+": MQTT bytes up per message of priority 0", "B", "")
		add(9, p+"bound_ms", name+": the bound, 2 round trips + window × message bytes / bandwidth", "ms", "")
		for _, w := range prioWhens {
			q := p + w.key + "_"
			add(9, q+"ms", name+", "+w.name+": the relay's CONNACK → the event at the broker", "ms", "")
			add(9, q+"ahead", name+", "+w.name+": events of priority 0 delivered before it", "count", "")
			add(9, q+"vs_bound", name+", "+w.name+": delay / the bound", "ratio", "≤ 1.00")
		}
	}

	// 9, the order events: batching and compression.
	add(9, "link_orders_payload_mean_bytes", "order events: mean size of the JSON (the data of each event)", "B", "")
	for _, w := range orderWires {
		p := "link_orders_" + w.key + "_"
		name := "order events, " + w.name
		add(9, p+"payload", name+": mean payload of a PUBLISH", "B", "")
		add(9, p+"events_per_message", name+": events per MQTT message", "events", "")
		add(9, p+"publish", name+": MQTT bytes up per event (PUBLISH)", "B", "")
		add(9, p+"puback", name+": MQTT bytes down per event (PUBACK)", "B", "")
		add(9, p+"bytes", name+": MQTT bytes per event, both directions", "B", "")
	}
	add(9, "link_orders_batched_zstd_vs_unbatched", "order events: bytes per event batched with zstd / one event a message", "ratio", "≤ 0.25")
	add(9, "link_orders_batched_gzip_vs_unbatched", "order events: bytes per event batched with gzip / one event a message", "ratio", "")
	for _, alg := range []string{"zstd", "gzip"} {
		add(9, "compress_"+alg+"_ns_per_event", alg+": compression's CPU time per event, batches of 100 order events (one goroutine)", "ns", "")
		add(9, "compress_"+alg+"_ratio", alg+": compressed / uncompressed, batches of 100 order events", "ratio", "")
	}
	add(9, "link_orders_day_events", "a busy till's day offline: order events", "count", "")
	for _, k := range orderDayWires {
		p := "link_orders_day_" + k + "_"
		name := "the day of order events, " + orderWireOf(k).name
		target := ""
		if k == "batched_zstd" {
			target = "≤ 18 s"
		}
		add(9, p+"drained", name+": events drained (the day, or its first events)", "count", "")
		add(9, p+"limit_seconds", name+": the day at the link's limit (window 64)", "s", "")
		add(9, p+"events_per_s", name+": drain rate", "/s", "")
		add(9, p+"events_per_message", name+": events per MQTT message", "events", "")
		add(9, p+"seconds_estimated", name+": drain time estimated (time to first delivery + events / rate)", "s", "")
		add(9, p+"seconds", name+": drain time measured whole", "s", target)
		add(9, p+"order_held", name+": every event delivered, once, in commit order", "bool", "yes")
		add(9, p+"longest_gap_ms", name+": longest pause between two deliveries", "ms", "")
		add(9, p+"fsyncs_per_1000", name+": the relay's WAL fsyncs per 1,000 events", "fsyncs", "")
	}
	add(9, "link_orders_day_batched_zstd_vs_unbatched", "the day of order events: batched with zstd / one event a message (measured, else estimated)", "ratio", "")
	// 10. Writes to the flash (counted by powerfs), and a slow card.
	flashCases := []struct{ key, name string }{
		{"enqueue_full", "enqueue at FULL (one order and its event per transaction)"},
		{"enqueue_normal", "enqueue at NORMAL"},
	}
	for _, d := range flashDrains {
		flashCases = append(flashCases, struct{ key, name string }{d.key, d.name + ", with its marks, checkpoints and purge"})
	}
	for _, c := range flashCases {
		p := "flash_" + c.key + "_"
		add(10, p+"events", c.name+": events", "count", "")
		add(10, p+"bytes_per_event", c.name+": bytes written to the database and its WAL, per event", "B", "")
		add(10, p+"page_bytes_per_event", c.name+": 4 KiB pages written back (each once per sync), bytes per event", "B", "")
		add(10, p+"fsyncs_per_1000", c.name+": fsyncs per 1,000 events (files and directory)", "fsyncs", "")
		switch {
		case strings.HasPrefix(c.key, "enqueue_"):
			add(10, p+"tx_per_s", c.name+": transactions per second on the mount (no fsync delay)", "tx/s", "")
		default:
			add(10, p+"relay_fsyncs_per_1000", c.name+": of which the relay's WAL fsyncs (RelayStats.WALSyncs: reads and marks)", "fsyncs", "")
		}
	}
	add(10, "flash_day_mb", fmt.Sprintf("a busy till's day, %s events: enqueue at FULL + drain, pages written back", thousands(flashDayEvents)), "MB", "")
	add(10, "flash_day_batched_mb", fmt.Sprintf("a busy till's day, %s events: enqueue at FULL + drain in batches, pages written back", thousands(flashDayEvents)), "MB", "")
	for _, d := range flashSlowDelays {
		p := fmt.Sprintf("flash_slow%d_", d.Milliseconds())
		name := fmt.Sprintf("fsync delay %d ms", d.Milliseconds())
		if d == 0 {
			name = "the mount, no fsync delay"
		}
		target := ""
		if d == flashTargetDelay {
			target = "≥ 0.90"
		}
		add(10, p+"enqueue_full_tx_per_s", name+": enqueue at FULL", "tx/s", "")
		add(10, p+"enqueue_full_fsyncs_per_tx", name+": enqueue at FULL, fsyncs per transaction", "fsyncs", "")
		add(10, p+"link_events", name+": drain over the cellular link (window 64, structured, MQTT 5): events", "count", "")
		add(10, p+"link_limit_msgs_per_s", name+": the link's limit", "msg/s", "")
		add(10, p+"link_msgs_per_s", name+": drain rate over the link", "msg/s", "")
		add(10, p+"link_vs_limit", name+": drain rate / the link's limit", "ratio", target)
		add(10, p+"link_longest_gap_ms", name+": longest pause between two deliveries", "ms", "")
		add(10, p+"link_fsyncs_per_1000", name+": the relay's WAL fsyncs per 1,000 events (reads and marks)", "fsyncs", "")
		if d == flashTargetDelay {
			p += "batched_"
			name += ", in batches of up to 100 events, zstd"
			add(10, p+"link_events", name+": events drained over the link (the drains' backlog above)", "count", "")
			add(10, p+"link_seconds", name+": Run's start → the last delivery", "s", "")
			add(10, p+"link_longest_gap_ms", name+": longest pause between two deliveries", "ms", "")
			add(10, p+"link_fsyncs_per_1000", name+": the relay's WAL fsyncs per 1,000 events (reads and marks)", "fsyncs", "")
		}
	}

	// 11. NATS JetStream.
	add(11, "jetstream_drain_instant_msgs_per_s", fmt.Sprintf("the relay alone, window %d: to a Publisher that acknowledges at once (no transport)", jsTargetWindow), "msg/s", "")
	add(11, "jetstream_drain_instant_cpu_us_per_msg", fmt.Sprintf("the relay alone, window %d: CPU of this process per message", jsTargetWindow), "µs", "")
	for _, t := range []struct{ key, name string }{{"r1", "R1 (one server)"}, {"r3", "R3 (3-node cluster)"}} {
		for _, w := range sizesFor(Full).jsWindows {
			p := fmt.Sprintf("jetstream_drain_%s_w%d_", t.key, w)
			name := fmt.Sprintf("drain to JetStream %s, window %d", t.name, w)
			target := ""
			if w == jsTargetWindow {
				target = "≥ 0.90"
			}
			add(11, p+"raw_msgs_per_s", name+": raw nats.go (PublishMsgAsync)", "msg/s", "")
			add(11, p+"library_msgs_per_s", name+": relay (natsjs)", "msg/s", "")
			add(11, p+"ratio", name+": relay / raw", "ratio", target)
			for _, v := range []struct{ key, name string }{{"raw", "raw"}, {"library", "relay"}} {
				add(11, p+v.key+"_cpu_us_per_msg", name+", "+v.name+": CPU of this process per message", "µs", "")
				add(11, p+v.key+"_nats_cpu_us_per_msg", name+", "+v.name+": CPU of nats-server per message", "µs", "")
				add(11, p+v.key+"_machine_busy", name+", "+v.name+": the machine's CPUs busy (anyone's work)", "ratio", "")
			}
		}
	}
	for _, m := range jsMembers {
		p := fmt.Sprintf("jetstream_consumer_m%d_", m)
		name := fmt.Sprintf("consumers into PostgreSQL, %d member(s)", m)
		add(11, p+"events_per_s", name+": events applied per second", "events/s", "")
		if m > 1 {
			add(11, p+"vs_m1", name+": / 1 member", "ratio", "")
		}
		add(11, p+"consumer_cpu_us_per_event", name+": CPU of the consumers (this process) per event", "µs", "")
		add(11, p+"postgres_cpu_us_per_event", name+": CPU of PostgreSQL per event", "µs", "")
		add(11, p+"nats_cpu_us_per_event", name+": CPU of nats-server per event", "µs", "")
		add(11, p+"cpu_share", name+": consumers + PostgreSQL + nats-server, share of the machine's CPUs", "ratio", "")
		add(11, p+"machine_busy", name+": the machine's CPUs busy (anyone's work)", "ratio", "")
	}
	return k
}()
