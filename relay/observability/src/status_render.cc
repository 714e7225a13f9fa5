#include "outbox_relay/status_render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <vector>

namespace outbox::relay {
namespace {

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string Bytes(std::int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? std::to_string(b) + " B" : Fixed(v, 1) + " " + units[u];
}

nlohmann::json OptEpoch(const std::optional<double>& e) {
  return e ? nlohmann::json(FormatEpoch(*e)) : nlohmann::json(nullptr);
}

std::string Describe(const OldestTransaction& t) {
  std::string who;
  if (t.kind == "prepared") {
    who = "prepared transaction '" + t.gid + "' (owner " + t.user + ")";
  } else {
    who = "pid " + (t.pid ? std::to_string(*t.pid) : std::string("?")) + " (user " + t.user;
    if (!t.application_name.empty()) who += ", application \"" + t.application_name + "\"";
    if (!t.state.empty()) who += ", " + t.state;
    who += ")";
  }
  return who + " open for " + FormatAge(t.age_seconds);
}

}  // namespace

std::string FormatAge(double seconds) {
  if (!(seconds > 0)) return "0s";
  if (seconds < 60) return Fixed(std::floor(seconds * 10) / 10, 1) + "s";
  const auto s = static_cast<long long>(seconds);
  char buf[64];
  if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  } else if (s < 86400) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
  }
  return buf;
}

