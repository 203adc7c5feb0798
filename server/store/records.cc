#include "server/store/records.h"

#include <openssl/evp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::store {
namespace {

// Fixed-width little-endian integers: the layout must not depend on the host.
void PutFixed(std::string& out, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetFixed(std::string_view in, size_t offset, size_t width) {
  uint64_t value = 0;
  for (size_t i = 0; i < width; ++i) {
    value |= uint64_t{static_cast<unsigned char>(in[offset + i])} << (8 * i);
  }
  return value;
}

}  // namespace

// Header layout (24 bytes, little-endian):
//   [0]      u8  record version (kAcRecordVersion)
//   [1]      u8  flags, 0 (reserved)
//   [2..4)   u16 header length: lets a later version append header fields old readers skip
//   [4..8)   u32 reserved, 0
//   [8..16)  u64 payload length: a truncated or padded value is detected, not parsed
//   [16..24) u64 write tick: identifies this write of the key (see FORMAT.md)
std::string EncodeAcRecord(uint64_t write_tick, std::string_view payload) {
  std::string out;
  out.reserve(kAcHeaderBytes + payload.size());
  PutFixed(out, kAcRecordVersion, 1);
  PutFixed(out, 0, 1);
  PutFixed(out, kAcHeaderBytes, 2);
  PutFixed(out, 0, 4);
  PutFixed(out, payload.size(), 8);
  PutFixed(out, write_tick, 8);
  out.append(payload);
  return out;
}

absl::StatusOr<AcRecord> DecodeAcRecord(std::string_view value) {
  if (value.size() < kAcHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("AC record of ", value.size(), " bytes is shorter than its header"));
  }
  const uint64_t version = GetFixed(value, 0, 1);
  if (version != kAcRecordVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("AC record version ", version, " is not ", kAcRecordVersion));
  }
  const uint64_t header_len = GetFixed(value, 2, 2);
  const uint64_t payload_len = GetFixed(value, 8, 8);
  if (header_len < kAcHeaderBytes || header_len > value.size() ||
      payload_len != value.size() - header_len) {
    return absl::DataLossError(absl::StrCat("AC record header (header ", header_len, ", payload ",
                                            payload_len, ") disagrees with its size ",
                                            value.size()));
  }
  AcRecord record;
  record.write_tick = GetFixed(value, 16, 8);
  record.payload = value.substr(header_len);
  return record;
}

std::string EncodeTick(uint64_t tick) {
  std::string out;
  PutFixed(out, tick, kTickBytes);
  return out;
}

std::optional<uint64_t> DecodeTick(std::string_view value) {
  if (value.size() != kTickBytes) return std::nullopt;
  return GetFixed(value, 0, kTickBytes);
}

}  // namespace kiln::store
