// Standard Webhooks signing: HMAC-SHA256 over "id.timestamp.body", base64, "v1," prefix.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

#include "outbox_relay/config.h"
#include "outbox_relay/webhook_sink.h"
#include "webhook_internal.h"

namespace outbox::relay {
namespace webhook_detail {
std::string Base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string DecodeSecret(const std::string& whsec_secret) {
  // One parser for secrets: the config's, which also validated them at start-up.
  try {
    return WebhookSecretKey(whsec_secret);
  } catch (const ConfigError& e) {
    throw std::invalid_argument(e.what());
  }
}

std::string SignWithKey(const std::string& key, const std::string& msg_id,
                        long long timestamp_seconds, const std::string& body) {
  std::string content;
  const std::string ts = std::to_string(timestamp_seconds);
  content.reserve(msg_id.size() + ts.size() + body.size() + 2);
  content.append(msg_id).append(1, '.').append(ts).append(1, '.').append(body);
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(content.data()), content.size(), mac.data(),
           &mac_len) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return "v1," + Base64Encode(std::string_view(reinterpret_cast<const char*>(mac.data()), mac_len));
}

}  // namespace webhook_detail

std::string SignStandardWebhook(const std::string& whsec_secret, const std::string& msg_id,
                                long long timestamp_seconds, const std::string& body) {
  return webhook_detail::SignWithKey(webhook_detail::DecodeSecret(whsec_secret), msg_id,
                                     timestamp_seconds, body);
}

bool VerifyStandardWebhook(const std::string& whsec_secret, const std::string& msg_id,
                           long long timestamp_seconds, const std::string& body,
                           const std::string& signature_header) {
  const std::string expected = SignStandardWebhook(whsec_secret, msg_id, timestamp_seconds, body);
  bool matched = false;
  std::string_view rest(signature_header);
  while (!rest.empty()) {
    const std::size_t space = rest.find(' ');
    const std::string_view entry = rest.substr(0, space);
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
    // Only "v1,..." entries; other versions are for other schemes. Lengths are public (the
    // size of an HMAC-SHA256 in base64), the bytes are compared in constant time.
    if (entry.size() == expected.size() && entry.substr(0, 3) == "v1," &&
        CRYPTO_memcmp(entry.data(), expected.data(), expected.size()) == 0) {
      matched = true;
    }
  }
  return matched;
}

}  // namespace outbox::relay
