#include "server/shared/l2_records.h"

#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/key/digest.h"
#include "openssl/crypto.h"
#include "openssl/evp.h"
#include "openssl/hmac.h"

namespace kiln::shared {
namespace {

// The records are little-endian; kilnd runs on little-endian hosts only (x86-64, aarch64).
static_assert(std::endian::native == std::endian::little);

template <typename T>
void Append(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

template <typename T>
T Read(absl::string_view in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

// Action record header, 48 bytes, or 80 with a MAC:
//   [0]      u8   record version
//   [1]      u8   flags: bit 0, the header carries a MAC
//   [2..4)   u16  header length (a later version may append fields old readers skip)
//   [4..8)   u32  reserved, 0
//   [8..16)  u64  payload length
//   [16..48) 32 B SHA-256 of (action key ‖ payload): binds the record to its key
//   [48..80) 32 B HMAC-SHA256(secret, kMacContext ‖ the digest above), with flag bit 0
constexpr size_t kActionHeaderBytes = 48;
constexpr size_t kMacBytes = 32;
constexpr uint8_t kFlagMac = 1;
// Domain separation: these MACs can never be mistaken for another use of the same secret.
constexpr absl::string_view kMacContext = "kiln:v1:action-record-mac\n";
// Blob head header, 16 bytes:
//   [0]      u8   record version
//   [1]      u8   kind: 0 inline, 1 chunked
//   [2..4)   u16  reserved, 0
//   [4..8)   u32  chunk count (0 when inline)
//   [8..16)  u64  blob size
constexpr size_t kBlobHeaderBytes = 16;

std::string Tagged(absl::string_view kind, absl::string_view id) {
  return absl::StrCat(kKeyPrefix, kind, ":{", id, "}");
}

std::string BoundDigest(absl::string_view action_key, absl::string_view payload) {
  std::string message;
  message.reserve(action_key.size() + payload.size());
  absl::StrAppend(&message, action_key, payload);
  return key::Sha256(message).value_or(std::string());
}

// HMAC-SHA256 of the record's digest under `secret`; the digest already binds key and payload.
std::string RecordMac(absl::string_view secret, absl::string_view digest) {
  const std::string message = absl::StrCat(kMacContext, digest);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &mac_len) == nullptr ||
      mac_len != kMacBytes) {
    return std::string();  // never matches a stored MAC: the record is refused, not trusted
  }
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

// Whether `mac` is the MAC of `digest` under one of the secrets, compared in constant time.
bool MacMatches(const L2Auth& auth, absl::string_view digest, absl::string_view mac) {
  bool match = false;
  for (const std::string& secret : auth.secrets) {
    const std::string want = RecordMac(secret, digest);
    match |= want.size() == mac.size() && CRYPTO_memcmp(want.data(), mac.data(), mac.size()) == 0;
  }
  return match;
}

}  // namespace

std::string ActionKey(absl::string_view action_key) { return Tagged("ac", action_key); }
std::string LeaseKey(absl::string_view action_key) { return Tagged("lease", action_key); }
std::string BlobKey(absl::string_view hex_digest) { return Tagged("cas", hex_digest); }
std::string ChunkKey(absl::string_view hex_digest, uint32_t index) {
  return absl::StrCat(Tagged("cas", hex_digest), ":", index);
}

std::string EncodeActionRecord(absl::string_view action_key, absl::string_view payload,
                               const L2Auth& auth) {
  const bool mac = !auth.secrets.empty();
  const size_t header = kActionHeaderBytes + (mac ? kMacBytes : 0);
  const std::string digest = BoundDigest(action_key, payload);
  std::string out;
  out.reserve(header + payload.size());
  Append<uint8_t>(out, kL2RecordVersion);
  Append<uint8_t>(out, mac ? kFlagMac : 0);
  Append<uint16_t>(out, static_cast<uint16_t>(header));
  Append<uint32_t>(out, 0);
  Append<uint64_t>(out, payload.size());
  out.append(digest);
  if (mac) out.append(RecordMac(auth.secrets.front(), digest));
  out.append(payload.data(), payload.size());
  return out;
}

std::string EncodeBlobHead(uint32_t chunks, uint64_t size, absl::string_view inline_bytes) {
  std::string out;
  out.reserve(kBlobHeaderBytes + inline_bytes.size());
  Append<uint8_t>(out, kL2RecordVersion);
  Append<uint8_t>(out, chunks == 0 ? 0 : 1);
  Append<uint16_t>(out, 0);
  Append<uint32_t>(out, chunks);
  Append<uint64_t>(out, size);
  out.append(inline_bytes.data(), inline_bytes.size());
  return out;
}

absl::StatusOr<BlobHead> DecodeBlobHead(absl::string_view value) {
  if (value.size() < kBlobHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("blob head of ", value.size(), " bytes is shorter than its header"));
  }
  if (Read<uint8_t>(value, 0) != kL2RecordVersion) {
    return absl::DataLossError(
        absl::StrCat("blob record version ", Read<uint8_t>(value, 0), " is unknown"));
  }
  BlobHead head;
  const uint8_t kind = Read<uint8_t>(value, 1);
  head.chunks = Read<uint32_t>(value, 4);
  head.size = Read<uint64_t>(value, 8);
  if (kind > 1 || (kind == 0) != (head.chunks == 0)) {
    return absl::DataLossError("blob head has a malformed kind");
  }
  head.inline_bytes = value.substr(kBlobHeaderBytes);
  if (kind == 0 && head.inline_bytes.size() != head.size) {
    return absl::DataLossError(absl::StrCat("inline blob holds ", head.inline_bytes.size(),
                                            " bytes, its header says ", head.size));
  }
  if (kind == 1 && !head.inline_bytes.empty()) {
    return absl::DataLossError("chunked blob head carries bytes");
  }
  return head;
}

absl::StatusOr<absl::string_view> VerifyL2Record(L2RecordKind kind, absl::string_view name,
                                                 absl::string_view value, const L2Auth& auth) {
  if (kind == L2RecordKind::kBlob) {
    if (key::Sha256Hex(std::string_view(value.data(), value.size())) != name) {
      return absl::DataLossError(absl::StrCat("blob ", name.substr(0, 12), " (", value.size(),
                                              " bytes) does not hash to its digest"));
    }
    return value;
  }
  if (value.size() < kActionHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("action record of ", value.size(), " bytes is shorter than its header"));
  }
  if (Read<uint8_t>(value, 0) != kL2RecordVersion) {
    return absl::DataLossError(
        absl::StrCat("action record version ", Read<uint8_t>(value, 0), " is unknown"));
  }
  const uint64_t header_len = Read<uint16_t>(value, 2);
  const uint64_t payload_len = Read<uint64_t>(value, 8);
  if (header_len < kActionHeaderBytes || header_len > value.size() ||
      payload_len != value.size() - header_len) {
    return absl::DataLossError(absl::StrCat("action record lengths disagree (header ", header_len,
                                            ", payload ", payload_len, ", value ", value.size(),
                                            ")"));
  }
  const absl::string_view payload = value.substr(header_len);
  const absl::string_view digest = value.substr(16, 32);
  if (digest != BoundDigest(name, payload)) {
    return absl::DataLossError(
        absl::StrCat("action record for ", name.substr(0, 12), " does not match its digest"));
  }
  if (auth.secrets.empty()) return payload;
  const bool has_mac =
      (Read<uint8_t>(value, 1) & kFlagMac) != 0 && header_len >= kActionHeaderBytes + kMacBytes;
  if (!has_mac) {
    if (auth.accept_unauthenticated) return payload;
    return absl::DataLossError(absl::StrCat(
        "action record for ", name.substr(0, 12),
        " carries no MAC: written by a replica without the cluster's secret, or forged"));
  }
  if (!MacMatches(auth, digest, value.substr(kActionHeaderBytes, kMacBytes))) {
    return absl::DataLossError(
        absl::StrCat("action record for ", name.substr(0, 12),
                     " fails its MAC: written with another secret, or forged"));
  }
  return payload;
}

}  // namespace kiln::shared
