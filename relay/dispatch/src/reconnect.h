// One thread's streak of failed database calls: counted, logged once at its start and once
// at its end, the store reset so the next call reconnects, and a growing pause before the
// next try. Every loop of the dispatcher uses one.
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "outbox_relay/queue_store.h"

namespace outbox::relay {

class Reconnect {
 public:
  /// `failed` is logged with the error at the first failure of a streak ("claim failed,
  /// reconnecting"), `recovered` when a call succeeds after one ("database reachable
  /// again"); `on_error` runs for every failure (the error counter).
  Reconnect(std::string failed, std::string recovered, std::function<void()> on_error);

  /// After a failed call on `store`: resets it and returns the pause before the next try
  /// (100 ms doubling to 5 s). A permanent error (StoreError::transient() false: a missing
  /// migration, a permission) is logged as an error every time, since waiting will not fix it.
  Millis Failed(QueueStore& store, const std::exception& e);
  /// After a successful call.
  void Succeeded();
  int failures() const { return failures_; }

 private:
  std::string failed_, recovered_;
  std::function<void()> on_error_;
  int failures_ = 0;
};

/// The pause after `failures` failures in a row.
Millis ReconnectDelay(int failures);

}  // namespace outbox::relay
