// Timing of the relay's own claim and settle calls: a decorator of relay::QueueStore that the
// benchmark's dispatchers get as their store factory (DispatcherEnv::stores), so every call the
// dispatcher makes passes through here on its way to the PostgreSQL store.
#include "call_probe.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "outbox_relay/store.h"

namespace outbox::bench {

void CallProbe::Record(std::int64_t duration_us, std::int64_t rows) {
  std::lock_guard lk(mu_);
  batch_.durations_us.push_back(duration_us);
  batch_.rows += rows;
}

CallProbe::Batch CallProbe::Take() {
  std::lock_guard lk(mu_);
  Batch out = std::move(batch_);
  batch_ = Batch{};
  return out;
}

CallProbe& ClaimProbe() {
  static CallProbe probe;
  return probe;
}

CallProbe& SettleProbe() {
  static CallProbe probe;
  return probe;
}

namespace {

std::mutex trace_mu;
FILE* trace_file = nullptr;

// One line per claim: wall-clock µs, the claiming thread (one per relay instance and
// destination), the cursor passed in, the sequence value the statement read and the ids it
// leased: enough to see which ids the fresh-lane cursor stepped over and when they came.
// Only fields the cursor design cannot do without, so the trace survives changes to
// ClaimFacts.
void TraceClaim(std::int64_t cursor, const relay::ClaimResult& r) {
  std::lock_guard lk(trace_mu);
  if (trace_file == nullptr) return;
  std::fprintf(trace_file, "%lld tid=%ld cursor=%lld seq=%lld xmin=%llu xid=%llu ids=",
               static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()),
               static_cast<long>(::gettid()), static_cast<long long>(cursor),
               static_cast<long long>(r.facts.seq_value),
               static_cast<unsigned long long>(r.facts.snap_xmin),
               static_cast<unsigned long long>(r.facts.own_xid));
  for (const auto& m : r.messages)
    std::fprintf(trace_file, "%lld,", static_cast<long long>(relay::Raw(m.id)));
  std::fputc('\n', trace_file);
}

}  // namespace

bool TraceClaimsTo(const std::string& path) {
  std::lock_guard lk(trace_mu);
  if (trace_file != nullptr) std::fclose(trace_file);
  trace_file = std::fopen(path.c_str(), "w");
  return trace_file != nullptr;
}

}  // namespace outbox::bench

namespace outbox::bench {
namespace {

using relay::BucketLease;
using relay::ClaimResult;
using relay::Millis;
using relay::SettleCounts;
using relay::Settlement;

std::int64_t Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// Forwards every call to `inner`; times the claims and the settles.
class TimedStore final : public relay::QueueStore {
 public:
  explicit TimedStore(std::unique_ptr<relay::QueueStore> inner) : inner_(std::move(inner)) {}

  ClaimResult Claim(const std::string& destination, std::int64_t cursor, int fresh_limit,
                    int slow_limit, Millis lease) override {
    const auto start = std::chrono::steady_clock::now();
    ClaimResult result = inner_->Claim(destination, cursor, fresh_limit, slow_limit, lease);
    ClaimProbe().Record(Since(start), static_cast<std::int64_t>(result.messages.size()));
    TraceClaim(cursor, result);
    return result;
  }
  ClaimResult ClaimPartitioned(const std::string& destination, std::int64_t cursor,
                               int fresh_limit, int slow_limit, Millis lease,
                               const std::string& instance_id,
                               const std::vector<BucketLease>& owned) override {
    const auto start = std::chrono::steady_clock::now();
    ClaimResult result = inner_->ClaimPartitioned(destination, cursor, fresh_limit, slow_limit,
                                                  lease, instance_id, owned);
    ClaimProbe().Record(Since(start), static_cast<std::int64_t>(result.messages.size()));
    TraceClaim(cursor, result);
    return result;
  }
  ClaimResult ClaimOwned(const std::string& destination, std::int64_t cursor, int fresh_limit,
                         int slow_limit, Millis lease, const std::string& instance_id,
                         const std::vector<BucketLease>& owned) override {
    const auto start = std::chrono::steady_clock::now();
    ClaimResult result = inner_->ClaimOwned(destination, cursor, fresh_limit, slow_limit, lease,
                                            instance_id, owned);
    ClaimProbe().Record(Since(start), static_cast<std::int64_t>(result.messages.size()));
    TraceClaim(cursor, result);
    return result;
  }
  SettleCounts Settle(const std::vector<Settlement>& settlements, bool archive,
                      const std::string& instance_id) override {
    const auto start = std::chrono::steady_clock::now();
    SettleCounts counts = inner_->Settle(settlements, archive, instance_id);
    SettleProbe().Record(Since(start), static_cast<std::int64_t>(settlements.size()));
    return counts;
  }
  SettleCounts SettleOwned(const std::vector<Settlement>& settlements, bool archive,
                           const std::string& instance_id,
                           const std::vector<BucketLease>& owned) override {
    const auto start = std::chrono::steady_clock::now();
    SettleCounts counts = inner_->SettleOwned(settlements, archive, instance_id, owned);
    SettleProbe().Record(Since(start), static_cast<std::int64_t>(settlements.size()));
    return counts;
  }

