#include "outbox_relay/store.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string_view>

#include "outbox_relay/conninfo.h"
#include "outbox_relay/dead_letters.h"
#include "outbox_relay/retention.h"
#include "outbox_relay/status.h"
#include "queries.h"
#include "store_access.h"
#include "target_health_json.h"

namespace outbox::relay {
namespace q = sql::queries;
namespace {
constexpr const char* kChannel = "outbox_messages";
}  // namespace

// Not in the anonymous namespace: Store::Impl holds one, and a class with a member of such a
// type is warned about (-Wsubobject-linkage) wherever this file is included, as the unity
// build includes it (CMakeLists.txt).
namespace store_detail {

class WakeReceiver final : public pqxx::notification_receiver {
 public:
  WakeReceiver(pqxx::connection_base& c, std::atomic<int>& counter, std::atomic<int>& rebalances)
      : pqxx::notification_receiver(c, kChannel), counter_(counter), rebalances_(rebalances) {}
  void operator()(const std::string& payload, int) override {
    if (payload == "rebalance") rebalances_.fetch_add(1);
    counter_.fetch_add(1);
  }

 private:
  std::atomic<int>& counter_;
  std::atomic<int>& rebalances_;
};

}  // namespace store_detail

namespace {

std::vector<std::pair<std::string, std::string>> ParseHeaders(const pqxx::field& f) {
  std::vector<std::pair<std::string, std::string>> out;
  if (f.is_null() || std::string_view(f.c_str()) == "{}") return out;  // most messages: none
  const auto j = nlohmann::json::parse(f.c_str());
  for (auto it = j.begin(); it != j.end(); ++it) {
    out.emplace_back(it.key(),
                     it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  }
  return out;
}

const char* KindName(Settlement::Kind k) {
  switch (k) {
    case Settlement::Kind::kDelivered:
      return "delivered";
    case Settlement::Kind::kRetry:
      return "retry";
    case Settlement::Kind::kDead:
      return "dead";
    case Settlement::Kind::kRelease:
      return "release";
    case Settlement::Kind::kFanOut:
      return "fanout";
  }
  return "release";
}

}  // namespace

constexpr const char* kInterrupted = "interrupted: the relay is stopping";

struct Store::Impl {
  std::string url;
  // Replaced (made, reset) only under conn_mu, which Interrupt takes to reach its socket from
  // another thread.
  std::mutex conn_mu;
  std::atomic<bool> interrupted{false};
  std::unique_ptr<pqxx::connection> conn;
  std::unique_ptr<store_detail::WakeReceiver> receiver;
  std::atomic<int> notifications{0};
  std::atomic<int> rebalances{0};
  bool listening = false;
  bool claim_session = false;  // claim_session.sql applied on this connection
  bool queue_session = false;  // queue_session.sql (or claim_session.sql) applied
  bool owned_settler = false;  // named Store::kOwnedSettlerName
  std::string last_claim_token;

  pqxx::connection& Get() {
    if (interrupted) throw StoreError(StoreError::Kind::kTransient, "", kInterrupted);
    if (!conn || !conn->is_open()) {
      receiver.reset();
      claim_session = false;
      queue_session = false;
      owned_settler = false;
      auto fresh = std::make_unique<pqxx::connection>(WithConnectionDefaults(url));
      {
        std::lock_guard lk(conn_mu);
        conn = std::move(fresh);
      }
      // Interrupted while it connected: this connection is not used either.
      if (interrupted) throw StoreError(StoreError::Kind::kTransient, "", kInterrupted);
      conn->prepare("claim", std::string(q::kclaim));
      conn->prepare("claim_partitioned", std::string(q::kclaim_partitioned));
      conn->prepare("settle", std::string(q::ksettle));
      conn->prepare("settle_delivered", std::string(q::ksettle_delivered));
      conn->prepare("claim_owned", std::string(q::kclaim_owned));
      conn->prepare("claim_owned_hold", std::string(q::kclaim_owned_hold));
      conn->prepare("settle_owned_adopt", std::string(q::ksettle_owned_adopt));
      conn->prepare("settle_owned_delivered", std::string(q::ksettle_owned_delivered));
      conn->prepare("reap", std::string(q::kreap));
      conn->prepare("reap_full", std::string(q::kreap_full));
      conn->prepare("queue_scan_turn", std::string(q::kqueue_scan_turn));
      conn->prepare("release_lost_claims", std::string(q::krelease_lost_claims));
      conn->prepare("renew_leases", std::string(q::krenew_leases));
      conn->prepare("wake_orphans", std::string(q::kwake_orphans));
      conn->prepare("wake_keys", std::string(q::kwake_keys));
      conn->prepare("destinations", std::string(q::kdestinations));
      conn->prepare("relay_heartbeat", std::string(q::krelay_heartbeat));
      conn->prepare("relay_leave", std::string(q::krelay_leave));
      conn->prepare("paused_destinations", std::string(q::kpaused_destinations));
      if (listening)
        receiver = std::make_unique<store_detail::WakeReceiver>(*conn, notifications, rebalances);
    }
    return *conn;
  }

  // The lease token of the claim about to be sent, remembered as last_claim_token: if the call
  // fails from here on, the claim may have committed with its reply lost.
  std::string NewClaimToken() {
    last_claim_token = NewUuid();
    return last_claim_token;
  }

