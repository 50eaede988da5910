package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeoutbox/outbox"
)

// A till applies a price change sent by the backend: the new price and the
// command's answer commit in one transaction, once, however often the
// broker delivers the command. A transport's receiver (the MQTT one, or
// outboxctl relay --commands) calls StoreCommand; here the example does.
func ExampleCommands() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	ob, err := outbox.Open(ctx, filepath.Join(dir, "pos.db"), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close()
	if _, err := ob.DB().Exec(`CREATE TABLE prices (sku TEXT PRIMARY KEY, cents INTEGER)`); err != nil {
		log.Fatal(err)
	}

	applied := make(chan struct{})
	cmds, err := ob.NewCommands(func(ctx context.Context, tx *sql.Tx, cmd outbox.Command) ([]byte, error) {
		var p struct {
			SKU   string `json:"sku"`
			Cents int    `json:"cents"`
		}
		if err := json.Unmarshal(cmd.Data, &p); err != nil {
			return nil, err // tried again, then answered "failed"
		}
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO prices VALUES (?, ?)`, p.SKU, p.Cents); err != nil {
			return nil, err
		}
		return []byte(`{"price_set":true}`), nil
	}, outbox.CommandOptions{OnCommand: func(cmd outbox.Command, out outbox.CommandOutcome, err error) {
		fmt.Println(cmd.ID, out)
		close(applied)
	}})
	if err != nil {
		log.Fatal(err)
	}

	// What the backend sent: a CloudEvent, its answer topic in the
	// envelope (MQTT 3.1.1) or as MQTT 5's Response Topic.
	in := outbox.IncomingCommand{
		Topic: "stores/42/tills/1/commands",
		Payload: []byte(`{"specversion":"1.0","id":"cmd-1","source":"/backend","type":"com.example.price.set",
			"responsetopic":"stores/42/answers","data":{"sku":"coffee","cents":250}}`),
	}
	for range 2 { // delivered twice: its acknowledgement was lost
		stored, err := ob.StoreCommand(ctx, in, nil)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("stored:", stored)
	}

	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error)
	go func() { done <- cmds.Run(ctx) }()
	<-applied
	cancel()
	<-done

	var cents int
	ob.DB().QueryRow(`SELECT cents FROM prices WHERE sku = 'coffee'`).Scan(&cents)
	var answer string
	ob.DB().QueryRow(`SELECT CAST(payload AS TEXT) FROM outbox WHERE topic = 'stores/42/answers'`).Scan(&answer)
	fmt.Println("price:", cents)
	fmt.Println("answer:", answer)
	// Output:
	// stored: true
	// stored: false
	// cmd-1 applied
	// price: 250
	// answer: {"command":"cmd-1","source":"/backend","status":"applied","result":{"price_set":true}}
}
