// A webhook URL checked and split (plain or TLS, host, port, path). Shared by the webhook
// sink and the places that store endpoint URLs (`outbox-relay endpoints`, the management API).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace outbox::relay {

struct WebhookUrl {
  bool https = false;
  std::string host;  ///< Without brackets for IPv6 literals.
  int port = 0;
  std::string path;  ///< Path and query, at least "/". No fragment.
};

/// Throws std::invalid_argument saying what is wrong, without echoing the URL (it may carry
/// credentials or tokens): http:// or https:// only, a host, a port 1-65535 if any, no
/// credentials, no spaces or control characters.
WebhookUrl ParseWebhookUrl(const std::string& url);

/// True for an RFC 9110 token: what a header field name must be.
bool IsHttpToken(std::string_view name);

/// Why a webhook's own header `name` (any case) cannot be set, or "" when it can: the relay
/// signs with the Standard Webhooks headers (the `webhook-` prefix is reserved) and sets the
/// idempotency key and content type, the HTTP client the framing headers. The sink skips such
/// headers; the config and the endpoint registry refuse them with this reason.
std::string OwnedWebhookHeader(const std::string& name);

/// Why an HMAC key of `bytes` bytes (a "whsec_" secret, decoded) is refused, or "" when it is
/// 24 to 64 bytes, as Standard Webhooks asks. Given keys are checked (the config, the
/// management API, `endpoints add|rotate-secret`); stored ones still sign whatever their length.
std::string HmacKeyLengthProblem(std::size_t bytes);

}  // namespace outbox::relay
