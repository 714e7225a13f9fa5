// Standard Webhooks signing: HMAC-SHA256 over "id.timestamp.body", base64, "v1," prefix.
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

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

namespace {

using MacCtx = std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)>;

// An HMAC-SHA256 context keyed once, so that no signature fetches HMAC and SHA-256 from the
// provider and hashes the key again, which is what the one-shot HMAC() does on every call
// (OpenSSL 3). Only ever read after this: EVP_MAC_CTX_dup leaves its source as it is, so
// threads share it; each worker's Signer duplicates it once and resets its copy per message.
std::shared_ptr<const EVP_MAC_CTX> KeyedHmac(const std::string& key) {
  std::unique_ptr<EVP_MAC, decltype(&EVP_MAC_free)> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr),
                                                        EVP_MAC_free);
  if (!mac) throw std::runtime_error("HMAC is not available from OpenSSL");
  MacCtx ctx(EVP_MAC_CTX_new(mac.get()), EVP_MAC_CTX_free);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (!ctx || EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key.data()),
                           key.size(), params) != 1) {
    throw std::runtime_error("HMAC-SHA256 key setup failed");
  }
  return std::shared_ptr<const EVP_MAC_CTX>(ctx.release(), EVP_MAC_CTX_free);
}

bool MacUpdate(EVP_MAC_CTX* ctx, std::string_view bytes) {
  return EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) ==
         1;
}

// Signs with ctx, which is keyed and fresh (duplicated from a keyed one, or reset).
std::string SignHmacWith(EVP_MAC_CTX* ctx, const std::string& msg_id, long long timestamp_seconds,
                         const std::string& body) {
  const std::string ts = std::to_string(timestamp_seconds);
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  std::size_t mac_len = 0;
  if (!ctx || !MacUpdate(ctx, msg_id) || !MacUpdate(ctx, ".") || !MacUpdate(ctx, ts) ||
      !MacUpdate(ctx, ".") || !MacUpdate(ctx, body) ||
      EVP_MAC_final(ctx, mac.data(), &mac_len, mac.size()) != 1) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return "v1," + Base64Encode(std::string_view(reinterpret_cast<const char*>(mac.data()), mac_len));
}

std::string SignHmac(const EVP_MAC_CTX& keyed, const std::string& msg_id,
                     long long timestamp_seconds, const std::string& body) {
  MacCtx ctx(EVP_MAC_CTX_dup(&keyed), EVP_MAC_CTX_free);
  return SignHmacWith(ctx.get(), msg_id, timestamp_seconds, body);
}

}  // namespace

std::string SignWithKey(const std::string& key, const std::string& msg_id,
                        long long timestamp_seconds, const std::string& body) {
  return SignHmac(*KeyedHmac(key), msg_id, timestamp_seconds, body);
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
    key.hmac = KeyedHmac(DecodeSecret(secret));
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
  if (!key.ed25519) return SignHmac(*key.hmac, msg_id, timestamp_seconds, body);
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

Signer::Signer(const std::vector<SigningKey>& keys) : keys_(keys) {
  for (const auto& key : keys_) {
    hmac_.emplace_back(key.ed25519 ? nullptr : EVP_MAC_CTX_dup(key.hmac.get()), EVP_MAC_CTX_free);
    if (!key.ed25519 && !hmac_.back()) throw std::runtime_error("HMAC-SHA256 context copy failed");
  }
}

std::string Signer::Signatures(const std::string& msg_id, long long timestamp_seconds,
                               const std::string& body) {
  std::string out;
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    if (!out.empty()) out += ' ';
    if (keys_[i].ed25519) {
      out += Sign(keys_[i], msg_id, timestamp_seconds, body);
      continue;
    }
    // A null key restarts HMAC with the key already set, touching nothing shared with another
    // thread (EVP_MAC_CTX_dup bumps reference counts every worker touches).
    EVP_MAC_CTX* ctx = hmac_[i].get();
    if (EVP_MAC_init(ctx, nullptr, 0, nullptr) != 1) throw std::runtime_error("HMAC-SHA256 failed");
    out += SignHmacWith(ctx, msg_id, timestamp_seconds, body);
  }
  return out;
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
