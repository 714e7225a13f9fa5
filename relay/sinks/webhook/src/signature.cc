// Standard Webhooks signing: HMAC-SHA256 over "id.timestamp.body", base64, "v1," prefix.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <memory>
#include <optional>
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

namespace {

constexpr std::size_t kSeedBytes = 32;

// Standard base64, padding optional; nullopt for anything else.
std::optional<std::string> Base64Decode(std::string_view text) {
  std::string padded(text);
  while (padded.size() % 4 != 0) padded += '=';
  if (padded.empty()) return std::nullopt;
  std::string out(padded.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(padded.data()),
                                static_cast<int>(padded.size()));
  if (n < 0) return std::nullopt;
  std::size_t pad = 0;
  while (pad < 2 && padded[padded.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

std::shared_ptr<EVP_PKEY> Ed25519FromSeed(std::string_view seed) {
  EVP_PKEY* key = EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(seed.data()), seed.size());
  if (key == nullptr) throw std::invalid_argument("not an ed25519 private key");
  return std::shared_ptr<EVP_PKEY>(key, EVP_PKEY_free);
}

}  // namespace

SigningKey DecodeSigningKey(const std::string& secret) {
  SigningKey key;
  if (secret.rfind("whsk_", 0) != 0) {
    key.hmac_key = DecodeSecret(secret);
    return key;
  }
  // whsk_: base64 of the 32-byte seed, or of seed + public key (64 bytes, libsodium's form).
  const auto bytes = Base64Decode(std::string_view(secret).substr(5));
  if (!bytes || (bytes->size() != kSeedBytes && bytes->size() != 2 * kSeedBytes)) {
    throw std::invalid_argument(
        "an ed25519 signing key must be \"whsk_\" followed by the base64 of its 32-byte seed "
        "(or 64 bytes: seed and public key)");
  }
  key.ed25519 = true;
  key.private_key = Ed25519FromSeed(std::string_view(*bytes).substr(0, kSeedBytes));
  return key;
}

std::string Sign(const SigningKey& key, const std::string& msg_id, long long timestamp_seconds,
                 const std::string& body) {
  if (!key.ed25519) return SignWithKey(key.hmac_key, msg_id, timestamp_seconds, body);
  std::string content;
  const std::string ts = std::to_string(timestamp_seconds);
  content.reserve(msg_id.size() + ts.size() + body.size() + 2);
  content.append(msg_id).append(1, '.').append(ts).append(1, '.').append(body);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  std::string sig(64, '\0');
  std::size_t len = sig.size();
  if (!ctx ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key.private_key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(content.data()), content.size()) != 1) {
    throw std::runtime_error("ed25519 signing failed");
  }
  sig.resize(len);
  return "v1a," + Base64Encode(sig);
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
