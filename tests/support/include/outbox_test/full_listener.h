// A loopback listener whose accept queue is full: connecting to it hangs, as to an endpoint
// that drops SYNs (a firewall, a host that is down).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace outbox::testing {

/// A loopback listener whose accept queue is full: a client's connect hangs (the kernel drops
/// its SYN) until the test makes room with Drain() and the client retransmits (after ~1 s).
class FullListener {
 public:
  FullListener() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        ::listen(fd_, 0) != 0) {
      throw std::runtime_error("cannot listen on a loopback socket");
    }
    port_ = ntohs(addr.sin_port);
    // Connect until one connection is not established: the queue is full from then on.
    for (int i = 0; i < 8; ++i) {
      const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      (void)::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      pollfd p{c, POLLOUT, 0};
      if (::poll(&p, 1, 300) != 1) {
        ::close(c);  // its SYN was dropped
        return;
      }
      queued_.push_back(c);
    }
    throw std::runtime_error("the accept queue never filled");
  }
  ~FullListener() {
    for (const int c : queued_) ::close(c);
    ::close(fd_);
  }
  int Port() const { return port_; }

  /// Clients (other than our own fillers) whose SYN waits for room: SYN_SENT to this port.
  int Connecting() const {
    std::ifstream tcp("/proc/net/tcp");
    std::string line;
    std::getline(tcp, line);  // header
    char port_hex[8];
    std::snprintf(port_hex, sizeof port_hex, "%04X", port_);
    const std::string remote = std::string("0100007F:") + port_hex;
    int n = 0;
    while (std::getline(tcp, line)) {
      // "  sl  local_address rem_address   st ..."
      std::istringstream in(line);
      std::string sl, local, rem, st;
      in >> sl >> local >> rem >> st;
      if (rem == remote && st == "02") ++n;
    }
    return n;
  }

  /// Accepts and closes what waits in the queue, so the next SYN gets through.
  void Drain() {
    for (const int c : queued_) ::close(c);
    queued_.clear();
    pollfd p{fd_, POLLIN, 0};
    while (::poll(&p, 1, 0) == 1) {
      const int conn = ::accept(fd_, nullptr, nullptr);
      if (conn < 0) break;
      ::close(conn);
    }
  }

  /// What the first client to connect (after `within`) sends until it closes.
  std::string AcceptAndRead(std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    const auto left = [&] {
      return static_cast<int>(std::max<long long>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(until -
                                                                   std::chrono::steady_clock::now())
                 .count()));
    };
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, left()) != 1) return "<nobody connected>";
    const int conn = ::accept(fd_, nullptr, nullptr);
    std::string got;
    char buf[4096];
    while (true) {
      pollfd r{conn, POLLIN, 0};
      if (::poll(&r, 1, left()) != 1) break;
      const ssize_t n = ::read(conn, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    ::close(conn);
    return got;
  }

 private:
  int fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int port_ = 0;
  std::vector<int> queued_;
};

}  // namespace outbox::testing