  // The connection for a claim: with the claim's planner settings, before its first plan.
  // Forgets the previous claim's token first: a failure before the statement is sent leased
  // nothing.
  pqxx::connection& ForClaims() {
    last_claim_token.clear();
    auto& c = Get();
    if (!claim_session) {
      pqxx::nontransaction(c).exec(std::string(q::kclaim_session));
      claim_session = queue_session = true;
    }
    return c;
  }

  // The connection for the other statements on the queue's rows (settle, lease renewal, reap,
  // wakes, handing back lost claims): without sequential and bitmap scans
  // (queue_session.sql) before its first plan. The settler's and the maintenance loop's
  // statements were planned with the defaults: a relay started on an empty queue planned them
  // for an empty table, a sequential scan cost nothing there, and the plan was kept, so after
  // a burst every reap, renewal and key wake read the whole backlog until the table was
  // analyzed again (review; ClaimPlanTest.MaintenanceStatements...).
  pqxx::connection& ForQueue() {
    auto& c = Get();
    if (!queue_session) {
      pqxx::nontransaction(c).exec(std::string(q::kqueue_session));
      queue_session = true;
    }
    return c;
  }

  // ForQueue, for the settles of bucket leases: its backend registered so that
  // claim_owned.sql knows their transactions (migration 0038), and named
  // (Store::kOwnedSettlerName) for whoever reads pg_stat_activity.
  pqxx::connection& ForOwnedSettles() {
    auto& c = ForQueue();
    if (!owned_settler) {
      pqxx::nontransaction tx(c);
      tx.exec("SET application_name = " + tx.quote(Store::kOwnedSettlerName));
      tx.exec("SELECT outbox.register_bucket_lease_settler()");
      owned_settler = true;
    }
    return c;
  }
};

Store::Store(std::string database_url) : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(database_url);
}

Store::~Store() { impl_->receiver.reset(); }

pqxx::connection& StoreAccess::Connection(Store& store) {
  return Translated([&]() -> pqxx::connection& { return store.impl_->Get(); });
}

bool IsTransientSqlState(const std::string& sqlstate) {
  if (sqlstate.size() != 5) return false;
  const std::string cls = sqlstate.substr(0, 2);
  // 08 connection exception, 40 transaction rollback (serialization failure, deadlock,
  // completion unknown), 53 insufficient resources (too many connections, out of memory or
  // disk), 57 operator intervention (admin shutdown, crash shutdown, cannot connect now,
  // query canceled: the statement timeout), 58 system error (I/O); 55P03 lock not available.
  return cls == "08" || cls == "40" || cls == "53" || cls == "57" || cls == "58" ||
         sqlstate == "55P03";
}

void ThrowStoreError() {
  using K = StoreError::Kind;
  try {
    throw;
  } catch (const StoreError&) {
    throw;
  } catch (const pqxx::broken_connection& e) {
    throw StoreError(K::kTransient, "", e.what());
  } catch (const pqxx::in_doubt_error& e) {
    throw StoreError(K::kTransient, "", e.what());
  } catch (const pqxx::sql_error& e) {
    // libpqxx 6.4 throws insufficient_privilege without the SQLSTATE (its constructor is not
    // given it): the class is all that is left of it.
    std::string state = e.sqlstate();
    if (state.empty() && dynamic_cast<const pqxx::insufficient_privilege*>(&e)) state = "42501";
    throw StoreError(IsTransientSqlState(state) ? K::kTransient : K::kPermanent, state, e.what());
  } catch (const pqxx::transaction_rollback& e) {
    // Class 40, which libpqxx 6.4 throws as failures (not sql_error) without the SQLSTATE.
    const char* state = dynamic_cast<const pqxx::deadlock_detected*>(&e)              ? "40P01"
                        : dynamic_cast<const pqxx::serialization_failure*>(&e)        ? "40001"
                        : dynamic_cast<const pqxx::statement_completion_unknown*>(&e) ? "40003"
                                                                                      : "40000";
    throw StoreError(K::kTransient, state, e.what());
  } catch (const pqxx::failure& e) {
    // libpq lost the server without a SQLSTATE ("server closed the connection").
    throw StoreError(K::kTransient, "", e.what());
  } catch (const pqxx::usage_error& e) {
    throw StoreError(K::kPermanent, "", e.what());
  } catch (const pqxx::conversion_error& e) {
    throw StoreError(K::kPermanent, "", e.what());
  }
}

StoreFactory PostgresStores(std::string database_url) {
  return [url = std::move(database_url)]() -> std::unique_ptr<QueueStore> {
    return std::make_unique<Store>(url);
  };
}

std::map<std::string, std::int64_t> Store::LiveRelays(Millis expiry) {
  return LiveRelaysByDestination(*this, expiry);
}

std::map<std::string, std::string> Store::PausedDestinations() {
  return Translated([&]() -> std::map<std::string, std::string> {
    pqxx::nontransaction tx(impl_->Get());
    std::map<std::string, std::string> out;
    for (const auto& row : tx.exec_prepared("paused_destinations"))
      out.emplace(row[0].as<std::string>(), row[1].as<std::string>());
    return out;
  });
}

StatusSnapshot Store::ReadStatus(const StatusOptions& options) {
  return outbox::relay::ReadStatus(*this, options);
}

std::int64_t Store::CleanupArchive(const std::vector<std::string>& destinations,
                                   std::chrono::seconds retention, int batch,
                                   std::int64_t max_rows) {
  return outbox::relay::CleanupArchive(*this, destinations, retention, batch, max_rows);
}

std::int64_t Store::CleanupDeadLetters(const std::vector<std::string>& destinations,
                                       std::chrono::seconds max_age, int batch,
                                       std::int64_t max_rows) {
  return outbox::relay::CleanupDeadLetters(*this, destinations, max_age, batch, max_rows);
}

void Store::Reset() {
  impl_->receiver.reset();
  std::unique_ptr<pqxx::connection> dropped;
  {
    std::lock_guard lk(impl_->conn_mu);
    dropped = std::move(impl_->conn);
  }
  impl_->claim_session = impl_->queue_session = false;
}

void Store::Interrupt() {
  std::lock_guard lk(impl_->conn_mu);
  impl_->interrupted = true;
  // The socket is shut down, not closed: the thread in the statement gets an error from libpq
  // at once, and the descriptor stays this connection's until it is reset (under conn_mu).
  if (impl_->conn && impl_->conn->is_open()) {
    const int fd = impl_->conn->sock();
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

bool Store::Connected() const { return impl_->conn && impl_->conn->is_open(); }

namespace {

// What a claim that only reads (claim_owned.sql) leaves claim_owned_hold.sql to write: the rows
// it did not hand out, due and behind an earlier message of their key or not due yet, and the
// slow lane's rows it handed out.
struct HoldRows {
  std::vector<std::int64_t> blocked, not_due, slow;
  bool empty() const { return blocked.empty() && not_due.empty() && slow.empty(); }
};

// `hold`: the statement says per row whether it is ready (`ready`, `due`): those that are not go
// there instead of into the messages, and so do the ids of the slow lane's messages.
ClaimResult ParseClaim(const pqxx::result& r, const std::string& destination, std::string token,
                       HoldRows* hold = nullptr) {
  ClaimResult out;
  out.lease_token = std::move(token);
  if (r.empty()) return out;  // cannot happen: facts always yields a row
  const auto& first = r[0];
  out.facts.seq_value = first["seq_value"].as<std::int64_t>(0);
  out.facts.snap_xmin = first["snap_xmin"].as<std::uint64_t>(0);
  out.facts.own_xid = first["own_xid"].as<std::uint64_t>(0);
  out.facts.fresh_scanned = first["fresh_scanned"].as<std::int64_t>(0);
  if (!first["fresh_full_bound"].is_null()) {
    out.facts.fresh_full_bound = first["fresh_full_bound"].as<std::int64_t>();
  }
  out.facts.slow_full = first["slow_full"].as<bool>(false);
  out.facts.held = first["held"].as<std::int64_t>(0);
  if (!first["scanned_buckets"].is_null()) {
    out.facts.scanned_buckets = first["scanned_buckets"].as<std::string>();
  }
  for (const auto& pair : nlohmann::json::parse(first["blocked_keys"].c_str())) {
    BlockedKey key{pair.at(0).get<std::string>(), std::nullopt};
    if (!pair.at(1).is_null()) key.endpoint = pair.at(1).get<std::string>();
    out.facts.blocked_keys.push_back(std::move(key));
  }
  // Columns by number, looked up once: by name, each field costs a search of the column names.
  const auto col = [&r](const char* name) { return r.column_number(name); };
  const auto id = col("id"), ordering_key = col("ordering_key"),
             idempotency_key = col("idempotency_key"), event_type = col("event_type"),
             headers = col("headers"), payload = col("payload"),
             payload_bytes = col("payload_bytes"), attempts = col("attempts"),
             bucket = col("bucket"), endpoint_id = col("endpoint_id"), parked = col("parked"),
             created_us = col("created_us"), absent_as_of_us = col("absent_as_of_us");
  const auto ready = hold ? col("ready") : 0, due = hold ? col("due") : 0;
  out.messages.reserve(r.size());
  for (const auto& row : r) {
    if (row[id].is_null()) continue;  // nothing leased: only the facts row
    if (hold && !row[ready].as<bool>()) {
      (row[due].as<bool>() ? hold->blocked : hold->not_due).push_back(row[id].as<std::int64_t>());
      continue;
    }
    Message m;
    m.id = MessageId{row[id].as<std::int64_t>()};
    m.destination = destination;
    if (!row[ordering_key].is_null()) m.ordering_key = row[ordering_key].as<std::string>();
    m.idempotency_key = row[idempotency_key].as<std::string>();
    m.event_type = row[event_type].as<std::string>();
    m.headers = ParseHeaders(row[headers]);
    if (!row[payload].is_null()) {
      m.payload = row[payload].as<std::string>();
      m.payload_is_json = true;
    } else {
      const pqxx::binarystring bytes(row[payload_bytes]);
      m.payload = bytes.str();
      m.payload_is_json = false;
    }
    m.attempts = row[attempts].as<int>();
    m.bucket = row[bucket].as<int>();
    if (!row[endpoint_id].is_null()) m.endpoint_id = row[endpoint_id].as<std::string>();
    if (!row[parked].as<bool>()) {
      out.fresh_lane.push_back(m.id);
    } else if (hold) {
      hold->slow.push_back(Raw(m.id));
    }
    m.created_at = std::chrono::system_clock::time_point(
        std::chrono::microseconds(row[created_us].as<std::int64_t>()));
    if (!row[absent_as_of_us].is_null()) {
      m.absent_as_of = std::chrono::system_clock::time_point(
          std::chrono::microseconds(row[absent_as_of_us].as<std::int64_t>()));
    }
    out.messages.push_back(std::move(m));
  }
  // The statement returns them unordered; the dispatcher hands them out by id.
  std::sort(out.messages.begin(), out.messages.end(),
            [](const Message& a, const Message& b) { return Raw(a.id) < Raw(b.id); });
  std::sort(out.fresh_lane.begin(), out.fresh_lane.end(),
            [](MessageId a, MessageId b) { return Raw(a) < Raw(b); });
  return out;
}

// Elements of a Postgres array literal: numbers, and strings that need no quoting (uuids).
std::string ArrayElement(const std::string& s) { return s; }
template <class N>
std::string ArrayElement(N n) {
  return std::to_string(n);
}

template <class T, class F>
std::string ArrayLiteral(const std::vector<T>& v, F f) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += ArrayElement(f(v[i]));
  }
  return s + "}";
}

// The owned buckets and their epochs as the statements take them: '{1,5,9}', '{3,3,4}'.
std::pair<std::string, std::string> BucketArrays(const std::vector<BucketLease>& owned) {
  return {ArrayLiteral(owned, [](const BucketLease& b) { return b.bucket; }),
          ArrayLiteral(owned, [](const BucketLease& b) { return b.epoch; })};
}

// What two settle statements wrote, together.
void AddCounts(SettleCounts& total, const SettleCounts& c) {
  total.delivered += c.delivered;
  total.dead += c.dead;
  total.retried += c.retried;
  total.released += c.released;
  total.woken += c.woken;
  total.archived += c.archived;
  total.spawned += c.spawned;
  total.endpoint_dead += c.endpoint_dead;
  total.fenced += c.fenced;
  total.gone += c.gone;
  total.written.insert(total.written.end(), c.written.begin(), c.written.end());
  total.deferred.insert(total.deferred.end(), c.deferred.begin(), c.deferred.end());
}

}  // namespace

ClaimResult Store::Claim(const std::string& destination, std::int64_t cursor, int fresh_limit,
                         int slow_limit, Millis lease) {
  return Translated([&]() -> ClaimResult {
    auto& c = impl_->ForClaims();
    std::string token = impl_->NewClaimToken();
    pqxx::nontransaction tx(c);
    const pqxx::result r = tx.exec_prepared("claim", destination, cursor, fresh_limit, slow_limit,
                                            token, static_cast<long long>(lease.count()));
    return ParseClaim(r, destination, std::move(token));
  });
}

ClaimResult Store::ClaimPartitioned(const std::string& destination, std::int64_t cursor,
                                    int fresh_limit, int slow_limit, Millis lease,
                                    const std::string& instance_id,
                                    const std::vector<BucketLease>& owned) {
  return Translated([&]() -> ClaimResult {
    auto& c = impl_->ForClaims();
    std::string token = impl_->NewClaimToken();
    pqxx::nontransaction tx(c);
    const auto [buckets, epochs] = BucketArrays(owned);
    const pqxx::result r =
        tx.exec_prepared("claim_partitioned", destination, cursor, fresh_limit, slow_limit, token,
                         static_cast<long long>(lease.count()), instance_id, buckets, epochs);
    return ParseClaim(r, destination, std::move(token));
  });
}

std::vector<BucketLease> Store::Coordinate(const std::string& instance_id, Millis dead_after,
                                           bool leaving, const std::string& description,
                                           bool exactly_once, bool bucket_leases,
                                           const std::vector<int>& released,
                                           Millis hand_over_within) {
  return Translated([&]() -> std::vector<BucketLease> {
    auto& c = impl_->Get();
    // One autocommit statement: the coordinator's lock (taken inside) is never held across a
    // round trip to this process, which may freeze in between (migration 0016).
    pqxx::nontransaction tx(c);
    std::vector<BucketLease> out;
    const auto r = tx.exec_params(
        "SELECT bucket, epoch, handing FROM outbox.coordinate($1::uuid, make_interval(secs => "
        "$2::bigint / 1000.0), $3, $4, $5, $6, $7::integer[], make_interval(secs => $8::bigint / "
        "1000.0))",
        instance_id, static_cast<long long>(dead_after.count()), leaving, description, exactly_once,
        bucket_leases, ArrayLiteral(released, [](int b) { return b; }),
        static_cast<long long>(hand_over_within.count()));
    for (const auto& row : r) {
      out.push_back({row[0].as<int>(), row[1].as<std::int64_t>(), row[2].as<bool>()});
    }
    return out;
  });
}

SettleCounts Store::Settle(const std::vector<Settlement>& settlements, bool archive,
                          const std::string& instance_id) {
  // A fan-out's settle takes outbox.insert_message's lock of each endpoint key it writes a row
  // for (settle.sql): thousands in one statement (a batch of keyed messages while several
  // endpoints fail) filled PostgreSQL's lock table ("out of shared memory": about
  // max_locks_per_transaction x max_connections entries for every session together) and the
  // settler retried the batch forever. At most kMaxChildrenPerSettle such rows a statement.
  SettleCounts total;
  std::size_t begin = 0, children = 0;
  const auto flush = [&](std::size_t end) {
    if (end == begin) return;
    AddCounts(total, SettleStatement(std::span(settlements).subspan(begin, end - begin), archive,
                                     instance_id));
    begin = end;
    children = 0;
  };
  for (std::size_t i = 0; i < settlements.size(); ++i) {
    const std::size_t n = settlements[i].children.size();
    if (children + n > kMaxChildrenPerSettle) flush(i);
    children += n;
  }
  flush(settlements.size());
  return total;
}

namespace {
// Whether writing `s` writes rows into the queue: a fan-out that leaves rows for endpoints (a
// dead letter of an endpoint is not a queue row).
bool SpawnsRows(const Settlement& s) {
  return s.kind == Settlement::Kind::kFanOut &&
         std::any_of(s.children.begin(), s.children.end(), [](const Settlement::Child& c) {
           return c.kind != Settlement::Kind::kDead;
         });
}
// Whether writing `s` writes anything for its endpoints: queue rows or dead letters.
bool LeavesEndpointsSomething(const Settlement& s) {
  return s.kind == Settlement::Kind::kFanOut && !s.children.empty();
}
}  // namespace

ClaimResult Store::ClaimOwned(const std::string& destination, std::int64_t cursor, int fresh_limit,
                              int slow_limit, Millis lease, const std::string& instance_id,
                              const std::vector<BucketLease>& owned) {
  return Translated([&]() -> ClaimResult {
    auto& c = impl_->ForClaims();
    const auto [buckets, epochs] = BucketArrays(owned);
    HoldRows hold;
    ClaimResult out;
    {
      pqxx::nontransaction tx(c);
      const pqxx::result r = tx.exec_prepared("claim_owned", destination, cursor, fresh_limit,
                                              slow_limit, instance_id, buckets, epochs);
      out = ParseClaim(r, destination, "", &hold);
    }
    if (hold.empty()) return out;
    // The rare path: claim_owned_hold.sql writes what the claim only read.
    const auto ids = [](const std::vector<std::int64_t>& v) {
      return ArrayLiteral(v, [](std::int64_t id) { return id; });
    };
    pqxx::nontransaction tx(c);
    const pqxx::result held =
        tx.exec_prepared("claim_owned_hold", ids(hold.blocked), ids(hold.not_due), ids(hold.slow),
                         static_cast<long long>(lease.count()), instance_id, buckets, epochs);
    std::set<std::pair<std::string, std::optional<std::string>>> blocked;
    for (const auto& row : held) {
      if (row[1].is_null()) continue;
      blocked.emplace(row[1].as<std::string>(),
                      row[2].is_null() ? std::nullopt : std::optional(row[2].as<std::string>()));
    }
    out.facts.held = static_cast<std::int64_t>(hold.blocked.size() + hold.not_due.size());
    for (const auto& [key, endpoint] : blocked) out.facts.blocked_keys.push_back({key, endpoint});
    return out;
  });
}

namespace {

// settle_owned_delivered.sql in `tx`: the deliveries of a bucket-lease batch.
SettleCounts SettleOwnedDeliveredIn(pqxx::transaction_base& tx, const std::vector<MessageId>& ids,
                                    const std::string& instance_id,
                                    const std::vector<BucketLease>& owned) {
  SettleCounts counts;
  if (ids.empty()) return counts;
  const auto [buckets, epochs] = BucketArrays(owned);
  const auto row = tx.exec_prepared1("settle_owned_delivered",
                                     ArrayLiteral(ids, [](MessageId id) { return Raw(id); }),
                                     buckets, epochs, instance_id);
  counts.delivered = row["delivered"].as<std::int64_t>();
  counts.woken = row["woken"].as<std::int64_t>();
  counts.gone = row["gone"].as<std::int64_t>();
  if (row["written"].is_null()) {
    counts.written = ids;
  } else {
    for (const auto& id : nlohmann::json::parse(row["written"].c_str()))
      counts.written.push_back(MessageId{id.get<std::int64_t>()});
  }
  counts.fenced = static_cast<std::int64_t>(ids.size()) - counts.delivered - counts.gone;
  return counts;
}

}  // namespace

SettleCounts Store::SettleOwnedDelivered(const std::vector<MessageId>& ids,
                                         const std::string& instance_id,
                                         const std::vector<BucketLease>& owned) {
  return Translated([&]() -> SettleCounts {
    if (ids.empty()) return SettleCounts{};
    pqxx::nontransaction tx(impl_->ForOwnedSettles());
    return SettleOwnedDeliveredIn(tx, ids, instance_id, owned);
  });
}

SettleCounts Store::SettleOwned(const std::vector<Settlement>& settlements, bool archive,
                                const std::string& instance_id,
                                const std::vector<BucketLease>& owned) {
  std::vector<MessageId> delivered;
  std::vector<Settlement> rest;
  for (const auto& s : settlements) {
    if (LeavesEndpointsSomething(s)) {
      throw std::invalid_argument(
          "Store::SettleOwned: message " + std::to_string(Raw(s.id)) +
          " is a fan-out that leaves its endpoints rows; bucket leases do not settle those yet");
    } else if (!archive && (s.kind == Settlement::Kind::kDelivered ||
                            s.kind == Settlement::Kind::kFanOut)) {
      delivered.push_back(s.id);
    } else {
      rest.push_back(s);
    }
  }
  // The common batch, deliveries only: one statement, no transaction block.
  if (rest.empty()) return SettleOwnedDelivered(delivered, instance_id, owned);
  // Otherwise one transaction for the whole batch: with the deliveries written apart, a
  // failure of the rest had the settler's retry find them gone, and count them so, not as
  // delivered.
  return Translated([&]() -> SettleCounts {
    const std::string token = NewUuid();
    for (auto& s : rest) s.lease_token = token;
    pqxx::work tx(impl_->ForOwnedSettles());
    SettleCounts total = SettleOwnedDeliveredIn(tx, delivered, instance_id, owned);
    const auto [buckets, epochs] = BucketArrays(owned);
    tx.exec_prepared("settle_owned_adopt",
                     ArrayLiteral(rest, [](const Settlement& s) { return Raw(s.id); }), buckets,
                     epochs, instance_id, token);
    AddCounts(total, SettleIn(tx, rest, archive, instance_id));
    tx.commit();
    return total;
  });
}

SettleCounts Store::SettleStatement(std::span<const Settlement> settlements, bool archive,
                                    const std::string& instance_id) {
  if (std::none_of(settlements.begin(), settlements.end(), LeavesEndpointsSomething)) {
    return Translated([&]() -> SettleCounts {
      pqxx::nontransaction tx(impl_->ForQueue());
      return SettleIn(tx, settlements, archive, instance_id);
    });
  }
  // What a fan-out leaves its endpoints goes where each endpoint is now, so not while one moves
  // to another destination: its move lock (outbox.endpoint_lock_key, migration 0018), which
  // the move holds alone. Endpoint rows get a bucket from the bucket count, so not while it
  // changes either: the writers' lock (migration 0014), which set_bucket_count holds alone.
  // Both are tried, shared, in a statement before the settle's, whose snapshot then holds a
  // move committed before; not waited for (a settle waiting would hold every outcome of the
  // relay): while one is held, the fan-outs that need it are deferred, the rest is written.
  return Translated([&]() -> SettleCounts {
    nlohmann::json endpoints = nlohmann::json::array();
    bool spawns = false;
    {
      std::set<std::string> seen;
      for (const auto& s : settlements) {
        if (!LeavesEndpointsSomething(s)) continue;
        spawns = spawns || SpawnsRows(s);
        for (const auto& c : s.children) {
          if (seen.insert(c.endpoint_id).second) endpoints.push_back(c.endpoint_id);
        }
      }
    }
    pqxx::work tx(impl_->ForQueue());
    const auto locks = tx.exec_params1(
        "SELECT CASE WHEN $2 THEN pg_try_advisory_xact_lock_shared(7079, 2) ELSE true END, "
        "  (SELECT coalesce(jsonb_agg(e), '[]') FROM jsonb_array_elements_text($1::jsonb) e "
        "    WHERE NOT pg_try_advisory_xact_lock_shared(outbox.endpoint_lock_key(e)))::text",
        endpoints.dump(), spawns);
    const bool count_free = locks[0].as<bool>();
    std::set<std::string> moving;
    for (const auto& e : nlohmann::json::parse(locks[1].c_str())) moving.insert(e.get<std::string>());
    std::vector<Settlement> rest;
    std::vector<MessageId> deferred;
    for (const auto& s : settlements) {
      const bool defer = (!count_free && SpawnsRows(s)) ||
                         std::any_of(s.children.begin(), s.children.end(),
                                     [&](const Settlement::Child& c) {
                                       return moving.count(c.endpoint_id) > 0;
                                     });
      if (defer) {
        deferred.push_back(s.id);
      } else {
        rest.push_back(s);
      }
    }
    auto counts = SettleIn(tx, rest, archive, instance_id);
    tx.commit();
    counts.deferred.insert(counts.deferred.end(), deferred.begin(), deferred.end());
    return counts;
  });
}

SettleCounts Store::SettleIn(pqxx::transaction_base& tx, std::span<const Settlement> settlements,
                             bool archive, const std::string& instance_id) {
  return Translated([&]() -> SettleCounts {
    SettleCounts counts;
    if (settlements.empty()) return counts;
    nlohmann::json arr = nlohmann::json::array();
    // Plain deliveries go as two arrays ($3, $4), the rest as JSON objects ($1).
    std::vector<const Settlement*> delivered;
    for (const auto& s : settlements) {
      // A fan-out that every endpoint took leaves nothing behind: settle.sql writes it as it
      // writes a delivery, so it goes with the deliveries (and a batch of those alone, what the
      // webhook service settles while its endpoints are well, through settle_delivered.sql).
      if (s.kind == Settlement::Kind::kDelivered ||
          (s.kind == Settlement::Kind::kFanOut && s.children.empty())) {
        delivered.push_back(&s);
        continue;
      }
      nlohmann::json one = {{"id", Raw(s.id)},
                            {"token", s.lease_token},
                            {"outcome", KindName(s.kind)},
                            {"delay_ms", s.delay.count()},
                            {"error", s.error},
                            {"counted", s.counts_attempt}};
      if (s.absent_as_of) {
        one["absent_as_of_us"] = std::chrono::duration_cast<std::chrono::microseconds>(
                                     s.absent_as_of->time_since_epoch())
                                     .count();
      }
      if (s.kind == Settlement::Kind::kFanOut) {
        nlohmann::json children = nlohmann::json::array();
        for (const auto& c : s.children) {
          nlohmann::json child = {{"endpoint", c.endpoint_id},
                                  {"outcome", KindName(c.kind)},
                                  {"delay_ms", c.delay.count()},
                                  {"error", c.error},
                                  {"attempts", c.attempts}};
          if (c.endpoint_incarnation != 0) child["incarnation"] = c.endpoint_incarnation;
          children.push_back(std::move(child));
        }
        one["children"] = std::move(children);
      }
      arr.push_back(std::move(one));
    }
    const auto ids = ArrayLiteral(delivered, [](const Settlement* d) { return Raw(d->id); });
    const auto tokens = ArrayLiteral(delivered, [](const Settlement* d) { return d->lease_token; });
    // Nothing but plain deliveries, unarchived (nearly every settle): settle_delivered.sql, which
    // returns what the key wakes and the lease records need, not the whole messages.
    const auto row =
        arr.empty() && !archive
            ? tx.exec_prepared1("settle_delivered", ids, tokens, instance_id)
            : tx.exec_prepared1("settle", arr.dump(), archive, ids, tokens, instance_id);
    counts.delivered = row["delivered"].as<std::int64_t>();
    counts.dead = row["dead"].as<std::int64_t>();
    counts.retried = row["retried"].as<std::int64_t>();
    counts.released = row["released"].as<std::int64_t>();
    counts.woken = row["woken"].as<std::int64_t>();
    counts.archived = row["archived"].as<std::int64_t>();
    counts.gone = row["gone"].as<std::int64_t>();
    counts.spawned = row["spawned"].as<std::int64_t>();
    counts.endpoint_dead = row["endpoint_dead"].as<std::int64_t>();
    if (!row["deferred"].is_null()) {
      for (const auto& id : nlohmann::json::parse(row["deferred"].c_str()))
        counts.deferred.push_back(MessageId{id.get<std::int64_t>()});
    }
    if (row["written"].is_null()) {  // every outcome was written
      counts.written.reserve(settlements.size());
      for (const auto& s : settlements) counts.written.push_back(s.id);
    } else {
      const auto written = nlohmann::json::parse(row["written"].c_str());
      for (const auto& id : written) counts.written.push_back(MessageId{id.get<std::int64_t>()});
    }
    counts.fenced = static_cast<std::int64_t>(settlements.size()) - counts.delivered - counts.dead -
                    counts.retried - counts.released - counts.gone -
                    static_cast<std::int64_t>(counts.deferred.size());
    return counts;
  });
}

std::vector<MessageId> Store::RenewLeases(
    const std::vector<std::pair<MessageId, std::string>>& held, Millis lease) {
  return Translated([&]() -> std::vector<MessageId> {
    std::vector<MessageId> renewed;
    if (held.empty()) return renewed;
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& [id, token] : held) arr.push_back({{"id", Raw(id)}, {"token", token}});
    auto& c = impl_->ForQueue();
    pqxx::nontransaction tx(c);
    const auto rows =
        tx.exec_prepared("renew_leases", arr.dump(), static_cast<long long>(lease.count()));
    renewed.reserve(rows.size());
    for (const auto& row : rows) renewed.push_back(MessageId{row[0].as<std::int64_t>()});
    return renewed;
  });
}

