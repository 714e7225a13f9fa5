#include "outbox_relay/retention.h"

#include <algorithm>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <string_view>

#include "queries.h"
#include "store_access.h"

namespace outbox::relay {
namespace {

std::int64_t BatchedDelete(pqxx::connection& c, std::string_view delete_sql,
                           const std::vector<std::string>& destinations, std::chrono::seconds age,
                           int batch, std::int64_t max_rows, const char* what) {
  if (age.count() < 0)
    throw std::invalid_argument(std::string(what) + ": the age must not be negative");
  if (batch < 1) throw std::invalid_argument(std::string(what) + ": batch must be at least 1");
  if (max_rows < 1)
    throw std::invalid_argument(std::string(what) + ": max_rows must be at least 1");

  std::string cutoff;
  {
    pqxx::nontransaction tx(c);
    cutoff = tx.exec_params1(std::string(sql::queries::kretention_cutoff),
                             static_cast<double>(age.count()))[0]
                 .as<std::string>();
  }
  const std::string statement(delete_sql);
  std::int64_t deleted = 0;
  for (const auto& destination : destinations) {
    while (deleted < max_rows) {
      const auto limit = static_cast<int>(std::min<std::int64_t>(batch, max_rows - deleted));
      pqxx::work tx(c);
      const auto n = static_cast<std::int64_t>(
          tx.exec_params(statement, cutoff, limit, destination).affected_rows());
      tx.commit();
      deleted += n;
      if (n < limit) break;  // nothing older is left (or a concurrent cleaner took some)
    }
  }
  return deleted;
}

}  // namespace

std::int64_t CleanupArchive(Store& store, const std::vector<std::string>& destinations,
                            std::chrono::seconds retention, int batch, std::int64_t max_rows) {
  return Translated([&]() -> std::int64_t {
    pqxx::connection& c = StoreAccess::Connection(store);
    return BatchedDelete(c, sql::queries::kretention_archive, destinations, retention, batch,
                         max_rows, "CleanupArchive");
  });
}

std::int64_t CleanupDeadLetters(Store& store, const std::vector<std::string>& destinations,
                                std::chrono::seconds max_age, int batch, std::int64_t max_rows) {
  return Translated([&]() -> std::int64_t {
    pqxx::connection& c = StoreAccess::Connection(store);
    return BatchedDelete(c, sql::queries::kretention_dead_letters, destinations, max_age, batch,
                         max_rows, "CleanupDeadLetters");
  });
}

}  // namespace outbox::relay
