// LISTEN outbox_messages on its own connection: every notification wakes the claim loops. The
// same connection reads the paused destinations every kPauseRefresh, beside maintenance: a
// pause is honoured within a second while maintenance is busy (a reap of a large queue, a
// retention batch), and read by maintenance while this connection is down.
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
  auto next_paused = Now();
  while (!stopping) {
    try {
      store.Listen();
      if (const auto now = Now(); now >= next_paused) {
        next_paused = now + tuning::kPauseRefresh;
        RefreshPaused(store);
      }
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
