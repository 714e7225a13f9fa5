// Helpers of the webhook sink shared by its source files (not installed, not public).
#pragma once

#include <openssl/evp.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/webhook_url.h"

namespace outbox::relay::webhook_detail {

std::string Base64Encode(std::string_view bytes);
/// Standard alphabet; padding optional. nullopt for any other character.
/// The HMAC key of a "whsec_<base64>" secret; throws std::invalid_argument.
std::string DecodeSecret(const std::string& whsec_secret);
/// "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>".
std::string SignWithKey(const std::string& key, const std::string& msg_id,
                        long long timestamp_seconds, const std::string& body);

/// Whether `path` holds at least one certificate OpenSSL loads (what the sink's TLS client
/// will trust): a readable file of something else made every delivery fail verification.
bool HoldsCertificates(const std::string& path);

/// A webhook URL split (outbox_relay/webhook_url.h).
using ParsedUrl = WebhookUrl;
inline ParsedUrl ParseUrl(const std::string& url) { return ParseWebhookUrl(url); }

/// Retry-After as delta-seconds or an HTTP-date (IMF-fixdate, RFC 850, asctime), relative to
/// `now`. A date in the past gives 0. nullopt when it is neither.
std::optional<std::chrono::milliseconds> ParseRetryAfter(std::string_view value,
                                                         std::chrono::system_clock::time_point now);

/// At most `max_bytes` of `text` as printable, valid UTF-8 on one line (control characters
/// become spaces, invalid bytes '?', a cut never splits a character), trimmed.
std::string Snippet(std::string_view text, std::size_t max_bytes);

/// A key that signs deliveries: an HMAC-SHA256 key ("whsec_", "v1," signatures) or an ed25519
/// private key ("whsk_", "v1a," signatures, Standard Webhooks' asymmetric scheme).
struct SigningKey {
  bool ed25519 = false;
  std::shared_ptr<const EVP_MAC_CTX> hmac;  ///< whsec_: HMAC-SHA256 keyed with the decoded key
  std::shared_ptr<EVP_PKEY> private_key;    ///< whsk_
};
/// Throws std::invalid_argument (without echoing the secret) for anything else.
SigningKey DecodeSigningKey(const std::string& secret);
/// "v1,<base64 HMAC>" or "v1a,<base64 ed25519 signature>" of "id.timestamp.body".
std::string Sign(const SigningKey& key, const std::string& msg_id, long long timestamp_seconds,
                 const std::string& body);

/// Signs with a sink's keys for one worker thread, reusing an HMAC context per key (Sign
/// duplicates the shared keyed context on every call). Not for sharing between threads; keys
/// must outlive it.
class Signer {
 public:
  explicit Signer(const std::vector<SigningKey>& keys);
  /// The webhook-signature header: each key's signature as Sign gives it, space-separated.
  std::string Signatures(const std::string& msg_id, long long timestamp_seconds,
                         const std::string& body);

 private:
  const std::vector<SigningKey>& keys_;
  std::vector<std::unique_ptr<EVP_MAC_CTX, void (*)(EVP_MAC_CTX*)>> hmac_;  ///< null for ed25519
};

}  // namespace outbox::relay::webhook_detail
