// The messages the benchmark writes, and the ways it writes them: bulk preloads through
// outbox.enqueue_many, and the bench.created side table that keeps each message's exact
// created_at after the relay has deleted its row.
#pragma once

#include <pqxx/pqxx>

#include <cstdint>
#include <string>
#include <unordered_map>

namespace outbox::bench {

/// Every scenario's relay has one destination of this name.
inline constexpr const char* kDestination = "bench";

struct MessageShape {
  int keys = 0;               ///< 0: no ordering key; else key "k<i mod keys>".
  std::string deliver_after;  ///< RFC 3339 instant; empty: due as soon as committed.
};

/// A JSON object of ~200 bytes (as text), distinct per `i`; of SetPayloadBytes' size once set.
std::string Payload(std::int64_t i);
/// From now on every Payload is `bytes` long (its note padded; under ~50 bytes, the shortest
/// such payload) (--payload-bytes: large payloads, e.g. what max_in_flight_bytes bounds).
void SetPayloadBytes(std::size_t bytes);
/// The JSON array outbox.enqueue_many takes, for messages first .. first + count - 1.
std::string EnqueueManyArgument(std::int64_t first, int count, const MessageShape& shape);

/// The statement producers run: returns how many messages one enqueue_many call wrote.
inline constexpr const char* kEnqueueManySql = "SELECT count(*) FROM outbox.enqueue_many($1::jsonb)";
/// Copies one message's (id, idempotency_key, created_at) into bench.created, in the
/// producer's own transaction (so the row is visible and not yet claimed).
inline constexpr const char* kRecordOneSql =
    "INSERT INTO bench.created SELECT id, idempotency_key, created_at FROM outbox.messages "
    "WHERE id = $1";

/// Writes `n` messages with outbox.enqueue_many, 1000 per transaction, over `connections`
/// connections with synchronous_commit off. Returns the rate in messages per second.
double Preload(const std::string& url, std::int64_t n, const MessageShape& shape, int connections);

/// VACUUM (ANALYZE) the queue and CHECKPOINT: every measured phase starts from the same
/// physical state (hint bits set, statistics fresh, no checkpoint due from the preload).
void PrepareTable(const std::string& url);

/// Copies (id, idempotency_key, created_at) of every queued message into bench.created,
/// so latencies can be computed after the relay deleted the rows.
void RecordCreatedAt(const std::string& url);

/// Schema `bench` with bench.created (idempotent).
void CreateBenchSchema(pqxx::connection& conn);

/// bench.created read back: created_at in microseconds by message id and by idempotency key.
struct CreatedAt {
  std::unordered_map<std::int64_t, std::int64_t> by_id;
  std::unordered_map<std::string, std::int64_t> by_key;
};
/// Reads bench.created of `url` (empty URL: nothing).
CreatedAt LoadCreatedAt(const std::string& url);

/// last_value of the id sequence: ids handed out so far (each insert takes one).
std::int64_t IdsHandedOut(pqxx::connection& conn);

}  // namespace outbox::bench