std::string FormatEpoch(double epoch_seconds) {
  const double whole = std::floor(epoch_seconds);
  auto ms = static_cast<int>(std::lround((epoch_seconds - whole) * 1000));
  auto t = static_cast<std::time_t>(whole);
  if (ms >= 1000) {
    ms -= 1000;
    ++t;
  }
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

std::vector<std::string> StatusWarnings(const StatusSnapshot& s) {
  std::vector<std::string> w;
  for (const auto& d : s.destinations) {
    if (!d.paused) continue;
    w.push_back("destination \"" + d.destination + "\" is paused" +
                (d.paused_reason.empty() ? "" : " (" + d.paused_reason + ")") +
                ": relays claim nothing for it; `outbox-relay resume " + d.destination +
                "` lets them");
  }
  for (const auto& d : s.destinations) {
    // Exactly once holds only while every relay of the destination produces transactionally:
    // during a rolling change of kafka.delivery, one at least once beside one exactly once
    // loses it (and the two fence nothing of each other).
    std::map<std::string, std::vector<std::string>> by_delivery;
    for (const auto& t : d.targets) {
      if (t.health.kind == "kafka") by_delivery[t.health.delivery].push_back(t.relay);
    }
    if (by_delivery.size() > 1) {
      std::string modes;
      for (const auto& [delivery, relays] : by_delivery) {
        for (const auto& relay : relays) {
          modes += (modes.empty() ? "" : ", ") + delivery + " on relay " + relay;
        }
      }
      w.push_back(d.destination + ": relays deliver it differently (" + modes +
                  "): exactly once holds only when every relay of the destination has "
                  "kafka.delivery: exactly_once; roll the change out to all of them");
    }
    // Fencing holds only between equal transactional ids (relays older than this field say
    // nothing of their prefix, and are left out).
    std::map<std::string, std::vector<std::string>> by_prefix;
    for (const auto& t : d.targets) {
      if (t.health.kind == "kafka" && t.health.delivery == "exactly_once" &&
          !t.health.transactional_id_prefix.empty()) {
        by_prefix[t.health.transactional_id_prefix].push_back(t.relay);
      }
    }
    if (by_prefix.size() > 1) {
      std::string prefixes;
      for (const auto& [prefix, relays] : by_prefix) {
        for (const auto& relay : relays) {
          prefixes += (prefixes.empty() ? "" : ", ") + prefix + " on relay " + relay;
        }
      }
      w.push_back(d.destination +
                  ": its exactly-once relays use different transactional_id_prefix values (" +
                  prefixes +
                  "): fencing holds only between equal transactional ids, so a stalled relay "
                  "can commit what another already delivered; stop every relay of the "
                  "destination and give them one prefix");
    }
  }
  for (const auto& d : s.destinations) {
    for (const auto& t : d.targets) {
      const auto& h = t.health;
      if (h.kind != "webhook") continue;
      if (h.breaker == "open" || h.breaker == "half_open") {
        w.push_back(
            d.destination + ": circuit breaker " + (h.breaker == "open" ? "open" : "half-open") +
            " on relay " + t.relay + " after " + std::to_string(h.consecutive_failures) +
            " consecutive failures" +
            (h.breaker == "open"
                 ? "; next probe in " + FormatAge(static_cast<double>(h.probe_in.count()) / 1000.0)
                 : std::string("; probing")) +
            ": nothing is sent to the endpoint meanwhile (runbook: "
            "OutboxWebhookBreakerOpen)");
      }
      if (h.paused_for.count() > 0) {
        w.push_back(d.destination + ": the endpoint asked to wait (Retry-After); relay " + t.relay +
                    " sends nothing for another " +
                    FormatAge(static_cast<double>(h.paused_for.count()) / 1000.0));
      }
    }
  }
  if (s.lock_waiters > 0) {
    w.push_back(std::to_string(s.lock_waiters) +
                " session(s) waiting for a lock on outbox.messages (longest " +
                FormatAge(s.longest_lock_wait_seconds) +
                "): with SKIP LOCKED nothing should wait; look for statements or DDL contending on "
                "the queue "
                "(runbook: OutboxQueueLockWaits)");
  }
  if (s.oldest_transaction && s.oldest_transaction->age_seconds >= kWarnOldestTransactionSeconds) {
    w.push_back("long transaction: " + Describe(*s.oldest_transaction) +
                "; it holds back vacuum and the relay's fresh-lane cursor (runbook: "
                "OutboxLongTransaction)");
  }
  if (s.table.dead_tuples >= kWarnDeadTupleMin && s.table.DeadRatio() >= kWarnDeadTupleRatio) {
    w.push_back("outbox.messages has " + std::to_string(s.table.dead_tuples) + " dead tuples (" +
                Fixed(s.table.DeadRatio() * 100, 0) +
                "% of the table): vacuum is not keeping up (runbook: OutboxQueueBloat)");
  }
  for (const auto& d : s.destinations) {
    if (d.Unserved()) {
      w.push_back(d.destination + ": " + std::to_string(d.depth + d.in_flight) +
                  " message(s) that no running relay serves (oldest waiting " +
                  FormatAge(d.oldest_pending_age_seconds) +
                  "): add the destination to a relay's config, or dead-letter them with "
                  "`outbox-relay dlq bury --destination " +
                  d.destination + "` (runbook: OutboxUnservedMessages)");
    }
    if (d.expired_leases > 0) {
      w.push_back(d.destination + ": " + std::to_string(d.expired_leases) +
                  " lease(s) expired and not yet reaped: a relay stopped or stalled (runbook: "
                  "OutboxReaperSpike)");
    }
  }
  return w;
}

std::string RenderStatusTable(const StatusSnapshot& s) {
  const std::vector<std::string> header = {"DESTINATION",  "PENDING",        "IN_FLIGHT",
                                           "RETRYING",     "BLOCKED",        "EXPIRED_LEASES",
                                           "DEAD_LETTERS", "OLDEST_PENDING", "RELAYS"};
  std::vector<std::vector<std::string>> rows;
  for (const auto& d : s.destinations) {
    rows.push_back({d.destination, std::to_string(d.depth), std::to_string(d.in_flight),
                    std::to_string(d.retrying), std::to_string(d.blocked),
                    std::to_string(d.expired_leases), std::to_string(d.dead_letters),
                    FormatAge(d.oldest_pending_age_seconds), std::to_string(d.relays)});
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string l;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) l += "  ";
      const std::string pad(width[i] - cells[i].size(), ' ');
      // Names left-aligned, numbers and ages right-aligned.
      l += i == 0 ? cells[i] + pad : pad + cells[i];
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + "\n";
  };
  if (!s.counts_error.empty()) {
    out += "counts by destination not read: " + s.counts_error + "\n";
  } else {
    line(header);
    for (const auto& r : rows) line(r);
    if (rows.empty()) out += "(no destinations: the queue and the dead letters are empty)\n";
  }

  out += "\nqueue table outbox.messages: " + std::to_string(s.table.live_tuples) + " live, " +
         std::to_string(s.table.dead_tuples) + " dead tuples (" +
         Fixed(s.table.DeadRatio() * 100, 1) + "% dead), " + Bytes(s.table.total_bytes) + "\n";
  out += "last vacuum: ";
  if (const auto v = s.table.LastAnyVacuumEpoch()) {
    const bool auto_ran = s.table.last_autovacuum_epoch && *s.table.last_autovacuum_epoch == *v;
    out += FormatAge(s.taken_at_epoch - *v) + " ago (" + (auto_ran ? "autovacuum" : "manual") + ")";
  } else {
    out += "never";
  }
  out += "; " + std::to_string(s.table.autovacuum_count) + " autovacuum, " +
         std::to_string(s.table.vacuum_count) + " manual since statistics reset\n";
  out += "lock waits on the queue table: " + std::to_string(s.lock_waiters);
  if (s.lock_waiters > 0) out += " (longest " + FormatAge(s.longest_lock_wait_seconds) + ")";
  out += "\n";
  out += "oldest transaction: " +
         (s.oldest_transaction ? Describe(*s.oldest_transaction) : std::string("none")) + "\n";
  out += "xmin lag: " + std::to_string(s.xmin_lag_xids) + " transactions\n";
  for (const auto& d : s.destinations) {
    for (const auto& t : d.targets) {
      const auto& h = t.health;
      if (h.kind == "kafka") {
        out += "kafka " + d.destination + " (relay " + t.relay + "): delivery " + h.delivery;
        if (!h.transactional_id_prefix.empty()) {
          out += " (transactional ids " + h.transactional_id_prefix + "." + d.destination +
                 ".<bucket>)";
        }
        if (h.delivery == "exactly_once") {
          out += ", " + std::to_string(h.transactions_committed) + " transaction(s) committed, " +
                 std::to_string(h.transactions_failed) + " failed, " + std::to_string(h.recovered) +
                 " message(s) recovered";
        }
        out += "\n";
        continue;
      }
      out += "endpoint " + d.destination + " (relay " + t.relay + "): breaker " + h.breaker +
             ", concurrency " + std::to_string(h.concurrency_limit) + "/" +
             std::to_string(h.max_concurrency) + ", opened " + std::to_string(h.times_opened) +
             " time(s)\n";
    }
  }
  for (const auto& w : StatusWarnings(s)) out += "WARNING: " + w + "\n";
  return out;
}

