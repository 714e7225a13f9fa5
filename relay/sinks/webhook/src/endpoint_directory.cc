#include "endpoint_directory.h"

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

namespace outbox::relay::webhook_detail {

struct EndpointDirectory::Impl {
  std::string url;
  std::string destination;
  std::unique_ptr<pqxx::connection> conn;

  pqxx::connection& Get() {
    if (conn && conn->is_open()) return *conn;
    conn.reset();
    auto c = std::make_unique<pqxx::connection>(url);
    // A stuck read must not hold the planner (and with it every delivery) for long.
    pqxx::nontransaction tx(*c);
    tx.exec("SET statement_timeout = 5000");
    tx.exec("SET application_name = 'outbox-relay endpoints'");
    conn = std::move(c);
    return *conn;
  }

  template <class F>
  auto Run(F f) {
    try {
      return f(Get());
    } catch (...) {
      conn.reset();  // the next call reconnects
      throw;
    }
  }
};

EndpointDirectory::EndpointDirectory(std::string database_url, std::string destination)
    : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(database_url);
  impl_->destination = std::move(destination);
}

EndpointDirectory::~EndpointDirectory() = default;

std::int64_t EndpointDirectory::Version() {
  return impl_->Run([](pqxx::connection& c) {
    pqxx::nontransaction tx(c);
    return tx.exec1("SELECT version FROM outbox.endpoint_registry")[0].as<std::int64_t>();
  });
}

Directory EndpointDirectory::Load() {
  return impl_->Run([this](pqxx::connection& c) {
    Directory d;
    // One snapshot for the version and the rows: a change committed after it moves the
    // version past what this returns, and the next poll loads again.
    pqxx::work tx(c, "load endpoints");
    tx.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY");
    d.version = tx.exec1("SELECT version FROM outbox.endpoint_registry")[0].as<std::int64_t>();
    const auto rows = tx.exec_params(
        "SELECT e.id, e.url, array_to_json(e.event_types)::text AS event_types, "
        "       e.headers::text AS headers, e.max_in_flight, e.enabled, "
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

std::unordered_set<std::string> EndpointDirectory::OwedKeys(const std::vector<std::string>& keys) {
  std::unordered_set<std::string> owed;
  if (keys.empty()) return owed;
  return impl_->Run([&](pqxx::connection& c) {
    pqxx::nontransaction tx(c);
    // = ANY(array): one probe of the partial index per key, however many endpoint rows wait.
    const auto rows = tx.exec_params(
        "SELECT DISTINCT ordering_key FROM outbox.messages "
        "WHERE destination = $1 AND endpoint_id IS NOT NULL "
        "  AND ordering_key = ANY(ARRAY(SELECT jsonb_array_elements_text($2::jsonb)))",
        impl_->destination, nlohmann::json(keys).dump());
    for (const auto& row : rows) owed.insert(row[0].as<std::string>());
    return owed;
  });
}

std::int64_t EndpointDirectory::WakeEndpoint(const std::string& endpoint_id) {
  return impl_->Run([&](pqxx::connection& c) -> std::int64_t {
    pqxx::nontransaction tx(c);
    const auto r = tx.exec_params(
        "UPDATE outbox.messages SET deliver_after = clock_timestamp() "
        "WHERE endpoint_id = $1 AND parked AND lease_owner IS NULL "
        "  AND deliver_after > clock_timestamp() AND deliver_after <> 'infinity'",
        endpoint_id);
    return static_cast<std::int64_t>(r.affected_rows());
  });
}

}  // namespace outbox::relay::webhook_detail
