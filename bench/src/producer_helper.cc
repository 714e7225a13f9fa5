// Producers, in their own process: application transactions writing outbox messages while
// the relay runs. Every producer connection sets synchronous_commit = off (as a
// latency-tolerant high-volume writer would); the server default stays on.
//
// Commands (each runs to completion, then answers):
//   SUSTAIN db_url threads batch seconds keys
//       `threads` connections, each committing transactions of `batch` messages
//       (outbox.enqueue_many) back to back for `seconds`: as fast as Postgres takes them.
//       -> OK {"inserted", "transactions", "seconds", "rate"}
//   OPENLOOP db_url rate seconds threads keys
//       One message per transaction on a fixed schedule of `rate` per second, spread over
//       `threads` connections; a late insert does not shift the ones after it (open loop).
//       Each transaction also copies its message's exact created_at into bench.created.
//       -> OK {"inserted", "seconds", "rate", "max_lag_ms", "late"}
#include <pqxx/pqxx>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "common.h"
#include "helper.h"
#include "workload.h"

namespace outbox::bench {
namespace {

// Runs `body(thread_index)` on `threads` threads; rethrows the first failure.
template <class Body>
void RunThreads(int threads, Body body) {
  std::vector<std::thread> pool;
  std::exception_ptr failure;
  std::mutex mu;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        body(t);
      } catch (...) {
        std::lock_guard lk(mu);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
}

void AsyncCommit(pqxx::connection& c) { pqxx::nontransaction(c).exec("SET synchronous_commit = off"); }

nlohmann::json Sustain(const std::string& url, int threads, int batch, double seconds, int keys) {
  std::atomic<std::int64_t> inserted{0}, transactions{0}, next_index{0};
  const double start = MonoSeconds();
  const double end = start + seconds;
  RunThreads(threads, [&](int) {
    pqxx::connection c(url);
    AsyncCommit(c);
    c.prepare("enqueue", kEnqueueManySql);
    MessageShape shape;
    shape.keys = keys;
    while (MonoSeconds() < end) {
      const std::int64_t first = next_index.fetch_add(batch);
      pqxx::work tx(c);
      tx.exec_prepared("enqueue", EnqueueManyArgument(first, batch, shape));
      tx.commit();
      inserted += batch;
      ++transactions;
    }
  });
  const double elapsed = MonoSeconds() - start;
  return {{"inserted", inserted.load()},
          {"transactions", transactions.load()},
          {"seconds", elapsed},
          {"rate", static_cast<double>(inserted.load()) / elapsed}};
}

nlohmann::json OpenLoop(const std::string& url, double rate, double seconds, int threads, int keys) {
  const auto total = static_cast<std::int64_t>(rate * seconds);
  std::atomic<std::int64_t> next{0}, late{0};
  std::atomic<std::int64_t> max_lag_us{0};
  const auto start = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  RunThreads(threads, [&](int) {
    pqxx::connection c(url);
    AsyncCommit(c);
    c.prepare("enqueue", "SELECT outbox.enqueue_many($1::jsonb)");
    c.prepare("record", kRecordOneSql);
    MessageShape shape;
    shape.keys = keys;
    for (std::int64_t k = next++; k < total; k = next++) {
      const auto due = start + std::chrono::microseconds(static_cast<std::int64_t>(
                                   static_cast<double>(k) * 1e6 / rate));
      std::this_thread::sleep_until(due);
      const auto lag = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - due)
                           .count();
      if (lag > 1000) ++late;
      std::int64_t seen = max_lag_us.load();
      while (lag > seen && !max_lag_us.compare_exchange_weak(seen, lag)) {
      }
      pqxx::work tx(c);
      const auto id = tx.exec_prepared1("enqueue", EnqueueManyArgument(k, 1, shape))[0].as<std::int64_t>();
      tx.exec_prepared("record", id);
      tx.commit();
    }
  });
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {{"inserted", total},
          {"seconds", elapsed},
          {"rate", static_cast<double>(total) / elapsed},
          {"max_lag_ms", static_cast<double>(max_lag_us.load()) / 1000.0},
          {"late", late.load()}};
}

}  // namespace

int RunProducerHelper() {
  return ServeCommands([](const std::vector<std::string>& w) -> std::string {
    if (w[0] == "SUSTAIN" && w.size() == 6) {
      return Sustain(w[1], std::stoi(w[2]), std::stoi(w[3]), std::stod(w[4]), std::stoi(w[5])).dump();
    }
    if (w[0] == "OPENLOOP" && w.size() == 6) {
      return OpenLoop(w[1], std::stod(w[2]), std::stod(w[3]), std::stoi(w[4]), std::stoi(w[5])).dump();
    }
    throw std::runtime_error("bad command");
  });
}

}  // namespace outbox::bench
