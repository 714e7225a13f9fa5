#include "outbox_relay/endpoints.h"

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <regex>
#include <stdexcept>

#include "store_access.h"

namespace outbox::relay {
namespace {

using nlohmann::json;

constexpr const char* kSelect =
    "SELECT e.id, e.destination, e.url, e.description, e.metadata::text AS metadata, "
    "       array_to_json(e.event_types)::text AS event_types, e.headers::text AS headers, "
    "       e.max_in_flight, e.enabled, e.disabled_reason, "
    "       to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS created, "
    "       to_char(e.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS updated, "
    "       (SELECT count(*) FROM outbox.endpoint_secrets s WHERE s.endpoint_id = e.id "
    "         AND (s.expires_at IS NULL OR s.expires_at > clock_timestamp()))::int AS secrets, "
    "       (SELECT count(*) FROM outbox.messages m WHERE m.endpoint_id = e.id) AS backlog, "
    "       (SELECT count(*) FROM outbox.dead_letters d WHERE d.endpoint_id = e.id) AS dead "
    "FROM outbox.endpoints e ";

EndpointRecord FromRow(const pqxx::row& r) {
  EndpointRecord e;
  e.id = r["id"].as<std::string>();
  e.destination = r["destination"].as<std::string>();
  e.url = r["url"].as<std::string>();
  e.description = r["description"].as<std::string>();
  e.metadata = r["metadata"].as<std::string>();
  const auto event_types = json::parse(r["event_types"].c_str());
  for (const auto& t : event_types) {
    e.event_types.push_back(t.get<std::string>());
  }
  const auto headers = json::parse(r["headers"].c_str());
  for (const auto& [k, v] : headers.items()) {
    e.headers[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  if (!r["max_in_flight"].is_null()) e.max_in_flight = r["max_in_flight"].as<int>();
  e.enabled = r["enabled"].as<bool>();
  if (!r["disabled_reason"].is_null()) e.disabled_reason = r["disabled_reason"].as<std::string>();
  e.created_at = r["created"].as<std::string>();
  e.updated_at = r["updated"].as<std::string>();
  e.secrets = r["secrets"].as<int>();
  e.backlog = r["backlog"].as<std::int64_t>();
  e.dead_letters = r["dead"].as<std::int64_t>();
  return e;
}

bool ValidSecret(const std::string& s) {
  static const std::regex re("^whsec_[A-Za-z0-9+/]+={0,2}$");
  return std::regex_match(s, re);
}

void CheckId(const std::string& id) {
  static const std::regex re("^[A-Za-z0-9_.-]{1,64}$");
  if (!std::regex_match(id, re)) {
    throw std::invalid_argument("endpoint id \"" + id +
                                "\" is not allowed: use 1 to 64 letters, digits, '_', '.' or '-'"
                                " (it becomes part of the endpoint's ordering keys)");
  }
}

// What AddEndpoint and UpdateEndpoint store, checked first so the error names the field.
json Changes(const EndpointFields& f) {
  json c = json::object();
  if (f.destination) {
    if (f.destination->empty() || f.destination->size() > 255) {
      throw std::invalid_argument(
          "destination must be 1 to 255 characters: the name applications pass to "
          "outbox.enqueue, configured with `webhook: {endpoints: database}`");
    }
    c["destination"] = *f.destination;
  }
  if (f.url) {
    static const std::regex re("^https?://[^/?#\\s]+[^\\s]*$", std::regex::icase);
    if (!std::regex_match(*f.url, re)) {
      throw std::invalid_argument("url \"" + *f.url +
                                  "\" is not an http:// or https:// URL with a host; write e.g. "
                                  "https://customer.example.com/webhooks");
    }
    c["url"] = *f.url;
  }
  if (f.description) c["description"] = *f.description;
  if (f.metadata) {
    json m = json::parse(*f.metadata, nullptr, false);
    if (m.is_discarded() || !m.is_object()) {
      throw std::invalid_argument("metadata must be a JSON object, e.g. '{\"customer\": \"42\"}'");
    }
    c["metadata"] = std::move(m);
  }
  if (f.event_types) {
    for (const auto& t : *f.event_types) {
      if (t.empty()) {
        throw std::invalid_argument(
            "an event type filter must not be empty; leave the filter out to receive every event");
      }
    }
    c["event_types"] = *f.event_types;
  }
  if (f.headers) {
    for (const auto& [k, v] : *f.headers) {
      static const std::regex token("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$");
      if (!std::regex_match(k, token)) {
        throw std::invalid_argument("header name \"" + k + "\" is not a valid HTTP field name");
      }
      for (const char ch : v) {
        const auto u = static_cast<unsigned char>(ch);
        if ((u < 0x20 && u != '\t') || u == 0x7F) {
          throw std::invalid_argument("header " + k + ": the value contains a control character");
        }
      }
    }
    c["headers"] = *f.headers;
  }
  if (f.max_in_flight) {
    if (*f.max_in_flight < 0 || *f.max_in_flight > 1024) {
      throw std::invalid_argument(
          "max_in_flight must be 1 to 1024 concurrent requests (0: the destination's setting)");
    }
    c["max_in_flight"] = *f.max_in_flight;
  }
  if (f.enabled) c["enabled"] = *f.enabled;
  return c;
}

constexpr const char* kNewSecret =
    "'whsec_' || encode(decode(replace(gen_random_uuid()::text, '-', '') || "
    "replace(gen_random_uuid()::text, '-', ''), 'hex'), 'base64')";

}  // namespace

CreatedEndpoint AddEndpoint(Store& store, const EndpointFields& fields) {
  if (!fields.destination) throw std::invalid_argument("name the destination (--destination)");
  if (!fields.url) throw std::invalid_argument("give the endpoint's url (--url)");
  if (fields.id) CheckId(*fields.id);
  if (fields.secret && !ValidSecret(*fields.secret)) {
    throw std::invalid_argument(
        "secret must be a Standard Webhooks secret, \"whsec_\" followed by base64; leave it out "
        "to have one generated");
  }
  json c = Changes(fields);
  if (fields.id) c["id"] = *fields.id;
  return Translated([&]() -> CreatedEndpoint {
    pqxx::connection& conn = StoreAccess::Connection(store);
    pqxx::work tx(conn);
    pqxx::result r;
    try {
      r = tx.exec_params(
          "INSERT INTO outbox.endpoints (id, destination, url, description, metadata, "
          "                              event_types, headers, max_in_flight, enabled) "
          "SELECT coalesce(c->>'id', 'ep_' || replace(gen_random_uuid()::text, '-', '')), "
          "       c->>'destination', c->>'url', coalesce(c->>'description', ''), "
          "       coalesce(c->'metadata', '{}'), "
          "       ARRAY(SELECT jsonb_array_elements_text(coalesce(c->'event_types', '[]'))), "
          "       coalesce(c->'headers', '{}'), nullif((c->>'max_in_flight')::int, 0), "
          "       coalesce((c->>'enabled')::boolean, true) "
          "FROM (SELECT $1::jsonb AS c) x RETURNING id",
          c.dump());
    } catch (const pqxx::unique_violation&) {
      throw std::invalid_argument("an endpoint with id \"" + c.value("id", std::string()) +
                                  "\" already exists; choose another --id, or change it with "
                                  "`outbox-relay endpoints update`");
    }
    const std::string id = r[0][0].as<std::string>();
    const auto s =
        tx.exec_params(std::string("INSERT INTO outbox.endpoint_secrets (endpoint_id, secret) "
                                   "VALUES ($1, coalesce(nullif($2, ''), ") +
                           kNewSecret + ")) RETURNING secret",
                       id, fields.secret.value_or(""));
    CreatedEndpoint out;
    out.secret = s[0][0].as<std::string>();
    out.endpoint = FromRow(tx.exec_params1(std::string(kSelect) + "WHERE e.id = $1", id));
    tx.commit();
    return out;
  });
}

std::vector<EndpointRecord> ListEndpoints(Store& store, const std::string& destination) {
  return Translated([&]() -> std::vector<EndpointRecord> {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    std::vector<EndpointRecord> out;
    for (const auto& r :
         tx.exec_params(std::string(kSelect) + "WHERE $1 = '' OR e.destination = $1 "
                                               "ORDER BY e.destination, e.id",
                        destination)) {
      out.push_back(FromRow(r));
    }
    return out;
  });
}

std::optional<EndpointRecord> GetEndpoint(Store& store, const std::string& id) {
  return Translated([&]() -> std::optional<EndpointRecord> {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    const auto r = tx.exec_params(std::string(kSelect) + "WHERE e.id = $1", id);
    if (r.empty()) return std::nullopt;
    return FromRow(r[0]);
  });
}

bool UpdateEndpoint(Store& store, const std::string& id, const EndpointFields& fields) {
  if (fields.id || fields.secret) {
    throw std::invalid_argument(
        "an endpoint's id cannot change, and its secret changes with `endpoints rotate-secret`");
  }
  const json c = Changes(fields);
  return Translated([&]() -> bool {
    pqxx::work tx(StoreAccess::Connection(store));
    const auto r = tx.exec_params(
        "UPDATE outbox.endpoints e SET "
        "  destination = coalesce(c->>'destination', e.destination), "
        "  url = coalesce(c->>'url', e.url), "
        "  description = coalesce(c->>'description', e.description), "
        "  metadata = coalesce(c->'metadata', e.metadata), "
        "  event_types = CASE WHEN c ? 'event_types' "
        "                THEN ARRAY(SELECT jsonb_array_elements_text(c->'event_types')) "
        "                ELSE e.event_types END, "
        "  headers = coalesce(c->'headers', e.headers), "
        "  max_in_flight = CASE WHEN NOT c ? 'max_in_flight' THEN e.max_in_flight "
        "                  ELSE nullif((c->>'max_in_flight')::int, 0) END, "
        "  updated_at = clock_timestamp() "
        "FROM (SELECT $2::jsonb AS c) x WHERE e.id = $1",
        id, c.dump());
    tx.commit();
    return r.affected_rows() > 0;
  });
}

bool SetEndpointEnabled(Store& store, const std::string& id, bool enabled,
                        const std::string& reason) {
  return Translated([&]() -> bool {
    pqxx::work tx(StoreAccess::Connection(store));
    const auto r = tx.exec_params(
        "UPDATE outbox.endpoints SET enabled = $2, "
        "  disabled_reason = CASE WHEN $2 THEN NULL ELSE nullif($3, '') END, "
        "  updated_at = clock_timestamp() WHERE id = $1",
        id, enabled, reason);
    if (r.affected_rows() == 0) return false;
    if (enabled) {
      // What waited while it was disabled (or for a retry) goes now, in order: rows blocked
      // behind their key ('infinity') stay so.
      tx.exec_params(
          "UPDATE outbox.messages SET deliver_after = clock_timestamp() "
          "WHERE endpoint_id = $1 AND parked AND lease_owner IS NULL "
          "  AND deliver_after > clock_timestamp() AND deliver_after <> 'infinity'",
          id);
    }
    tx.commit();
    return true;
  });
}

bool DeleteEndpoint(Store& store, const std::string& id) {
  return Translated([&]() -> bool {
    pqxx::work tx(StoreAccess::Connection(store));
    const auto r = tx.exec_params("DELETE FROM outbox.endpoints WHERE id = $1", id);
    tx.commit();
    return r.affected_rows() > 0;
  });
}

std::string RotateEndpointSecret(Store& store, const std::string& id, std::chrono::seconds overlap,
                                 const std::optional<std::string>& secret) {
  if (secret && !ValidSecret(*secret)) {
    throw std::invalid_argument(
        "secret must be a Standard Webhooks secret, \"whsec_\" followed by base64; leave it out "
        "to have one generated");
  }
  if (overlap.count() < 0) throw std::invalid_argument("the overlap must not be negative");
  return Translated([&]() -> std::string {
    pqxx::work tx(StoreAccess::Connection(store));
    if (tx.exec_params("SELECT 1 FROM outbox.endpoints WHERE id = $1 FOR UPDATE", id).empty()) {
      throw std::invalid_argument("no endpoint has id \"" + id +
                                  "\"; `outbox-relay endpoints list` shows them");
    }
    // Secrets that sign now stop after the overlap; those already expired are dropped.
    tx.exec_params(
        "UPDATE outbox.endpoint_secrets "
        "SET expires_at = least(coalesce(expires_at, 'infinity'), "
        "                       clock_timestamp() + make_interval(secs => $2)) "
        "WHERE endpoint_id = $1",
        id, static_cast<double>(overlap.count()));
    tx.exec_params(
        "DELETE FROM outbox.endpoint_secrets WHERE endpoint_id = $1 "
        "AND expires_at <= clock_timestamp()",
        id);
    const auto s =
        tx.exec_params(std::string("INSERT INTO outbox.endpoint_secrets (endpoint_id, secret) "
                                   "VALUES ($1, coalesce(nullif($2, ''), ") +
                           kNewSecret + ")) RETURNING secret",
                       id, secret.value_or(""));
    tx.exec_params("UPDATE outbox.endpoints SET updated_at = clock_timestamp() WHERE id = $1", id);
    tx.commit();
    return s[0][0].as<std::string>();
  });
}

}  // namespace outbox::relay
