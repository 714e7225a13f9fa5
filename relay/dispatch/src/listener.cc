// LISTEN outbox_messages on its own connection: every notification wakes the claim loops.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>

#include "dispatcher_impl.h"
#include "reconnect.h"
#include "tuning.h"

namespace outbox::relay {

void Dispatcher::Impl::ListenLoop() {
  const auto owned_store = stores();
  QueueStore& store = *owned_store;
  // Not counted as a database error: the claim loops poll meanwhile.
  Reconnect db("LISTEN connection lost, polling until it is back", "", nullptr);
  while (!stopping) {
    try {
      store.Listen();
      if (store.WaitForNotification(tuning::kListenWait)) {
        if (store.TakeRebalance()) {
          std::lock_guard lk(mu);
          rebalance_requested = true;
          ++rebalance_gen;
        }
        Wake();
      }
      db.Succeeded();
    } catch (const std::exception& e) {
      WaitFor(db.Failed(store, e), [] { return false; });
    }
  }
}

}  // namespace outbox::relay
