// Inside the store module only: the libpqxx connection behind a Store, and the translation of
// libpqxx's exceptions into StoreError. Nothing outside relay/store includes this.
#pragma once

#include <pqxx/pqxx>
#include <utility>

#include "outbox_relay/store.h"

namespace outbox::relay {

struct StoreAccess {
  /// The open connection of `store` (connecting if needed).
  static pqxx::connection& Connection(Store& store);
};

/// For a session that runs for minutes in parts (a replay, a recovery): a client that goes away
/// (its relay stopped: Store::Interrupt shuts its socket) while a statement waits for a lock is
/// found out within a second, and the session ends with the locks it holds (an endpoint's move
/// lock, a replay's row, keys' locks). A server waiting on a lock does not read from its client
/// otherwise. PostgreSQL 14 or later, on a platform that can tell (not Windows): where the
/// setting is refused, the session runs without it.
inline void EndWithLostClient(pqxx::connection& c) {
  try {
    pqxx::nontransaction(c).exec(
        "SELECT set_config('client_connection_check_interval', '1s', false) "
        "WHERE current_setting('server_version_num')::int >= 140000");
  } catch (const pqxx::sql_error&) {
  }
}

/// An endpoint's creation as text that reads back the same whatever the session's DateStyle
/// (one that writes zone abbreviations reads back in another zone, or not at all).
inline constexpr const char* kEndpointCreatedAt =
    "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";

/// The StoreError a libpqxx (or libpq) failure amounts to; rethrows anything else unchanged.
[[noreturn]] void ThrowStoreError();

/// Runs `f`, turning libpqxx exceptions into StoreError (std::invalid_argument and the
/// module's own errors pass through).
template <class F>
auto Translated(F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (...) {
    ThrowStoreError();
  }
}

}  // namespace outbox::relay