  const std::string& last_claim_token() const override { return inner_->last_claim_token(); }
  std::int64_t ReleaseLostClaims(const std::vector<std::string>& tokens) override {
    return inner_->ReleaseLostClaims(tokens);
  }
  std::vector<relay::MessageId> RenewLeases(
      const std::vector<std::pair<relay::MessageId, std::string>>& held, Millis lease) override {
    return inner_->RenewLeases(held, lease);
  }
  std::vector<std::string> Reap(Millis queue_scan_every) override {
    return inner_->Reap(queue_scan_every);
  }
  relay::OrphanPage WakeOrphans(const std::string& destination, std::int64_t after,
                                int rows) override {
    return inner_->WakeOrphans(destination, after, rows);
  }
  std::int64_t WakeKeys(const std::string& destination,
                        const std::vector<relay::BlockedKey>& keys) override {
    return inner_->WakeKeys(destination, keys);
  }
  std::vector<BucketLease> Coordinate(const std::string& instance_id, Millis dead_after,
                                      bool leaving, const std::string& description,
                                      bool exactly_once, bool bucket_leases,
                                      const std::vector<int>& released,
                                      Millis hand_over_within) override {
    return inner_->Coordinate(instance_id, dead_after, leaving, description, exactly_once,
                              bucket_leases, released, hand_over_within);
  }
  void Heartbeat(const std::string& instance_id, const std::vector<std::string>& destinations,
                 const std::string& description,
                 const std::map<std::string, relay::TargetHealth>& targets,
                 bool bucket_leases) override {
    inner_->Heartbeat(instance_id, destinations, description, targets, bucket_leases);
  }
  void Leave(const std::string& instance_id) override { inner_->Leave(instance_id); }
  std::vector<std::string> Destinations() override { return inner_->Destinations(); }
  std::map<std::string, std::int64_t> LiveRelays(Millis expiry) override {
    return inner_->LiveRelays(expiry);
  }
  std::map<std::string, std::string> PausedDestinations() override {
    return inner_->PausedDestinations();
  }
  void Listen() override { inner_->Listen(); }
  bool WaitForNotification(Millis timeout) override { return inner_->WaitForNotification(timeout); }
  bool TakeRebalance() override { return inner_->TakeRebalance(); }
  relay::StatusSnapshot ReadStatus(const relay::StatusOptions& options) override {
    return inner_->ReadStatus(options);
  }
  std::int64_t CleanupArchive(const std::vector<std::string>& destinations,
                              std::chrono::seconds retention, int batch,
                              std::int64_t max_rows) override {
    return inner_->CleanupArchive(destinations, retention, batch, max_rows);
  }
  std::int64_t CleanupDeadLetters(const std::vector<std::string>& destinations,
                                  std::chrono::seconds max_age, int batch,
                                  std::int64_t max_rows) override {
    return inner_->CleanupDeadLetters(destinations, max_age, batch, max_rows);
  }
  void Reset() override { inner_->Reset(); }
  bool Connected() const override { return inner_->Connected(); }

 private:
  std::unique_ptr<relay::QueueStore> inner_;
};

}  // namespace

relay::StoreFactory TimedStores(std::string database_url) {
  return [inner = relay::PostgresStores(std::move(database_url))]() {
    return std::unique_ptr<relay::QueueStore>(std::make_unique<TimedStore>(inner()));
  };
}

}  // namespace outbox::bench
