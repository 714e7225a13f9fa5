#include "workload.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "common.h"

namespace outbox::bench {

namespace {
std::atomic<std::size_t> payload_bytes{0};  // 0: the ~200-byte event
}  // namespace

void SetPayloadBytes(std::size_t bytes) { payload_bytes = bytes; }

std::string Payload(std::int64_t i) {
  // Shaped like a typical domain event; the note pads the text to ~200 bytes.
  const std::size_t want = payload_bytes.load();
  if (want > 0) {
    std::string out =
        "{\"event\": \"order.updated\", \"order_id\": " + std::to_string(i) + ", \"note\": \"";
    const std::size_t tail = 2;  // "}
    if (out.size() + tail < want) out.append(want - out.size() - tail, 'x');
    out += "\"}";
    return out;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{\"event\": \"order.updated\", \"order_id\": %lld, \"customer_id\": \"c-%07lld\", "
                "\"amount_cents\": %lld, \"currency\": \"EUR\", \"status\": \"paid\", "
                "\"note\": \"%.*s\"}",
                static_cast<long long>(i), static_cast<long long>(i % 9'999'999),
                static_cast<long long>(1000 + i % 90'000), 40,
                "lorem ipsum dolor sit amet consectetur adipiscing");
  return buf;
}

std::string EnqueueManyArgument(std::int64_t first, int count, const MessageShape& shape) {
  std::string out = "[";
  out.reserve(static_cast<std::size_t>(count) * 300);
  for (int k = 0; k < count; ++k) {
    const std::int64_t i = first + k;
    if (k > 0) out += ',';
    out += "{\"destination\":\"";
    out += kDestination;
    out += "\",\"event_type\":\"order.updated\",\"payload\":";
    out += Payload(i);
    if (shape.keys > 0) out += ",\"ordering_key\":\"k" + std::to_string(i % shape.keys) + "\"";
    if (!shape.deliver_after.empty()) out += ",\"deliver_after\":\"" + shape.deliver_after + "\"";
    out += '}';
  }
  out += ']';
  return out;
}

double Preload(const std::string& url, std::int64_t n, const MessageShape& shape, int connections) {
  constexpr int kBatch = 1000;
  const std::int64_t batches = (n + kBatch - 1) / kBatch;
  std::atomic<std::int64_t> next{0};
  const double start = MonoSeconds();
  std::vector<std::thread> threads;
  std::exception_ptr failure;
  std::mutex failure_mu;
  for (int t = 0; t < std::max(connections, 1); ++t) {
    threads.emplace_back([&] {
      try {
        pqxx::connection c(url);
        pqxx::nontransaction(c).exec("SET synchronous_commit = off");
        c.prepare("enqueue", kEnqueueManySql);
        for (std::int64_t b = next++; b < batches; b = next++) {
          const std::int64_t first = b * kBatch;
          const int count = static_cast<int>(std::min<std::int64_t>(kBatch, n - first));
          // Large payloads (--payload-bytes): calls of ~8 MiB at most, the ids as they were.
          const int per_call = static_cast<int>(std::clamp<std::size_t>(
              (std::size_t{8} << 20) / std::max<std::size_t>(payload_bytes.load(), 1), 1, kBatch));
          for (int done = 0; done < count; done += per_call) {
            pqxx::work tx(c);
            tx.exec_prepared("enqueue", EnqueueManyArgument(
                                            first + done, std::min(per_call, count - done), shape));
            tx.commit();
          }
        }
      } catch (...) {
        std::lock_guard lk(failure_mu);
        failure = std::current_exception();
        next = batches;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  return static_cast<double>(n) / std::max(MonoSeconds() - start, 1e-6);
}

void PrepareTable(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  tx.exec("VACUUM (ANALYZE) outbox.messages");
  tx.exec("CHECKPOINT");
}

void RecordCreatedAt(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  tx.exec("INSERT INTO bench.created SELECT id, idempotency_key, created_at FROM outbox.messages");
}

void CreateBenchSchema(pqxx::connection& conn) {
  pqxx::nontransaction tx(conn);
  tx.exec("CREATE SCHEMA IF NOT EXISTS bench");
  tx.exec("CREATE TABLE IF NOT EXISTS bench.created (id bigint PRIMARY KEY, "
          "idempotency_key uuid NOT NULL, created_at timestamptz NOT NULL)");
}

CreatedAt LoadCreatedAt(const std::string& url) {
  CreatedAt out;
  if (url.empty()) return out;
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  const auto rows = tx.exec("SELECT id, idempotency_key::text, "
                            "(extract(epoch FROM created_at) * 1000000)::bigint FROM bench.created");
  out.by_id.reserve(rows.size());
  out.by_key.reserve(rows.size());
  for (const auto& r : rows) {
    const auto created = r[2].as<std::int64_t>();
    out.by_id.emplace(r[0].as<std::int64_t>(), created);
    out.by_key.emplace(r[1].as<std::string>(), created);
  }
  return out;
}

std::int64_t IdsHandedOut(pqxx::connection& conn) {
  pqxx::nontransaction tx(conn);
  // Under the sequence's lock, like the claim (see claim_settle_scan.sql).
  return tx.exec1("SELECT coalesce(pg_sequence_last_value('outbox.messages_id_seq'), 0)")[0]
      .as<std::int64_t>();
}

}  // namespace outbox::bench