const std::string& Store::last_claim_token() const { return impl_->last_claim_token; }

std::int64_t Store::ReleaseLostClaims(const std::vector<std::string>& tokens) {
  return Translated([&]() -> std::int64_t {
    if (tokens.empty()) return 0;
    auto& c = impl_->ForQueue();
    pqxx::nontransaction tx(c);
    const auto array = ArrayLiteral(tokens, [](const std::string& t) { return t; });
    return static_cast<std::int64_t>(tx.exec_prepared("release_lost_claims", array).size());
  });
}

std::vector<std::string> Store::Reap(Millis queue_scan_every) {
  return Translated([&]() -> std::vector<std::string> {
    auto& c = impl_->ForQueue();
    pqxx::nontransaction tx(c);
    std::vector<std::string> out;
    for (const auto& row : tx.exec_prepared("reap")) out.push_back(row[0].as<std::string>());
    // The safety net: a scan of the whole queue for leases without a record (reap_full.sql),
    // by whichever relay asks first once no relay has begun one for `queue_scan_every`
    // (queue_scan_turn.sql). A turn or a scan that fails (a statement_timeout shorter than the
    // scan of a large queue) loses nothing of what reap.sql returned, committed above:
    // reported as returned, and the scan waits for the next turn.
    try {
      if (!tx.exec_prepared("queue_scan_turn", static_cast<long long>(queue_scan_every.count()))
               .empty()) {
        // A scan of the whole queue is what this statement is: planned (at its first run, and
        // again after an analyze) with sequential scans allowed, not walking an index over it.
        // Until it is off again the connection counts as without its settings: whatever
        // fails in between, the next statement on the queue sets them again (review).
        impl_->queue_session = false;
        tx.exec("SET enable_seqscan = on");
        for (const auto& row : tx.exec_prepared("reap_full")) {
          out.push_back(row[0].as<std::string>());
        }
        tx.exec("SET enable_seqscan = off");
        impl_->queue_session = true;
      }
    } catch (const pqxx::sql_error& e) {
      tx.exec("SET enable_seqscan = off");  // (a broken connection throws on: made anew)
      impl_->queue_session = true;
      spdlog::warn(
          "reaper: the scan of the queue for leases without a lease record failed: {}; the "
          "relays' next turn at it comes in {} ms (if it timed out, give the relay's role a "
          "statement_timeout longer than a sequential scan of outbox.messages)",
          e.what(), queue_scan_every.count());
    }
    return out;
  });
}

