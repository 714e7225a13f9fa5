// The Standard Webhooks signature computed straight from the spec with OpenSSL, so the tests
// check the sink against something other than its own code.
#pragma once

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace outbox::webhook_test {

/// "v1," + base64(HMAC-SHA256(base64decode(secret without "whsec_"), id "." ts "." body)).
inline std::string SpecSignature(const std::string& whsec_secret, const std::string& msg_id,
                                 const std::string& timestamp, const std::string& body) {
  const std::string prefix = "whsec_";
  if (whsec_secret.rfind(prefix, 0) != 0) throw std::invalid_argument("no whsec_ prefix");
  const std::string b64 = whsec_secret.substr(prefix.size());
  std::vector<unsigned char> key(b64.size() + 3);
  int key_len = EVP_DecodeBlock(key.data(), reinterpret_cast<const unsigned char*>(b64.data()),
                                static_cast<int>(b64.size()));
  if (key_len < 0) throw std::invalid_argument("secret is not base64");
  // EVP_DecodeBlock counts the zero bytes that padding stands for.
  for (auto it = b64.rbegin(); it != b64.rend() && *it == '='; ++it) --key_len;

  const std::string content = msg_id + "." + timestamp + "." + body;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), key_len, reinterpret_cast<const unsigned char*>(content.data()),
       content.size(), mac, &mac_len);
  std::vector<unsigned char> encoded(4 * ((mac_len + 2) / 3) + 1);
  const int n = EVP_EncodeBlock(encoded.data(), mac, static_cast<int>(mac_len));
  return "v1," +
         std::string(reinterpret_cast<const char*>(encoded.data()), static_cast<std::size_t>(n));
}

/// The entries of a webhook-signature header.
inline std::set<std::string> SignatureEntries(const std::string& header) {
  std::set<std::string> out;
  std::size_t start = 0;
  while (start <= header.size()) {
    const std::size_t space = header.find(' ', start);
    const std::string entry =
        header.substr(start, space == std::string::npos ? std::string::npos : space - start);
    if (!entry.empty()) out.insert(entry);
    if (space == std::string::npos) break;
    start = space + 1;
  }
  return out;
}

}  // namespace outbox::webhook_test
