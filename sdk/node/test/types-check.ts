// Compiled with `tsc --noEmit --strict` by run_tests.sh: the declarations accept what the
// README shows and refuse what they should.
import { Client } from 'pg';
import { publish, publishMany, InvalidMessage, Message } from '..';

async function example(client: Client): Promise<number[]> {
  const id: number = await publish(client, {
    destination: 'orders', json: { order: 42 }, key: 'order-42', eventType: 'order.paid',
    headers: { tenant: 'acme' }, deliverAt: new Date(), idempotencyKey: null,
  });
  const batch: Message[] = [{ destination: 'files', data: new Uint8Array([1]) },
    { destination: 'orders', jsonText: '{"amount": 12345678901234567890123}' }];
  const ids: number[] = await publishMany(client, batch);
  try {
    await publish(client, { destination: '', json: 1 });
  } catch (e) {
    if (e instanceof InvalidMessage) console.log(e.hint, e.sqlstate);
  }
  // @ts-expect-error: a destination is required
  await publish(client, { json: 1 });
  // @ts-expect-error: headers are strings
  await publish(client, { destination: 'orders', json: 1, headers: { n: 1 } });
  // @ts-expect-error: jsonText is JSON text, not a value
  await publish(client, { destination: 'orders', jsonText: { amount: 1 } });
  return [id, ...ids];
}
void example;
