// Applies the embedded sql/migrations to a database.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace outbox::relay {

struct MigrationResult {
  int from_version = 0;              ///< Version before (0: empty database).
  int to_version = 0;                ///< Version after.
  std::vector<std::string> applied;  ///< Names of the migrations applied now.
};

/// Thrown when migrating is impossible (schema newer than this binary, bad URL, ...).
class MigrationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Highest migration version this binary carries.
int LatestMigrationVersion();

/// Applies pending migrations, each in its own transaction, under a session advisory lock
/// so concurrent runs serialise; idempotent. Throws MigrationError if the database is at
/// a version newer than LatestMigrationVersion(), and StoreError (queue_store.h) for database
/// errors.
MigrationResult Migrate(const std::string& database_url);

/// Version recorded in the database (0 if never migrated). Throws like Migrate.
int CurrentSchemaVersion(const std::string& database_url);

}  // namespace outbox::relay
