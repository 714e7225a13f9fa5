#include "tls_files.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>

namespace outbox::bench {
// Named, so that its helpers do not meet those of the files built beside it in one unity
// translation unit (CMakeLists.txt).
namespace tls_files {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("the benchmark's certificate: ") + what);
}

void AddExtension(X509* cert, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, decltype(&X509_EXTENSION_free)> ext(
      X509V3_EXT_conf_nid(nullptr, &ctx, nid, value), X509_EXTENSION_free);
  Check(ext && X509_add_ext(cert, ext.get(), -1) == 1, value);
}

template <typename Write>
void WritePem(const std::string& path, Write write) {
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "w"), std::fclose);
  Check(f && write(f.get()) == 1, path.c_str());
}

}  // namespace
}  // namespace tls_files

TlsFiles MakeSelfSignedCertificate(const std::string& dir) {
  using namespace tls_files;
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  Check(key != nullptr, "EC key generation");
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  Check(cert != nullptr && X509_set_version(cert.get(), 2) == 1, "X509_new");
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400);
  Check(X509_set_pubkey(cert.get(), key.get()) == 1, "X509_set_pubkey");
  X509_NAME* name = X509_get_subject_name(cert.get());
  Check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>("outbox-bench"), -1, -1,
                                   0) == 1,
        "subject");
  Check(X509_set_issuer_name(cert.get(), name) == 1, "issuer");
  AddExtension(cert.get(), NID_basic_constraints, "critical,CA:TRUE");
  AddExtension(cert.get(), NID_subject_alt_name, "IP:127.0.0.1");
  Check(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0, "X509_sign");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TlsFiles files{dir + "/bench.crt", dir + "/bench.key"};
  WritePem(files.cert_path, [&](FILE* f) { return PEM_write_X509(f, cert.get()); });
  WritePem(files.key_path, [&](FILE* f) {
    return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  return files;
}

}  // namespace outbox::bench
