#include "kernels/key/sha256.h"

#include <openssl/evp.h>

namespace kiln::key {

std::string Sha256Raw(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &md_len, EVP_sha256(), nullptr) != 1 ||
      md_len != kDigestBytes)
    return std::string();
  return std::string(reinterpret_cast<const char*>(md), md_len);
}

std::string Sha256Hex(std::string_view data) { return DigestToHex(Sha256Raw(data)); }

bool IsDigest(std::string_view digest) {
  if (digest.size() != 2 * kDigestBytes) return false;
  for (char c : digest)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string DigestToHex(std::string_view raw) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * raw.size());
  for (char c : raw) {
    const auto byte = static_cast<unsigned char>(c);
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xf]);
  }
  return hex;
}

}  // namespace kiln::key
