// MakeTestPki: the certificates, signing keys and token file the trust test and the trust
// benchmark run kilnd with, made in `dir` by the real openssl command and `kilnd keygen`
// (MakeTestCertificates: the certificates alone, for TLS to Redis):
//
//   ca.crt ca.key            a self-signed CA
//   server.crt server.key    localhost / 127.0.0.1, signed by the CA (server and client auth)
//   client.crt client.key    a client certificate signed by the CA
//   sign.pem sign.pem.pub    kilnd's Ed25519 signing key pair
//   other.pem other.pem.pub  a second key pair, trusted by nobody
//   tokens                   reader (read), builder (compile) with the tokens below
//
// Thread-safety: runs commands; one caller at a time per folder.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/integration/kilnd_process.h"

namespace kiln::testing {

inline constexpr char kReaderToken[] = "reader-token-0123456789";
inline constexpr char kBuilderToken[] = "builder-token-0123456789";

// The certificates alone (ca.*, server.*, client.*), made with openssl only. Returns an empty
// string on success, else what failed.
inline std::string MakeTestCertificates(const std::string& dir) {
  const std::string d = dir + "/";
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  std::ofstream(d + "ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                              "extendedKeyUsage=serverAuth,clientAuth\n";
  const std::string certs =
      "cd " + d + " && openssl req -x509 " + ec +
      "-days 2 -subj /CN=ca -keyout ca.key "
      "-out ca.crt 2>/dev/null && for n in server client; do openssl req -new " +
      ec +
      "-subj /CN=$n -keyout $n.key -out $n.csr 2>/dev/null && openssl x509 -req -in $n.csr "
      "-CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile ext -out $n.crt 2>/dev/null "
      "|| exit 1; done";
  if (std::system(certs.c_str()) != 0) return "openssl could not make the test certificates";
  return "";
}

// Returns an empty string on success, else what failed.
inline std::string MakeTestPki(const std::string& dir) {
  const std::string d = dir + "/";
  if (std::string error = MakeTestCertificates(dir); !error.empty()) return error;
  for (const char* name : {"sign.pem", "other.pem"}) {
    const std::string keygen = KilndPath() + " keygen " + d + name + " >/dev/null";
    if (std::system(keygen.c_str()) != 0) return "kilnd keygen failed";
  }
  std::ofstream(d + "tokens") << "reader read " << kReaderToken << "\nbuilder compile "
                              << kBuilderToken << "\n";
  return "";
}

}  // namespace kiln::testing
