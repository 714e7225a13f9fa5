// A bare HTTP/1.1 exchange over a loopback socket, for requests a client library would not
// send (a body that never ends, no Content-Length, a head that never ends).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>

namespace outbox::testing {

/// A socket connected to 127.0.0.1:port, or -1.
inline int RawConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// What `fd` receives until `done(received)` says so, the peer closes, or `deadline` passes.
inline std::string RawRead(int fd, std::chrono::milliseconds deadline,
                           const std::function<bool(const std::string&)>& done) {
  std::string received;
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (!done(received)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) break;
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    received.append(buf, static_cast<std::size_t>(n));
  }
  return received;
}

/// Sends `request` as given and returns what the server answers until `done` says so, it
/// closes the connection, or `deadline` passes.
inline std::string RawHttpExchange(
    int port, const std::string& request, std::chrono::milliseconds deadline,
    const std::function<bool(const std::string&)>& done = [](const std::string&) {
      return false;
    }) {
  const int fd = RawConnect(port);
  if (fd < 0) return "";
  std::string answer;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    answer = RawRead(fd, deadline, done);
  }
  ::close(fd);
  return answer;
}

/// Everything the server answers to `request` until it closes the connection or `deadline`.
inline std::string RawHttpAnswer(int port, const std::string& request,
                                 std::chrono::milliseconds deadline) {
  return RawHttpExchange(port, request, deadline);
}

/// The status code of the answer to `request`, or 0 when none came within `deadline`.
inline int RawHttpStatus(int port, const std::string& request, std::chrono::milliseconds deadline) {
  const std::string head = RawHttpExchange(port, request, deadline, [](const std::string& got) {
    return got.find("\r\n") != std::string::npos;
  });
  // "HTTP/1.1 411 Length Required"
  if (head.size() >= 12 && head.compare(0, 5, "HTTP/") == 0) {
    return std::atoi(head.substr(9, 3).c_str());
  }
  return 0;
}

}  // namespace outbox::testing
