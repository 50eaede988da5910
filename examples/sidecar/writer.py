#!/usr/bin/env python3
"""A shop program in Python that uses the outbox with nothing but sqlite3.

Each sale inserts its business row and its event row in ONE transaction;
outboxctl relay, running beside it, publishes the events to the broker.
Every fifth sale fails after both inserts and rolls back: its event must
never be published.

    outboxctl init --db /tmp/shop.db
    python3 examples/sidecar/writer.py /tmp/shop.db 50
    outboxctl relay --db /tmp/shop.db --broker tcp://127.0.0.1:1883
"""
import json
import sqlite3
import sys


def main():
    path, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the write
    # lock is taken up front; the busy timeout waits for the relay's writes.
    db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    db.execute("CREATE TABLE IF NOT EXISTS sales (id INTEGER PRIMARY KEY, amount_cents INTEGER NOT NULL)")
    committed = rolled_back = 0
    for i in range(1, count + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            cur = db.execute("INSERT INTO sales (amount_cents) VALUES (?)", (100 * i,))
            event = {"sale": cur.lastrowid, "amount_cents": 100 * i}
            # The whole contract: topic and payload. Id, sequence and time
            # come from the table's defaults.
            db.execute(
                "INSERT INTO outbox (topic, payload, type) VALUES (?, ?, ?)",
                ("shop/1/sales", json.dumps(event), "com.example.shop.SaleRecorded"),
            )
            if i % 5 == 0:
                raise RuntimeError("payment terminal error")
            db.execute("COMMIT")
            committed += 1
        except RuntimeError:
            db.execute("ROLLBACK")
            rolled_back += 1
    print(f"committed {committed}, rolled back {rolled_back}")


if __name__ == "__main__":
    main()
