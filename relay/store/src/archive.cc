#include "outbox_relay/archive.h"

#include <pqxx/pqxx>

#include "queries.h"
#include "store_access.h"

namespace outbox::relay {

std::vector<ArchivedMessage> ReadArchive(Store& store, const std::string& destination,
                                         std::chrono::system_clock::time_point since) {
  return Translated([&]() -> std::vector<ArchivedMessage> {
    pqxx::connection& c = StoreAccess::Connection(store);
    pqxx::nontransaction tx(c);
    const long long since_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(since.time_since_epoch()).count();
    std::vector<ArchivedMessage> out;
    const pqxx::result rows =
        tx.exec_params(std::string(sql::queries::karchive_read), destination, since_ms);
    out.reserve(rows.size());
    for (const auto& r : rows) {
      ArchivedMessage m;
      m.id = r["id"].as<std::int64_t>();
      m.idempotency_key = r["idempotency_key"].c_str();
      if (!r["ordering_key"].is_null()) m.ordering_key = r["ordering_key"].c_str();
      m.created_at = std::chrono::system_clock::time_point(
          std::chrono::milliseconds(r["created_ms"].as<std::int64_t>()));
      out.push_back(std::move(m));
    }
    return out;
  });
}

}  // namespace outbox::relay
