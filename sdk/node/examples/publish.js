'use strict';
// Publishes an order's event in the same transaction as the order's update.
//   OUTBOX_DATABASE_URL=postgresql://app@db/app node examples/publish.js
const { Client } = require('pg');
const { publish, InvalidMessage } = require('..');

async function main() {
  const client = new Client({ connectionString: process.env.OUTBOX_DATABASE_URL });
  await client.connect();
  try {
    await client.query('BEGIN');
    await client.query('CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, state text)');
    await client.query("INSERT INTO orders VALUES (42, 'paid') ON CONFLICT (id) DO UPDATE SET state = 'paid'");
    const id = await publish(client, {
      destination: 'orders', json: { order: 42, state: 'paid' }, key: 'order-42', eventType: 'order.paid',
    });
    await client.query('COMMIT');
    console.log(`order 42 paid; outbox message ${id} queued`);
  } catch (e) {
    await client.query('ROLLBACK');
    if (e instanceof InvalidMessage) console.error(`refused: ${e.message}`);
    throw e;
  } finally {
    await client.end();
  }
}

main().catch(() => { process.exitCode = 1; });