OrphanPage Store::WakeOrphans(const std::string& destination, std::int64_t after, int rows) {
  return Translated([&]() -> OrphanPage {
    auto& c = impl_->ForQueue();
    pqxx::nontransaction tx(c);
    const auto r = tx.exec_prepared1("wake_orphans", destination, after, rows);
    OrphanPage page;
    page.woken = r["woken"].as<std::int64_t>();
    if (r["scanned"].as<std::int64_t>() >= rows) page.next_after = r["last_id"].as<std::int64_t>();
    page.top = r["top"].as<std::int64_t>();
    return page;
  });
}

std::int64_t Store::WakeKeys(const std::string& destination, const std::vector<BlockedKey>& keys) {
  return Translated([&]() -> std::int64_t {
    if (keys.empty()) return 0;
    auto pairs = nlohmann::json::array();
    for (const auto& k : keys) {
      pairs.push_back({k.key, k.endpoint ? nlohmann::json(*k.endpoint) : nlohmann::json()});
    }
    auto& c = impl_->ForQueue();
    pqxx::nontransaction tx(c);
    return static_cast<std::int64_t>(
        tx.exec_prepared("wake_keys", destination, pairs.dump()).size());
  });
}

std::vector<std::string> Store::Destinations() {
  return Translated([&]() -> std::vector<std::string> {
    auto& c = impl_->Get();
    pqxx::nontransaction tx(c);
    std::vector<std::string> out;
    for (const auto& row : tx.exec_prepared("destinations"))
      out.push_back(row[0].as<std::string>());
    return out;
  });
}

