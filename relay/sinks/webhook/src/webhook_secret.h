// Internal: Standard Webhooks secrets ("whsec_" + base64 of the HMAC key).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace outbox::relay::webhook_detail {

inline constexpr std::string_view kWebhookSecretPrefix = "whsec_";

/// Decodes standard base64 (RFC 4648 alphabet; '=' padding optional); nullopt when invalid.
std::optional<std::string> DecodeBase64(std::string_view text);

/// Why `secret` is not a usable Standard Webhooks secret ("" when it is). Never contains the
/// secret. On success and when `key` is not null, stores the decoded key bytes there.
std::string CheckWebhookSecret(std::string_view secret, std::string* key);

}  // namespace outbox::relay::webhook_detail
