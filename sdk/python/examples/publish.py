"""Publishes an order and its outbox message in one transaction.

    python3 sdk/python/examples/publish.py postgresql://postgres@127.0.0.1:5432/postgres
"""
import os
import sys

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from outbox_writer import Message, publish  # noqa: E402

with psycopg.connect(sys.argv[1]) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS demo_orders (id int PRIMARY KEY, state text)")
    conn.execute("INSERT INTO demo_orders VALUES (42, 'paid') ON CONFLICT (id) DO UPDATE SET state = 'paid'")
    new_id = publish(conn, Message("orders", json={"order": 42, "state": "paid"},
                                   key="order-42", event_type="order.paid"))
print(f"published outbox message {new_id}")