void Store::Heartbeat(const std::string& instance_id, const std::vector<std::string>& destinations,
                      const std::string& description,
                      const std::map<std::string, TargetHealth>& targets, bool bucket_leases) {
  Translated([&]() -> void {
    auto& c = impl_->Get();
    pqxx::nontransaction tx(c);
    std::string array = "{";
    for (std::size_t i = 0; i < destinations.size(); ++i) {
      if (i) array += ',';
      array += '"';
      for (const char ch : destinations[i]) {
        if (ch == '"' || ch == '\\') array += '\\';
        array += ch;
      }
      array += '"';
    }
    array += '}';
    nlohmann::json health = nlohmann::json::object();
    for (const auto& [destination, h] : targets) health[destination] = TargetHealthToJson(h);
    tx.exec_prepared("relay_heartbeat", instance_id, array, description, health.dump(),
                     bucket_leases);
  });
}

void Store::Leave(const std::string& instance_id) {
  Translated([&]() -> void {
    auto& c = impl_->Get();
    pqxx::nontransaction tx(c);
    tx.exec_prepared("relay_leave", instance_id);
  });
}

void Store::Listen() {
  Translated([&]() -> void {
    impl_->listening = true;
    auto& c = impl_->Get();
    if (!impl_->receiver)
      impl_->receiver =
          std::make_unique<store_detail::WakeReceiver>(c, impl_->notifications, impl_->rebalances);
  });
}

bool Store::WaitForNotification(Millis timeout) {
  return Translated([&]() -> bool {
    auto& c = impl_->Get();
    if (impl_->notifications.exchange(0) > 0) return true;
    const long long us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
    c.await_notification(static_cast<long>(us / 1'000'000), static_cast<long>(us % 1'000'000));
    return impl_->notifications.exchange(0) > 0;
  });
}

bool Store::TakeRebalance() { return impl_->rebalances.exchange(0) > 0; }

std::string NewUuid() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uint64_t hi = rng(), lo = rng();
  hi = (hi & 0xFFFFFFFFFFFF0FFFULL) | 0x0000000000004000ULL;  // version 4
  lo = (lo & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // variant 10
  char buf[37];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(hi >> 32),
                static_cast<unsigned>((hi >> 16) & 0xFFFF), static_cast<unsigned>(hi & 0xFFFF),
                static_cast<unsigned>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFULL));
  return buf;
}

}  // namespace outbox::relay
