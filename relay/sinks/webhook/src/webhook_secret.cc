#include "webhook_secret.h"

#include <cstdint>

#include "outbox_relay/webhook_target.h"

namespace outbox::relay::webhook_detail {

namespace {

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::optional<std::string> DecodeBase64(std::string_view text) {
  std::size_t padding = 0;
  while (padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  if (padding > 2) return std::nullopt;
  if (padding > 0 && text.size() % 4 != 0) return std::nullopt;
  const std::string_view data = text.substr(0, text.size() - padding);
  if (data.size() % 4 == 1) return std::nullopt;  // 6 bits cannot make a byte
  std::string out;
  out.reserve(data.size() * 3 / 4);
  std::uint32_t buffer = 0;
  int bits = 0;
  for (char c : data) {
    const int v = Base64Value(c);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFFu));
    }
  }
  return out;
}

std::string CheckWebhookSecret(std::string_view secret, std::string* key) {
  const std::string how =
      "; a Standard Webhooks secret is `whsec_` followed by base64, e.g. generate one with "
      "`echo \"whsec_$(openssl rand -base64 32)\"`";
  if (!secret.starts_with(kWebhookSecretPrefix)) return "does not start with `whsec_`" + how;
  const std::string_view encoded = secret.substr(kWebhookSecretPrefix.size());
  if (encoded.empty()) return "has nothing after `whsec_`" + how;
  auto decoded = DecodeBase64(encoded);
  if (!decoded)
    return "is not valid base64 after `whsec_` (standard alphabet A-Z a-z 0-9 + /, `=` padding)" +
           how;
  if (decoded->empty()) return "decodes to an empty key" + how;
  if (key != nullptr) *key = std::move(*decoded);
  return "";
}

}  // namespace outbox::relay::webhook_detail

namespace outbox::relay {

std::string WebhookSecretKey(const std::string& secret) {
  std::string key;
  const std::string problem = webhook_detail::CheckWebhookSecret(secret, &key);
  if (!problem.empty()) throw ConfigError("webhook secret " + problem);
  return key;
}

}  // namespace outbox::relay
