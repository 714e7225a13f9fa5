#include "outbox_relay/request_limits.h"

#include <httplib.h>

#include <charconv>
#include <cstdint>
#include <utility>

namespace outbox::relay {
namespace {

/// Bodies up to this many times the limit are read and dropped before the 413.
constexpr std::uint64_t kDroppedBodyFactor = 64;

}  // namespace

void LimitRequestBodies(httplib::Server& server, std::size_t max_body_bytes, RefusalWriter write) {
  server.set_payload_max_length(max_body_bytes);
  server.set_pre_routing_handler([max_body_bytes, write = std::move(write)](
                                     const httplib::Request& req, httplib::Response& res) {
    const auto refuse = [&](int status, const char* code, const std::string& message) {
      write(res, status, code, message);
      return httplib::Server::HandlerResponse::Handled;
    };
    if (req.has_header("Transfer-Encoding")) {
      return refuse(411, "length_required",
                    "request bodies in chunked (or any) Transfer-Encoding are not accepted; send "
                    "the body with a Content-Length header");
    }
    if (req.has_header("Content-Length")) {
      const std::string text = req.get_header_value("Content-Length");
      std::uint64_t length = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), length);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
        return refuse(400, "invalid_content_length",
                      "the Content-Length header is not a number of bytes; send the body's "
                      "length in bytes");
      }
      // A body somewhat over the limit is read and dropped by cpp-httplib, which then answers
      // 413 (through the server's error handler): a client still writing it gets the answer
      // instead of a failed write. One far over it is not waited for.
      if (length / kDroppedBodyFactor > max_body_bytes) {
        return refuse(413, "payload_too_large",
                      "the request body is " + text + " bytes, over the limit of " +
                          std::to_string(max_body_bytes) + "; send less");
      }
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
        req.method == "DELETE" || req.method == "PRI") {
      // No length and no transfer coding: the request has no body. cpp-httplib would read one
      // until the client closes. The Request is the library's own non-const object, handed to
      // this handler by const reference.
      const_cast<httplib::Request&>(req).set_header("Content-Length", "0");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
}

}  // namespace outbox::relay
