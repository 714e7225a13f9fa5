// The JSON shape of an endpoint and of a delivery-log attempt, shared by the management API
// and `outbox-relay endpoints|attempts --json` (docs/openapi.yaml: Endpoint, Attempt).
#pragma once

#include <nlohmann/json.hpp>

#include "outbox_relay/endpoints.h"

namespace outbox::relay {

inline nlohmann::json ToJson(const EndpointRecord& e) {
  nlohmann::json j = {{"id", e.id},
                      {"destination", e.destination},
                      {"url", e.url},
                      {"description", e.description},
                      {"metadata", nlohmann::json::parse(e.metadata, nullptr, false)},
                      {"event_types", e.event_types},
                      {"headers", e.headers},
                      {"enabled", e.enabled},
                      {"secrets", e.secrets},
                      {"signature", e.signature},
                      {"public_keys", e.public_keys},
                      {"backlog", e.backlog},
                      {"dead_letters", e.dead_letters},
                      {"backlog_capped", e.backlog_capped},
                      {"dead_letters_capped", e.dead_letters_capped},
                      {"created_at", e.created_at},
                      {"updated_at", e.updated_at}};
  j["max_in_flight"] = e.max_in_flight ? nlohmann::json(*e.max_in_flight) : nlohmann::json();
  j["rate_limit"] = e.rate_limit ? nlohmann::json(*e.rate_limit) : nlohmann::json();
  j["breaker"] = nlohmann::json::parse(e.breaker, nullptr, false);
  j["adaptive_concurrency"] =
      e.adaptive_concurrency ? nlohmann::json(*e.adaptive_concurrency) : nlohmann::json();
  j["disabled_reason"] = e.disabled_reason ? nlohmann::json(*e.disabled_reason) : nlohmann::json();
  return j;
}

inline nlohmann::json ToJson(const AttemptRecord& t) {
  return {{"id", t.id},
          {"endpoint_id", t.endpoint_id},
          {"destination", t.destination},
          {"delivery_id", t.delivery_id},
          {"attempted_at", t.attempted_at},
          {"status", t.status ? nlohmann::json(*t.status) : nlohmann::json()},
          {"outcome", t.outcome},
          {"latency_ms", t.latency_ms},
          {"error", t.error ? nlohmann::json(*t.error) : nlohmann::json()},
          {"response_body", t.response_body}};
}

// An endpoint replay (GET /v1/replays/{id}, `endpoints replays --json`): what was not asked,
// or has not happened, is null.
inline nlohmann::json ToJson(const EndpointReplay& r) {
  const auto text_or_null = [](const std::string& v) {
    return v.empty() ? nlohmann::json() : nlohmann::json(v);
  };
  return {{"id", r.id},
          {"endpoint_id", r.endpoint_id},
          {"since", text_or_null(r.since)},
          {"message", text_or_null(r.message)},
          {"status", r.status},
          {"queued", r.queued},
          {"began", r.began},
          {"updated_at", r.updated_at},
          {"finished_at", text_or_null(r.finished_at)},
          {"error", text_or_null(r.error)}};
}

}  // namespace outbox::relay
