#include <sys/socket.h>

#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <stdexcept>

#include "outbox_relay/conninfo.h"
#include "outbox_relay/postgres_endpoint_directory.h"
#include "queries.h"

namespace outbox::relay {
namespace {

class PostgresEndpointDirectory final : public EndpointDirectory {
 public:
  PostgresEndpointDirectory(std::string database_url, std::string destination);
  std::int64_t Version() override;
  Directory Load() override;
  std::unordered_set<std::string> OwedKeys(const std::vector<std::string>& keys) override;
  std::int64_t WakeEndpoint(const std::string& endpoint_id, std::chrono::milliseconds hold,
                            std::chrono::milliseconds margin) override;
  void RecordAttempts(const std::vector<AttemptRow>& rows, bool log) override;
  std::vector<AutoDisabled> DisableFailing(std::chrono::milliseconds after,
                                           const std::string& events_destination) override;
  std::int64_t CleanupAttempts(std::chrono::milliseconds retention) override;
  void Interrupt() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct PostgresEndpointDirectory::Impl {
  std::string url;
  std::string destination;
  // Replaced only under conn_mu, which Interrupt takes to reach its socket from another thread.
  std::mutex conn_mu;
  std::atomic<bool> interrupted{false};
  std::unique_ptr<pqxx::connection> conn;

  pqxx::connection& Get() {
    if (interrupted) throw std::runtime_error("interrupted: the relay is stopping");
    if (conn && conn->is_open()) return *conn;
    Drop();
    auto c = std::make_unique<pqxx::connection>(WithConnectionDefaults(url));
    // A stuck read must not hold the planner (and with it every delivery) for long.
    pqxx::nontransaction tx(*c);
    tx.exec("SET statement_timeout = 5000");
    tx.exec("SET application_name = 'outbox-relay endpoints'");
    std::lock_guard lk(conn_mu);
    conn = std::move(c);
    if (interrupted) throw std::runtime_error("interrupted: the relay is stopping");
    return *conn;
  }

  void Drop() {
    std::unique_ptr<pqxx::connection> dropped;  // closed outside the lock
    std::lock_guard lk(conn_mu);
    dropped = std::move(conn);
  }

  template <class F>
  auto Run(F f) {
    try {
      return f(Get());
    } catch (...) {
      Drop();  // the next call reconnects
      throw;
    }
  }
};

void PostgresEndpointDirectory::Interrupt() {
  std::lock_guard lk(impl_->conn_mu);
  impl_->interrupted = true;
  // Shut down, not closed: the statement under way gets an error from libpq at once, and the
  // descriptor stays this connection's until the owner drops it (under conn_mu).
  if (impl_->conn && impl_->conn->is_open()) {
    const int fd = impl_->conn->sock();
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

PostgresEndpointDirectory::PostgresEndpointDirectory(std::string database_url,
                                                     std::string destination)
    : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(database_url);
  impl_->destination = std::move(destination);
}

std::int64_t PostgresEndpointDirectory::Version() {
  return impl_->Run([](pqxx::connection& c) {
    pqxx::nontransaction tx(c);
    return tx.exec1("SELECT version FROM outbox.endpoint_registry")[0].as<std::int64_t>();
  });
}

Directory PostgresEndpointDirectory::Load() {
  return impl_->Run([this](pqxx::connection& c) {
    Directory d;
    // One snapshot for the version and the rows: a change committed after it moves the
    // version past what this returns, and the next poll loads again.
    pqxx::work tx(c, "load endpoints");
    tx.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY");
    d.version = tx.exec1("SELECT version FROM outbox.endpoint_registry")[0].as<std::int64_t>();
    const auto rows = tx.exec_params(
        "SELECT e.id, (extract(epoch FROM e.created_at) * 1000000)::bigint AS incarnation, "
        "       e.url, array_to_json(e.event_types)::text AS event_types, "
        "       e.headers::text AS headers, e.max_in_flight, e.rate_limit, e.enabled, "
        "       e.breaker::text AS breaker, e.adaptive_concurrency, "
        "       (SELECT coalesce(json_agg(s.secret ORDER BY s.created_at DESC), '[]')::text "
        "          FROM outbox.endpoint_secrets s WHERE s.endpoint_id = e.id "
        "           AND (s.expires_at IS NULL OR s.expires_at > clock_timestamp())) AS secrets, "
        "       (SELECT (extract(epoch FROM min(s.expires_at)) * 1000)::bigint "
        "          FROM outbox.endpoint_secrets s WHERE s.endpoint_id = e.id "
        "           AND s.expires_at > clock_timestamp()) AS next_expiry_ms "
        "FROM outbox.endpoints e WHERE e.destination = $1 ORDER BY e.id",
        impl_->destination);
    for (const auto& row : rows) {
      EndpointSpec spec;
      spec.id = row["id"].as<std::string>();
      spec.incarnation = row["incarnation"].as<std::int64_t>();
      spec.url = row["url"].as<std::string>();
      const auto event_types = nlohmann::json::parse(row["event_types"].c_str());
      for (const auto& t : event_types) {
        spec.event_types.push_back(t.get<std::string>());
      }
      const auto headers = nlohmann::json::parse(row["headers"].c_str());
      for (const auto& [name, value] : headers.items()) {
        if (value.is_string()) spec.headers[name] = value.get<std::string>();
      }
      if (!row["max_in_flight"].is_null()) spec.max_in_flight = row["max_in_flight"].as<int>();
      if (!row["rate_limit"].is_null()) spec.rate_limit = row["rate_limit"].as<int>();
      const auto breaker = nlohmann::json::parse(row["breaker"].c_str());
      if (breaker.contains("enabled")) spec.breaker_enabled = breaker["enabled"].get<bool>();
      if (breaker.contains("failure_threshold")) {
        spec.failure_threshold = breaker["failure_threshold"].get<int>();
      }
      if (breaker.contains("cooldown_ms"))
        spec.cooldown_ms = breaker["cooldown_ms"].get<long long>();
      if (breaker.contains("max_cooldown_ms")) {
        spec.max_cooldown_ms = breaker["max_cooldown_ms"].get<long long>();
      }
      if (!row["adaptive_concurrency"].is_null()) {
        spec.adaptive_concurrency = row["adaptive_concurrency"].as<bool>();
      }
      spec.enabled = row["enabled"].as<bool>();
      const auto secrets = nlohmann::json::parse(row["secrets"].c_str());
      for (const auto& s : secrets) {
        spec.secrets.push_back(s.get<std::string>());
      }
      if (!row["next_expiry_ms"].is_null()) {
        const std::chrono::system_clock::time_point at{
            std::chrono::milliseconds(row["next_expiry_ms"].as<std::int64_t>())};
        if (!d.next_expiry || at < *d.next_expiry) d.next_expiry = at;
      }
      d.endpoints.push_back(std::move(spec));
    }
    tx.commit();
    return d;
  });
}

std::unordered_set<std::string> PostgresEndpointDirectory::OwedKeys(
    const std::vector<std::string>& keys) {
  std::unordered_set<std::string> owed;
  if (keys.empty()) return owed;
  return impl_->Run([&](pqxx::connection& c) {
    pqxx::nontransaction tx(c);
    // One probe of the partial index per key, however many endpoint rows wait (owed_keys.sql).
    const auto rows = tx.exec_params(std::string(sql::queries::kowed_keys), impl_->destination,
                                     nlohmann::json(keys).dump());
    for (const auto& row : rows) owed.insert(row[0].as<std::string>());
    return owed;
  });
}

std::int64_t PostgresEndpointDirectory::WakeEndpoint(const std::string& endpoint_id,
                                                     std::chrono::milliseconds hold,
                                                     std::chrono::milliseconds margin) {
  return impl_->Run([&](pqxx::connection& c) -> std::int64_t {
    pqxx::nontransaction tx(c);
    // A range of messages_parked_idx: what was parked for `hold` since the endpoint was
    // enabled (`margin` before, for settles that read the clock before the enable began), a
    // few seconds' holds, not a read of the endpoint's whole backlog (review). The bounds are
    // stable (now(), an initplan), so they bound the index scan.
    const auto r = tx.exec_params(
        "UPDATE outbox.messages SET deliver_after = clock_timestamp() "
        "WHERE destination = $2 AND parked "
        "  AND deliver_after > (SELECT coalesce(e.enabled_at, now()) FROM outbox.endpoints e "
        "                       WHERE e.id = $1)"
        "                      + make_interval(secs => ($3::bigint - $4::bigint) / 1000.0) "
        "  AND deliver_after <= now() + make_interval(secs => $3::bigint / 1000.0) "
        "  AND endpoint_id = $1 AND lease_owner IS NULL",
        endpoint_id, impl_->destination, static_cast<std::int64_t>(hold.count()),
        static_cast<std::int64_t>(margin.count()));
    // Due at once: wakes the relays as a new message does, not their next poll.
    if (r.affected_rows() > 0) tx.exec("SELECT pg_notify('outbox_messages', '')");
    return static_cast<std::int64_t>(r.affected_rows());
  });
}

void PostgresEndpointDirectory::RecordAttempts(const std::vector<AttemptRow>& rows, bool log) {
  if (rows.empty()) return;
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  auto us = [](std::chrono::system_clock::time_point t) {
    return duration_cast<microseconds>(t.time_since_epoch()).count();
  };
  // Each endpoint's health from this batch, summed up here: the database gets one row per
  // endpoint, whatever the number of requests.
  struct Health {
    std::int64_t last_ok = 0, last_failure = 0, first_failure_after_ok = 0;
  };
  std::map<std::string, Health> health;
  for (const auto& r : rows) {
    auto& h = health[r.endpoint_id];
    if (r.outcome == "delivered") {
      h.last_ok = std::max(h.last_ok, us(r.at));
    } else {
      h.last_failure = std::max(h.last_failure, us(r.at));
    }
  }
  for (const auto& r : rows) {
    auto& h = health[r.endpoint_id];
    if (r.outcome != "delivered" && us(r.at) > h.last_ok &&
        (h.first_failure_after_ok == 0 || us(r.at) < h.first_failure_after_ok)) {
      h.first_failure_after_ok = us(r.at);
    }
  }
  auto ts = [](std::int64_t v) { return v == 0 ? nlohmann::json() : nlohmann::json(v); };
  nlohmann::json summary = nlohmann::json::array();
  for (const auto& [endpoint, h] : health) {
    summary.push_back({{"endpoint_id", endpoint},
                       {"last_ok_us", ts(h.last_ok)},
                       {"last_failure_us", ts(h.last_failure)},
                       {"failing_since_us", ts(h.first_failure_after_ok)}});
  }
  nlohmann::json batch = nlohmann::json::array();
  if (log) {
    for (const auto& r : rows) {
      batch.push_back({{"endpoint_id", r.endpoint_id},
                       {"delivery_id", r.delivery_id},
                       {"at_us", us(r.at)},
                       {"status", r.status == 0 ? nlohmann::json() : nlohmann::json(r.status)},
                       {"latency_ms", r.took.count()},
                       {"outcome", r.outcome},
                       {"error", r.error.empty() ? nlohmann::json() : nlohmann::json(r.error)},
                       {"body", r.body}});
    }
  }
  impl_->Run([&](pqxx::connection& c) {
    pqxx::nontransaction tx(c);
    tx.exec_params(
        "WITH logged AS ("
        "  INSERT INTO outbox.delivery_attempts (destination, endpoint_id, delivery_id,"
        "         attempted_at, status, outcome, latency_ms, error, response_body)"
        "  SELECT $2, x.endpoint_id, x.delivery_id, to_timestamp(x.at_us / 1e6), x.status,"
        "         x.outcome, x.latency_ms, x.error, x.body"
        "  FROM jsonb_to_recordset($1::jsonb) AS x(endpoint_id text, delivery_id uuid,"
        "       at_us bigint, status integer, latency_ms integer, outcome text, error text,"
        "       body text)"
        ")"
        "INSERT INTO outbox.endpoint_health AS h (endpoint_id, failing_since, last_success_at,"
        "                                         last_failure_at)"
        // Failing since no earlier than its last enable: failures of requests from before it
        // (log rows written late, requests in flight when it was disabled) set the time back
        // past the operator's enable, and the next check disabled it again (review).
        "SELECT s.endpoint_id, CASE WHEN s.failing_since_us IS NOT NULL THEN"
        "         greatest(to_timestamp(s.failing_since_us / 1e6), e.enabled_at) END,"
        "       to_timestamp(s.last_ok_us / 1e6), to_timestamp(s.last_failure_us / 1e6)"
        "  FROM jsonb_to_recordset($3::jsonb) AS s(endpoint_id text, last_ok_us bigint,"
        "       last_failure_us bigint, failing_since_us bigint)"
        "  JOIN outbox.endpoints e ON e.id = s.endpoint_id "
        "ON CONFLICT (endpoint_id) DO UPDATE SET"
        "  failing_since = CASE"
        "    WHEN excluded.failing_since IS NULL THEN NULL"  // the batch ended on a success
        "    WHEN excluded.last_success_at IS NOT NULL THEN excluded.failing_since"
        "    ELSE coalesce(h.failing_since, excluded.failing_since) END,"
        "  last_success_at = coalesce(excluded.last_success_at, h.last_success_at),"
        "  last_failure_at = coalesce(excluded.last_failure_at, h.last_failure_at)",
        batch.dump(), impl_->destination, summary.dump());
  });
}

std::vector<AutoDisabled> PostgresEndpointDirectory::DisableFailing(
    std::chrono::milliseconds after, const std::string& events_destination) {
  return impl_->Run([&](pqxx::connection& c) {
    std::vector<AutoDisabled> out;
    pqxx::work tx(c);
    // Failing for the whole period: since its start, with no success, and a failure at its end
    // (one failure and nothing sent since is no endpoint known to be down: review).
    // Nothing to disable (nearly always): no UPDATE. Even one that changes no row fires the
    // registry's statement trigger, which took the registry's lock and moved its version, so
    // every relay read the whole registry again after each check, every few seconds (review).
    const auto candidates = tx.exec_params(
        "SELECT 1 FROM outbox.endpoints e JOIN outbox.endpoint_health h ON h.endpoint_id = e.id "
        "WHERE e.destination = $1 AND e.enabled "
        "  AND h.failing_since < clock_timestamp() - make_interval(secs => $2::bigint / 1000.0) "
        "  AND h.last_failure_at >= h.failing_since + make_interval(secs => $2::bigint / 1000.0) "
        "LIMIT 1",
        impl_->destination, static_cast<long long>(after.count()));
    if (candidates.empty()) return out;
    const auto rows = tx.exec_params(
        "UPDATE outbox.endpoints e SET enabled = false, auto_disabled_at = clock_timestamp(),"
        "  updated_at = clock_timestamp(),"
        "  disabled_reason = 'disabled automatically: failing since ' ||"
        "    to_char(h.failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
        "FROM outbox.endpoint_health h "
        "WHERE h.endpoint_id = e.id AND e.destination = $1 AND e.enabled"
        "  AND h.failing_since < clock_timestamp() - make_interval(secs => $2::bigint / 1000.0) "
        "  AND h.last_failure_at >= h.failing_since + make_interval(secs => $2::bigint / 1000.0) "
        "RETURNING e.id,"
        "  to_char(h.failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
        impl_->destination, static_cast<long long>(after.count()));
    for (const auto& row : rows) {
      AutoDisabled d{row[0].as<std::string>(), row[1].as<std::string>()};
      if (!events_destination.empty()) {
        const nlohmann::json event = {{"type", "endpoint.disabled"},
                                      {"endpoint_id", d.endpoint_id},
                                      {"destination", impl_->destination},
                                      {"failing_since", d.failing_since},
                                      {"reason", "failing"}};
        tx.exec_params(
            "SELECT outbox.enqueue($1, $2::jsonb, NULL, '{}'::jsonb, 'endpoint.disabled')",
            events_destination, event.dump());
      }
      out.push_back(std::move(d));
    }
    tx.commit();
    return out;
  });
}

std::int64_t PostgresEndpointDirectory::CleanupAttempts(std::chrono::milliseconds retention) {
  return impl_->Run([&](pqxx::connection& c) -> std::int64_t {
    pqxx::nontransaction tx(c);
    const auto r = tx.exec_params(
        "DELETE FROM outbox.delivery_attempts WHERE id IN ("
        "  SELECT id FROM outbox.delivery_attempts"
        "  WHERE attempted_at < clock_timestamp() - make_interval(secs => $1::bigint / 1000.0)"
        "    AND destination = $2"
        "  ORDER BY attempted_at LIMIT $3)",
        static_cast<long long>(retention.count()), impl_->destination,
        static_cast<long long>(kCleanupBatch));
    return static_cast<std::int64_t>(r.affected_rows());
  });
}

}  // namespace

std::unique_ptr<EndpointDirectory> MakePostgresEndpointDirectory(const std::string& database_url,
                                                                 const std::string& destination) {
  return std::make_unique<PostgresEndpointDirectory>(database_url, destination);
}

}  // namespace outbox::relay
