#include "outbox_relay/status.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "queries.h"
#include "store_access.h"
#include "target_health_json.h"

namespace outbox::relay {
namespace q = sql::queries;
namespace {

std::optional<double> OptDouble(const pqxx::field& f) {
  if (f.is_null()) return std::nullopt;
  return f.as<double>();
}

std::string TextOr(const pqxx::field& f, std::string fallback = "") {
  return f.is_null() ? fallback : f.as<std::string>();
}

}  // namespace

double QueueTableStatus::DeadRatio() const {
  const double total = static_cast<double>(live_tuples) + static_cast<double>(dead_tuples);
  return total > 0 ? static_cast<double>(dead_tuples) / total : 0.0;
}

std::optional<double> QueueTableStatus::LastAnyVacuumEpoch() const {
  if (last_vacuum_epoch && last_autovacuum_epoch)
    return std::max(*last_vacuum_epoch, *last_autovacuum_epoch);
  return last_vacuum_epoch ? last_vacuum_epoch : last_autovacuum_epoch;
}

const DestinationStatus* StatusSnapshot::Find(const std::string& destination) const& {
  for (const auto& d : destinations) {
    if (d.destination == destination) return &d;
  }
  return nullptr;
}

StatusSnapshot ReadStatus(Store& store) { return ReadStatus(store, StatusOptions{}); }

StatusSnapshot ReadStatus(Store& store, const StatusOptions& options) {
  return Translated([&]() -> StatusSnapshot {
    pqxx::connection& c = StoreAccess::Connection(store);
    // One snapshot for every statement, so the queue and the dead letters agree with each
    // other (a message is never counted in both, nor in neither).
    pqxx::transaction<pqxx::repeatable_read, pqxx::read_only> tx(c);
    tx.exec("SET LOCAL statement_timeout = " +
            std::to_string(std::max<long long>(1, options.statement_timeout.count())));
    // A Store that also ran statements on the queue plans without sequential and bitmap scans
    // (queue_session.sql, claim_session.sql); the counts below are scans of whole tables,
    // planned as PostgreSQL would. (The relay reads its status on a Store of its own; this
    // keeps it so on any Store.)
    tx.exec(
        "SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL enable_bitmapscan TO DEFAULT; "
        "SET LOCAL enable_sort TO DEFAULT");

    StatusSnapshot s;
    std::map<std::string, DestinationStatus> by_name;
    for (const auto& name : options.destinations) by_name[name].destination = name;

    // The two passes over whole tables, under a savepoint: when they run past the statement
    // timeout, the rest is still read (review: the status of a queue of ~8M rows or more was
    // an error and nothing else, the oldest transaction included).
    try {
      pqxx::subtransaction counts(tx, "counts");
      const auto queue = counts.exec(std::string(q::kstatus_queue));
      const auto dead = counts.exec(std::string(q::kstatus_dead_letters));
      counts.commit();
      for (const auto& r : queue) {
        auto& d = by_name[r["destination"].as<std::string>()];
        d.destination = r["destination"].as<std::string>();
        d.depth = r["depth"].as<std::int64_t>();
        d.in_flight = r["in_flight"].as<std::int64_t>();
        d.retrying = r["retrying"].as<std::int64_t>();
        d.blocked = r["blocked"].as<std::int64_t>();
        d.expired_leases = r["expired_leases"].as<std::int64_t>();
        d.oldest_pending_age_seconds = r["oldest_pending_age_seconds"].as<double>();
      }
      for (const auto& r : dead) {
        auto& d = by_name[r["destination"].as<std::string>()];
        d.destination = r["destination"].as<std::string>();
        d.dead_letters = r["dead_letters"].as<std::int64_t>();
        d.newest_dead_letter_epoch = OptDouble(r["newest_dead_at_epoch"]);
      }
    } catch (const pqxx::sql_error& e) {
      if (e.sqlstate() != "57014") throw;  // query_canceled: the statement timeout
      s.counts_error = "the pass over the queue and the dead letters took longer than " +
                       std::to_string(std::max<long long>(1, options.statement_timeout.count())) +
                       " ms and was cancelled (statement_timeout); the queue table's live rows "
                       "below say how large it is";
    }
    for (const auto& r :
         tx.exec_params(std::string(q::kstatus_relays),
                        static_cast<double>(options.relay_heartbeat_expiry.count()) / 1000.0)) {
      auto& d = by_name[r["destination"].as<std::string>()];
      d.destination = r["destination"].as<std::string>();
      d.relays = r["relays"].as<std::int64_t>();
    }
    for (const auto& r :
         tx.exec_params(std::string(q::kstatus_targets),
                        static_cast<double>(options.relay_heartbeat_expiry.count()) / 1000.0)) {
      auto& d = by_name[r["destination"].as<std::string>()];
      d.destination = r["destination"].as<std::string>();
      d.targets.push_back(RelayTargetHealth{
          r["instance_id"].as<std::string>(), r["description"].as<std::string>(),
          TargetHealthFromJson(nlohmann::json::parse(r["health"].as<std::string>()))});
    }
    for (const auto& r : tx.exec(std::string(q::kpaused_destinations))) {
      auto& d = by_name[r["destination"].as<std::string>()];
      d.destination = r["destination"].as<std::string>();
      d.paused = true;
      d.paused_reason = r["reason"].as<std::string>();
    }
    s.destinations.reserve(by_name.size());
    for (auto& [name, d] : by_name) s.destinations.push_back(std::move(d));

    {
      const auto r = tx.exec1(std::string(q::kstatus_table));
      s.taken_at_epoch = r["now_epoch"].as<double>();
      s.table.live_tuples = r["n_live_tup"].as<std::int64_t>();
      s.table.dead_tuples = r["n_dead_tup"].as<std::int64_t>();
      s.table.last_vacuum_epoch = OptDouble(r["last_vacuum_epoch"]);
      s.table.last_autovacuum_epoch = OptDouble(r["last_autovacuum_epoch"]);
      s.table.vacuum_count = r["vacuum_count"].as<std::int64_t>();
      s.table.autovacuum_count = r["autovacuum_count"].as<std::int64_t>();
      s.table.total_bytes = r["total_bytes"].as<std::int64_t>();
    }
    {
      const auto r = tx.exec1(std::string(q::kstatus_lock_waits));
      s.lock_waiters = r["lock_waiters"].as<std::int64_t>();
      s.longest_lock_wait_seconds = r["longest_wait_seconds"].as<double>();
    }
    {
      const auto r = tx.exec1(std::string(q::kstatus_oldest_xact));
      s.xmin_lag_xids = r["xmin_lag_xids"].as<std::int64_t>();
      if (!r["kind"].is_null()) {
        OldestTransaction t;
        t.kind = r["kind"].as<std::string>();
        if (!r["pid"].is_null()) t.pid = r["pid"].as<int>();
        t.user = TextOr(r["usename"]);
        t.application_name = TextOr(r["application_name"]);
        t.state = TextOr(r["state"]);
        t.gid = TextOr(r["gid"]);
        t.age_seconds = r["age_seconds"].is_null() ? 0.0 : r["age_seconds"].as<double>();
        if (!r["xmin_age_xids"].is_null()) t.xmin_age_xids = r["xmin_age_xids"].as<std::int64_t>();
        s.oldest_transaction = std::move(t);
      }
    }
    tx.commit();
    return s;
  });
}

}  // namespace outbox::relay
