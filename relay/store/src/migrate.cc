#include "outbox_relay/migrate.h"

#include <charconv>
#include <pqxx/pqxx>
#include <string>
#include <string_view>
#include <vector>

#include "migrations.h"
#include "outbox_relay/conninfo.h"
#include "store_access.h"

namespace outbox::relay {
namespace {

// Any fixed number: the advisory lock that serialises concurrent `migrate` runs.
constexpr long long kMigrateLockKey = 0x6f7574626f78;  // "outbox"

int VersionOf(std::string_view name) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec != std::errc() || ptr == name.data()) {
    throw MigrationError("migration '" + std::string(name) + "' does not start with a number");
  }
  return v;
}

int ReadVersion(pqxx::connection& conn) {
  pqxx::work tx(conn);
  auto exists =
      tx.exec1("SELECT to_regclass('outbox.schema_migrations') IS NOT NULL")[0].as<bool>();
  if (!exists) return 0;
  auto r = tx.exec1("SELECT coalesce(max(version), 0) FROM outbox.schema_migrations");
  return r[0].as<int>();
}

// A migration failed (and rolled back); those before it committed. Rethrows the failure as a
// StoreError whose message names the migration, the version the schema is now at, what this
// run applied, and for the usual causes what to do.
[[noreturn]] void FailedStep(std::string_view name, int version,
                             const std::vector<std::string>& applied) {
  try {
    ThrowStoreError();
  } catch (const StoreError& e) {
    std::string what = "migration " + std::string(name) +
                       " failed and was rolled back; the schema is now at version " +
                       std::to_string(version);
    if (!applied.empty()) {
      what += " (applied: ";
      for (std::size_t i = 0; i < applied.size(); ++i) what += (i ? ", " : "") + applied[i];
      what += ")";
    }
    what += ": " + std::string(e.what());
    if (e.sqlstate() == "55P03") {
      what += " (a lock it needs was held for over 30 s, by a long transaction on the outbox "
              "tables: run migrate again once it has ended)";
    } else if (e.sqlstate() == "42501") {
      what += " (run migrate as the schema's owner: docs/roles.md)";
    }
    throw StoreError(e.transient() ? StoreError::Kind::kTransient : StoreError::Kind::kPermanent,
                     e.sqlstate(), what);
  }
}

}  // namespace

int LatestMigrationVersion() {
  int latest = 0;
  for (const auto& [name, text] : sql::migrations::kAll) latest = std::max(latest, VersionOf(name));
  return latest;
}

int CurrentSchemaVersion(const std::string& database_url) {
  return Translated([&]() -> int {
    pqxx::connection conn(WithConnectionDefaults(database_url));
    return ReadVersion(conn);
  });
}

MigrationResult Migrate(const std::string& database_url) {
  return Translated([&]() -> MigrationResult {
    pqxx::connection conn(WithConnectionDefaults(database_url));
    pqxx::nontransaction(conn).exec("SELECT pg_advisory_lock(" + std::to_string(kMigrateLockKey) +
                                    ")");
    MigrationResult result;
    try {
      result.from_version = ReadVersion(conn);
      const int latest = LatestMigrationVersion();
      if (result.from_version > latest) {
        throw MigrationError(
            "database schema is at version " + std::to_string(result.from_version) +
            " but this outbox-relay only knows migrations up to " + std::to_string(latest) +
            "; upgrade outbox-relay to a release that includes migration " +
            std::to_string(result.from_version) +
            " (never run an older relay against a newer schema)");
      }
      int version = result.from_version;
      for (const auto& [name, text] : sql::migrations::kAll) {
        const int v = VersionOf(name);
        if (v <= version) continue;
        try {
          pqxx::work tx(conn);
          tx.exec("SET LOCAL lock_timeout = '30s'");
          tx.exec(
              "CREATE SCHEMA IF NOT EXISTS outbox;"
              "CREATE TABLE IF NOT EXISTS outbox.schema_migrations ("
              "  version integer PRIMARY KEY, name text NOT NULL,"
              "  applied_at timestamptz NOT NULL DEFAULT now())");
          tx.exec(std::string(text));
          tx.exec_params("INSERT INTO outbox.schema_migrations (version, name) VALUES ($1, $2)",
                         v, std::string(name));
          tx.commit();
        } catch (...) {
          FailedStep(name, version, result.applied);
        }
        result.applied.emplace_back(name);
        version = v;
      }
      result.to_version = version;
    } catch (...) {
      try {
        pqxx::nontransaction(conn).exec("SELECT pg_advisory_unlock(" +
                                        std::to_string(kMigrateLockKey) + ")");
      } catch (...) {
      }
      throw;
    }
    pqxx::nontransaction(conn).exec("SELECT pg_advisory_unlock(" + std::to_string(kMigrateLockKey) +
                                    ")");
    return result;
  });
}

}  // namespace outbox::relay
