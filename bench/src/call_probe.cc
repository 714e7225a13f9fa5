// Link-time wrappers of Store::Claim, Store::ClaimPartitioned and Store::Settle. The linker
// (--wrap=SYM) sends every call the dispatcher makes to __wrap_SYM, defined here, and
// __real_SYM names the original. The wrappers are free functions with the member function's
// signature plus `Store*` first: under the Itanium C++ ABI both pass the hidden return slot
// first and then `this`, so the calls line up. __real_SYM is weak: if the relay changes a
// signature, the mangled name no longer matches anything, nothing is wrapped, and
// ClaimProbeLinked() reports it.
#include "call_probe.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

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
  std::fprintf(trace_file, "%lld tid=%ld cursor=%lld seq=%lld ids=",
               static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()),
               static_cast<long>(::gettid()), static_cast<long long>(cursor),
               static_cast<long long>(r.facts.seq_value));
  for (const auto& m : r.messages) std::fprintf(trace_file, "%lld,", static_cast<long long>(relay::Raw(m.id)));
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

// External linkage on purpose: the linker must find __wrap_SYM and resolve __real_SYM.
namespace outbox::bench::wrap {

using outbox::relay::BucketLease;
using outbox::relay::ClaimResult;
using outbox::relay::Millis;
using outbox::relay::SettleCounts;
using outbox::relay::Settlement;
using outbox::relay::Store;

ClaimResult RealClaim(Store* self, const std::string& destination, std::int64_t cursor,
                      int fresh_limit, int slow_limit, Millis lease)
    __asm__("__real_" OUTBOX_BENCH_CLAIM_SYMBOL) __attribute__((weak));
ClaimResult WrappedClaim(Store* self, const std::string& destination, std::int64_t cursor,
                         int fresh_limit, int slow_limit, Millis lease)
    __asm__("__wrap_" OUTBOX_BENCH_CLAIM_SYMBOL) __attribute__((used));

ClaimResult RealClaimPartitioned(Store* self, const std::string& destination, std::int64_t cursor,
                                 int per_bucket_limit, int slow_limit, Millis lease,
                                 const std::string& instance_id, const std::vector<BucketLease>& owned)
    __asm__("__real_" OUTBOX_BENCH_CLAIM_PARTITIONED_SYMBOL) __attribute__((weak));
ClaimResult WrappedClaimPartitioned(Store* self, const std::string& destination,
                                    std::int64_t cursor, int per_bucket_limit, int slow_limit,
                                    Millis lease, const std::string& instance_id,
                                    const std::vector<BucketLease>& owned)
    __asm__("__wrap_" OUTBOX_BENCH_CLAIM_PARTITIONED_SYMBOL) __attribute__((used));

SettleCounts RealSettle(Store* self, const std::vector<Settlement>& settlements, bool archive)
    __asm__("__real_" OUTBOX_BENCH_SETTLE_SYMBOL) __attribute__((weak));
SettleCounts WrappedSettle(Store* self, const std::vector<Settlement>& settlements, bool archive)
    __asm__("__wrap_" OUTBOX_BENCH_SETTLE_SYMBOL) __attribute__((used));

static std::int64_t Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

ClaimResult WrappedClaim(Store* self, const std::string& destination, std::int64_t cursor,
                         int fresh_limit, int slow_limit, Millis lease) {
  const auto start = std::chrono::steady_clock::now();
  ClaimResult result = RealClaim(self, destination, cursor, fresh_limit, slow_limit, lease);
  ClaimProbe().Record(Since(start), static_cast<std::int64_t>(result.messages.size()));
  TraceClaim(cursor, result);
  return result;
}

ClaimResult WrappedClaimPartitioned(Store* self, const std::string& destination,
                                    std::int64_t cursor, int per_bucket_limit, int slow_limit,
                                    Millis lease, const std::string& instance_id,
                                    const std::vector<BucketLease>& owned) {
  const auto start = std::chrono::steady_clock::now();
  ClaimResult result = RealClaimPartitioned(self, destination, cursor, per_bucket_limit,
                                            slow_limit, lease, instance_id, owned);
  ClaimProbe().Record(Since(start), static_cast<std::int64_t>(result.messages.size()));
  TraceClaim(cursor, result);
  return result;
}

SettleCounts WrappedSettle(Store* self, const std::vector<Settlement>& settlements, bool archive) {
  const auto start = std::chrono::steady_clock::now();
  SettleCounts counts = RealSettle(self, settlements, archive);
  SettleProbe().Record(Since(start), static_cast<std::int64_t>(settlements.size()));
  return counts;
}

}  // namespace outbox::bench::wrap

bool outbox::bench::ClaimProbeLinked() { return &wrap::RealClaim != nullptr; }
bool outbox::bench::SettleProbeLinked() { return &wrap::RealSettle != nullptr; }
