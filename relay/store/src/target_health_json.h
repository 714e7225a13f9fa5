// Internal: TargetHealth <-> the JSON of outbox.relay_heartbeats.targets (migration 0006).
#pragma once

#include <nlohmann/json.hpp>

#include "outbox_relay/target_health.h"

namespace outbox::relay {

inline nlohmann::json TargetHealthToJson(const TargetHealth& h) {
  if (h.kind == "kafka") {
    nlohmann::json j = {{"kind", h.kind},
                        {"delivery", h.delivery},
                        {"transactions_committed", h.transactions_committed},
                        {"transactions_failed", h.transactions_failed},
                        {"recovered", h.recovered}};
    if (!h.transactional_id_prefix.empty()) {
      j["transactional_id_prefix"] = h.transactional_id_prefix;
    }
    return j;
  }
  return {{"kind", h.kind},
          {"breaker", h.breaker},
          {"consecutive_failures", h.consecutive_failures},
          {"concurrency_limit", h.concurrency_limit},
          {"max_concurrency", h.max_concurrency},
          {"probe_in_ms", h.probe_in.count()},
          {"paused_for_ms", h.paused_for.count()},
          {"times_opened", h.times_opened},
          {"times_paused", h.times_paused},
          {"service", h.service},
          {"endpoints", h.endpoints},
          {"endpoints_disabled", h.endpoints_disabled},
          {"endpoints_open", h.endpoints_open},
          {"endpoints_auto_disabled", h.endpoints_auto_disabled}};
}

// Missing keys keep their defaults: a newer relay may write more than this one reads.
inline TargetHealth TargetHealthFromJson(const nlohmann::json& j) {
  TargetHealth h;
  if (!j.is_object()) return h;
  h.kind = j.value("kind", h.kind);
  h.delivery = j.value("delivery", h.delivery);
  h.transactions_committed = j.value("transactions_committed", std::int64_t{0});
  h.transactions_failed = j.value("transactions_failed", std::int64_t{0});
  h.recovered = j.value("recovered", std::int64_t{0});
  h.transactional_id_prefix = j.value("transactional_id_prefix", std::string());
  h.breaker = j.value("breaker", h.breaker);
  h.consecutive_failures = j.value("consecutive_failures", 0);
  h.concurrency_limit = j.value("concurrency_limit", 0);
  h.max_concurrency = j.value("max_concurrency", 0);
  h.probe_in = std::chrono::milliseconds(j.value("probe_in_ms", std::int64_t{0}));
  h.paused_for = std::chrono::milliseconds(j.value("paused_for_ms", std::int64_t{0}));
  h.times_opened = j.value("times_opened", std::int64_t{0});
  h.times_paused = j.value("times_paused", std::int64_t{0});
  h.service = j.value("service", false);
  h.endpoints = j.value("endpoints", 0);
  h.endpoints_disabled = j.value("endpoints_disabled", 0);
  h.endpoints_open = j.value("endpoints_open", 0);
  h.endpoints_auto_disabled = j.value("endpoints_auto_disabled", std::int64_t{0});
  return h;
}

}  // namespace outbox::relay
