// A self-signed certificate for 127.0.0.1, made in-process (the 16-core machine has no openssl
// command), for the HTTPS receiver and the clients that trust it.
#pragma once

#include <string>

namespace outbox::bench {

struct TlsFiles {
  std::string cert_path;  ///< PEM; also the CA the clients trust (it signs itself)
  std::string key_path;   ///< PEM, unencrypted
};

/// Writes `dir`/bench.crt and `dir`/bench.key: a P-256 key and a certificate for IP
/// 127.0.0.1, valid for a day. Throws std::runtime_error when OpenSSL or the files fail.
TlsFiles MakeSelfSignedCertificate(const std::string& dir);

}  // namespace outbox::bench
