#include "kernels/key/digest.h"

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
  std::string raw = Sha256Raw(data);
  if (raw.empty()) return absl::InternalError("SHA-256 failed in OpenSSL");
  return raw;
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

}  // namespace kiln::key
