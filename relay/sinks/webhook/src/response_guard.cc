// See response_guard.h for why this file defines SSL_read(), SSL_write() and poll().
#include "response_guard.h"

#include <dlfcn.h>
#include <openssl/ssl.h>
#include <poll.h>

#include <cstdlib>

namespace outbox::relay::webhook_detail {
namespace {

thread_local ResponseHeadGuard* t_guard = nullptr;

template <typename Fn>
Fn Next(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) std::abort();  // no C library or OpenSSL under us: nothing could work
  return reinterpret_cast<Fn>(f);
}

}  // namespace

const std::string& StatusLineTooLong() {
  static const std::string why = "the response's status line is longer than " +
                                 std::to_string(kMaxStatusLine) +
                                 " bytes (not an HTTP answer); not read further";
  return why;
}
const std::string& HeaderLineTooLong() {
  static const std::string why = "a response header line is longer than " +
                                 std::to_string(kMaxHeaderLine) + " bytes; not read further";
  return why;
}
const std::string& HeadTooLong() {
  static const std::string why = "the response's headers are longer than " +
                                 std::to_string(kMaxResponseHead) + " bytes; not read further";
  return why;
}

ResponseHeadGuard::ResponseHeadGuard(Clock::time_point deadline)
    : deadline_(deadline), outer_(t_guard) {
  t_guard = this;
}
ResponseHeadGuard::~ResponseHeadGuard() { t_guard = outer_; }

bool ResponseHeadGuard::Feed(const char* data, std::size_t n) {
  if (!refused_.empty()) return false;
  for (std::size_t i = 0; i < n && in_head_; ++i) {
    const char c = data[i];
    ++head_;
    if (c == '\n') {
      if (line_ == 0 || (line_ == 1 && last_cr_)) {  // the empty line: the head ends
        // An interim answer ("HTTP/1.1 100 Continue"): cpp-httplib reads the next head, with
        // its status line, the same way; it is bounded the same way.
        const bool interim = status_start_.size() >= 10 &&
                             status_start_.compare(0, 7, "HTTP/1.") == 0 &&
                             status_start_[8] == ' ' && status_start_[9] == '1';
        in_head_ = interim;
        status_line_ = interim;
        status_start_.clear();
      } else {
        status_line_ = false;
      }
      line_ = 0;
    } else {
      if (status_line_ && status_start_.size() < 12) status_start_.push_back(c);
      ++line_;
      if (status_line_ && line_ > kMaxStatusLine) {
        refused_ = StatusLineTooLong();
      } else if (line_ > kMaxHeaderLine) {
        refused_ = HeaderLineTooLong();
      }
    }
    if (refused_.empty() && head_ > kMaxResponseHead) {
      refused_ = HeadTooLong();
    }
    if (!refused_.empty()) return false;
    last_cr_ = c == '\r';
  }
  return true;
}

int ResponseHeadGuard::WriteTls(SSL* ssl, const void* data, int n,
                                int (*write)(SSL*, const void*, int)) {
  // A partial write could leave part of the head unsent while cpp-httplib counts it all sent.
  if ((SSL_get_mode(ssl) & SSL_MODE_ENABLE_PARTIAL_WRITE) != 0 && kept_head_.empty()) {
    return write(ssl, data, n);
  }
  if (hold_head_) {
    kept_head_.append(static_cast<const char*>(data), static_cast<std::size_t>(n));
    return n;  // written, as far as cpp-httplib can tell: it goes with the body
  }
  if (kept_head_.empty()) return write(ssl, data, n);
  if (!combined_) {
    kept_head_.append(static_cast<const char*>(data), static_cast<std::size_t>(n));
    body_bytes_ = n;
    combined_ = true;
  }
  // Retried after SSL_ERROR_WANT_WRITE with the same bytes, as OpenSSL requires.
  const int written = write(ssl, kept_head_.data(), static_cast<int>(kept_head_.size()));
  if (written <= 0) return written;
  kept_head_.clear();
  combined_ = false;
  return body_bytes_;
}

}  // namespace outbox::relay::webhook_detail

using outbox::relay::webhook_detail::t_guard;

extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  using Fn = int (*)(SSL*, void*, int);
  static const Fn next = outbox::relay::webhook_detail::Next<Fn>("SSL_read");
  auto* guard = t_guard;
  if (guard == nullptr) return next(ssl, buf, num);
  if (!guard->Refused().empty() || guard->Late()) return -1;
  const int n = next(ssl, buf, num);
  if (n > 0 && !guard->Feed(static_cast<const char*>(buf), static_cast<std::size_t>(n))) return -1;
  return n;
}

extern "C" int SSL_write(SSL* ssl, const void* buf, int num) {
  using Fn = int (*)(SSL*, const void*, int);
  static const Fn next = outbox::relay::webhook_detail::Next<Fn>("SSL_write");
  auto* guard = t_guard;
  if (guard == nullptr || !guard->Coalescing()) return next(ssl, buf, num);
  return guard->WriteTls(ssl, buf, num, next);
}

extern "C" int poll(struct pollfd* fds, nfds_t nfds, int timeout) {
  using Fn = int (*)(struct pollfd*, nfds_t, int);
  static const Fn next = outbox::relay::webhook_detail::Next<Fn>("poll");
  auto* guard = t_guard;
  if (guard == nullptr || !guard->Coalescing() || nfds != 1) return next(fds, nfds, timeout);
  pollfd& p = fds[0];
  if (p.events == POLLIN && timeout == 0 && !guard->FirstLivenessCheck()) {
    p.revents = 0;  // nothing to read: the connection checked alive at the request's start
    return 0;
  }
  return next(fds, nfds, timeout);
}
