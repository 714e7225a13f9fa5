// Standard Webhooks signing: HMAC-SHA256 over "id.timestamp.body", base64, "v1," prefix.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

#include "outbox_relay/webhook_sink.h"
#include "webhook_internal.h"

namespace outbox::relay {
namespace webhook_detail {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr std::string_view kSecretPrefix = "whsec_";

int DecodeChar(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest == 1) {
    const unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view text) {
  // Padding is optional, but when present it must complete the last group.
  std::size_t len = text.size();
  std::size_t padding = 0;
  while (len > 0 && text[len - 1] == '=' && padding < 2) {
    --len;
    ++padding;
  }
  if (padding > 0 && text.size() % 4 != 0) return std::nullopt;
  if (len % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(len / 4 * 3 + 2);
  unsigned acc = 0;
  int bits = 0;
  for (std::size_t i = 0; i < len; ++i) {
    const int v = DecodeChar(text[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

std::string DecodeSecret(const std::string& whsec_secret) {
  if (whsec_secret.compare(0, kSecretPrefix.size(), kSecretPrefix) != 0) {
    throw std::invalid_argument("webhook secret must start with \"whsec_\"");
  }
  auto key = Base64Decode(std::string_view(whsec_secret).substr(kSecretPrefix.size()));
  if (!key) throw std::invalid_argument("webhook secret: the part after \"whsec_\" is not base64");
  if (key->empty()) throw std::invalid_argument("webhook secret is empty");
  return *key;
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
