// Names the calling thread (Linux: at most 15 characters; longer names are cut), so `top -H`,
// a debugger and the benchmark's per-thread CPU table show which loop spends the time. Every
// long-lived thread of the relay names itself "or-<role>" (docs/architecture.md, "Threads").
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace outbox::relay {

inline void NameThisThread(std::string_view name) {
  std::string n(name.substr(0, 15));
  pthread_setname_np(pthread_self(), n.c_str());
}

}  // namespace outbox::relay
