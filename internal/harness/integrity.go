package harness

import (
	"database/sql"
	"strings"
)

// CheckIntegrity runs PRAGMA integrity_check on db and fails tb unless it
// reports only "ok": what a test asks of a file after a kill or a cut.
func CheckIntegrity(tb TB, db *sql.DB) {
	tb.Helper()
	rows, err := db.Query(`PRAGMA integrity_check`)
	must(tb, err, "integrity_check")
	defer rows.Close()
	var report []string
	for rows.Next() {
		var line string
		must(tb, rows.Scan(&line), "integrity_check")
		report = append(report, line)
	}
	must(tb, rows.Err(), "integrity_check")
	if len(report) != 1 || report[0] != "ok" {
		tb.Fatalf("PRAGMA integrity_check: %s", strings.Join(report, "; "))
	}
}
