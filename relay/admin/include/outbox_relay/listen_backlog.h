// A larger listen backlog for cpp-httplib servers.
#pragma once

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>

namespace outbox::relay {

/// cpp-httplib 0.11, as Debian builds it, listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG
/// is compiled into the library). When more clients connect at once than its accept loop
/// takes in, the kernel drops their handshakes: they wait for a SYN retransmit (1 s) or fail.
/// Seen as "connection error: Read (1002ms)" on the first requests of a relay's 32 webhook
/// workers against the benchmark's receiver, which could open the endpoint's breaker. This
/// remembers a server's listening socket (installing the socket options: SO_REUSEADDR only,
/// not httplib's SO_REUSEPORT, which lets a second process share the port silently) and
/// listens on it again with a larger backlog once it is bound.
class ListenBacklog {
 public:
  explicit ListenBacklog(httplib::Server& server) : fd_(std::make_shared<std::atomic<int>>(-1)) {
    server.set_socket_options([fd = fd_](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      fd->store(sock);
    });
  }

  /// After bind_to_port / bind_to_any_port, before listen_after_bind. False when no socket was
  /// bound or listen() failed.
  bool Raise(int backlog = SOMAXCONN) const {
    const int fd = fd_->load();
    return fd >= 0 && ::listen(fd, backlog) == 0;
  }

 private:
  std::shared_ptr<std::atomic<int>> fd_;
};

}  // namespace outbox::relay
