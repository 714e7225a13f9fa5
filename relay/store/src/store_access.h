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
