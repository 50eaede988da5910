package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/edgeoutbox/outbox"
)

// Any program that can write SQLite can use the outbox: one INSERT in its
// own transaction is the whole contract.
func Example_plainSQL() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "pos.db")
	ob, err := outbox.Open(context.Background(), path, outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close()

	// What a Python or shell program would run against the same file, on a
	// connection of its own.
	other, err := sql.Open("sqlite", path)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Exec(`INSERT INTO outbox (topic, payload) VALUES ('stores/42/doors', '{"open":true}')`); err != nil {
		log.Fatal(err)
	}
	recs, _ := ob.List(context.Background(), outbox.ListOptions{})
	fmt.Println(recs[0].Seq, recs[0].Topic, recs[0].State, len(recs[0].ID))
	// Output: 1 stores/42/doors pending 36
}