namespace {

nlohmann::json TargetsToJson(const std::vector<RelayTargetHealth>& targets) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : targets) {
    const auto& h = t.health;
    if (h.kind == "kafka") {
      out.push_back({{"instance_id", t.instance_id},
                     {"relay", t.relay},
                     {"kind", h.kind},
                     {"delivery", h.delivery},
                     {"transactions_committed", h.transactions_committed},
                     {"transactions_failed", h.transactions_failed},
                     {"recovered", h.recovered},
                     {"transactional_id_prefix", h.transactional_id_prefix.empty()
                                                     ? nlohmann::json(nullptr)
                                                     : nlohmann::json(h.transactional_id_prefix)}});
      continue;
    }
    out.push_back({{"instance_id", t.instance_id},
                   {"relay", t.relay},
                   {"kind", h.kind},
                   {"breaker", h.breaker},
                   {"consecutive_failures", h.consecutive_failures},
                   {"concurrency_limit", h.concurrency_limit},
                   {"max_concurrency", h.max_concurrency},
                   {"probe_in_seconds", static_cast<double>(h.probe_in.count()) / 1000.0},
                   {"paused_for_seconds", static_cast<double>(h.paused_for.count()) / 1000.0},
                   {"times_opened", h.times_opened},
                   {"times_paused", h.times_paused}});
  }
  return out;
}

}  // namespace

nlohmann::json StatusToJson(const StatusSnapshot& s) {
  // Counts not read (counts_error): null, not a zero that reads as "nothing queued".
  const auto count = [&](auto v) {
    return s.counts_error.empty() ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  nlohmann::json dests = nlohmann::json::array();
  for (const auto& d : s.destinations) {
    dests.push_back(
        {{"destination", d.destination},
         {"pending", count(d.depth)},
         {"in_flight", count(d.in_flight)},
         {"retrying", count(d.retrying)},
         {"blocked", count(d.blocked)},
         {"expired_leases", count(d.expired_leases)},
         {"dead_letters", count(d.dead_letters)},
         {"oldest_pending_age_seconds", count(d.oldest_pending_age_seconds)},
         {"newest_dead_letter_at", OptEpoch(d.newest_dead_letter_epoch)},
         {"relays", d.relays},
         {"unserved", count(d.Unserved())},
         {"paused", d.paused},
         {"paused_reason", d.paused ? nlohmann::json(d.paused_reason) : nlohmann::json(nullptr)},
         {"targets", TargetsToJson(d.targets)}});
  }
  nlohmann::json oldest = nullptr;
  if (s.oldest_transaction) {
    const auto& t = *s.oldest_transaction;
    oldest = {{"kind", t.kind},
              {"pid", t.pid ? nlohmann::json(*t.pid) : nlohmann::json(nullptr)},
              {"user", t.user},
              {"application_name", t.application_name},
              {"state", t.state},
              {"gid", t.gid},
              {"age_seconds", t.age_seconds},
              {"xmin_age_xids",
               t.xmin_age_xids ? nlohmann::json(*t.xmin_age_xids) : nlohmann::json(nullptr)}};
  }
  return {{"taken_at", FormatEpoch(s.taken_at_epoch)},
          {"counts_error",
           s.counts_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.counts_error)},
          {"destinations", std::move(dests)},
          {"queue_table",
           {{"live_tuples", s.table.live_tuples},
            {"dead_tuples", s.table.dead_tuples},
            {"dead_ratio", s.table.DeadRatio()},
            {"total_bytes", s.table.total_bytes},
            {"last_vacuum_at", OptEpoch(s.table.last_vacuum_epoch)},
            {"last_autovacuum_at", OptEpoch(s.table.last_autovacuum_epoch)},
            {"vacuum_count", s.table.vacuum_count},
            {"autovacuum_count", s.table.autovacuum_count}}},
          {"lock_waits",
           {{"waiters", s.lock_waiters}, {"longest_wait_seconds", s.longest_lock_wait_seconds}}},
          {"oldest_transaction", std::move(oldest)},
          {"xmin_lag_transactions", s.xmin_lag_xids},
          {"warnings", StatusWarnings(s)}};
}

}  // namespace outbox::relay
