#include "kernels/key/digest.h"

#include <openssl/evp.h>

#include "absl/strings/str_cat.h"

namespace kiln::key {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

absl::StatusOr<std::string> Sha256(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &md_len, EVP_sha256(), nullptr) != 1 ||
      md_len != kDigestBytes)
    return absl::InternalError("SHA-256 failed in OpenSSL");
  return std::string(reinterpret_cast<const char*>(md), md_len);
}

std::string Sha256Hex(std::string_view data) {
  auto raw = Sha256(data);
  return raw.ok() ? DigestToHex(*raw) : std::string();
}

bool IsDigest(std::string_view digest) {
  if (digest.size() != 2 * kDigestBytes) return false;
  for (char c : digest)
    if (HexValue(c) < 0) return false;
  return true;
}

absl::StatusOr<std::string> DigestFromHex(std::string_view hex) {
  if (!IsDigest(hex))
    return absl::InvalidArgumentError(absl::StrCat("digest must be 64 lowercase hex digits, got '",
                                                   std::string(hex.substr(0, 80)), "'"));
  std::string raw(kDigestBytes, '\0');
  for (size_t i = 0; i < kDigestBytes; ++i)
    raw[i] = static_cast<char>(HexValue(hex[2 * i]) * 16 + HexValue(hex[2 * i + 1]));
  return raw;
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
