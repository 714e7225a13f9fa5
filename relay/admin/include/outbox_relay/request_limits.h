// What cpp-httplib 0.11 reads of a request body before any handler (or the token check) runs.
//
// The library reads a POST, PUT, PATCH or DELETE body into memory before it routes the
// request: a body in chunked transfer encoding with no limit at all (set_payload_max_length
// checks only Content-Length), and a body with neither header until the client closes the
// connection. Anyone who could reach the admin or management port, with or without the
// token, could grow the relay's memory until the kernel killed it; and a DELETE sent without
// Content-Length (curl's) waited for the read timeout before it was answered. This installs
// a pre-routing handler, which runs after the request head and before the body is read:
// - Transfer-Encoding of any kind: 411 (send Content-Length);
// - Content-Length over max_body_bytes: 413 (a body up to 64 times the limit is read and
//   dropped first, so that a client still writing it gets the answer; a larger one is not);
// - a method that may carry a body, with no Content-Length: no body (RFC 9112 section 6.3),
//   as if it said Content-Length: 0.
// A refused request's connection is not read further for it; what the client still sends is
// read as the next request and answered 400.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace outbox::relay {

/// Writes a refusal (status, a short machine-readable code, a message naming the fix) in the
/// server's own format.
using RefusalWriter = std::function<void(httplib::Response& res, int status,
                                         const std::string& code, const std::string& message)>;

/// Also sets the server's payload limit to max_body_bytes. Call before the server listens,
/// and install no other pre-routing handler.
void LimitRequestBodies(httplib::Server& server, std::size_t max_body_bytes, RefusalWriter write);

}  // namespace outbox::relay
