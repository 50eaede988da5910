// Command floor is the size floor for outboxlab bench: a program that uses
// the outbox library's three runtime dependencies — the pure-Go SQLite
// driver, the paho MQTT client and the backoff package — and nothing of the
// library itself. A binary cannot be smaller than this and still store and
// publish.
package main

import (
	"database/sql"
	"fmt"
	"os"
	"time"

	"github.com/cenkalti/backoff/v4"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	_ "modernc.org/sqlite"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: floor DB BROKER")
		os.Exit(2)
	}
	db, err := sql.Open("sqlite", os.Args[1])
	if err != nil {
		panic(err)
	}
	defer db.Close()
	var payload []byte
	if err := db.QueryRow(`SELECT payload FROM outbox ORDER BY seq LIMIT 1`).Scan(&payload); err != nil {
		panic(err)
	}
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(os.Args[2]))
	op := func() error {
		if tok := c.Connect(); tok.Wait() && tok.Error() != nil {
			return tok.Error()
		}
		tok := c.Publish("floor", 1, false, payload)
		tok.Wait()
		return tok.Error()
	}
	if err := backoff.Retry(op, backoff.NewExponentialBackOff(backoff.WithMaxElapsedTime(time.Minute))); err != nil {
		panic(err)
	}
	c.Disconnect(100)
}
