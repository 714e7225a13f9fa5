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
  const auto rebalance = [this] {
    std::lock_guard lk(mu);
    rebalance_requested = true;
    ++rebalance_gen;
  };
  bool listening = false;  // since the last failure (or the start)
  while (!stopping) {
    try {
      store.Listen();
      if (!listening) {
        // What was sent before this LISTEN is lost: wake the claim loops (a message written
        // meanwhile waited for poll_interval) and start their lanes over (a missed
        // 'rebalance' left rows behind their cursors for the sweep).
        listening = true;
        rebalance();
        Wake();
      }
      if (store.WaitForNotification(tuning::kListenWait)) {
        if (store.TakeRebalance()) rebalance();
        Wake();
      }
      db.Succeeded();
    } catch (const std::exception& e) {
      listening = false;
      WaitFor(db.Failed(store, e), [] { return false; });
    }
  }
}

}  // namespace outbox::relay
