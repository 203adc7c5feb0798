// The on-disk records of RocksDbStore: column family names, the AC record header, the recency
// record and the digest helpers that turn the wire's hex digests into CAS keys. FORMAT.md beside
// this file is the prose version; the two change together.
//
// Thread-safety: free functions without state; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/key/digest.h"
#include "kiln/v1/service.pb.h"

namespace kiln::store {

// Column families carry their format version in the name: an incompatible change of a layout
// gets a new family (e.g. "ac.v2") instead of a reader that guesses which layout a value has.
inline constexpr char kCasColumnFamily[] = "cas.v1";  // raw digest -> blob bytes
inline constexpr char kAcColumnFamily[] = "ac.v1";    // action key -> AC record
inline constexpr char kLruColumnFamily[] = "lru.v1";  // action key -> last-access tick
// hex graph digest + hex action key -> empty: the keys compiled for a graph (kiln explain).
inline constexpr char kGraphColumnFamily[] = "graphs.v1";

using key::kDigestBytes;
inline constexpr uint8_t kAcRecordVersion = 1;
inline constexpr size_t kAcHeaderBytes = 24;
inline constexpr size_t kTickBytes = 8;

// Digests (kernels/key/digest.h): CAS keys are the raw 32 bytes of a wire digest (64
// lowercase hex digits; anything else, uppercase included, is InvalidArgument, so each blob
// has one spelling and one key).
using key::DigestFromHex;
using key::DigestToHex;
using key::Sha256;

// A decoded AC record. `payload` points into the value it was decoded from.
struct AcRecord {
  uint64_t write_tick = 0;
  std::string_view payload;  // a serialized kiln.v1.ActionResult
};

// Header (version, header length, payload length, write tick) followed by the payload.
std::string EncodeAcRecord(uint64_t write_tick, std::string_view payload);

// DataLoss when the value is truncated, padded or its header is malformed (the record is
// damaged); FailedPrecondition when the record version is one this reader does not know.
// Either way the caller treats the record as absent.
absl::StatusOr<AcRecord> DecodeAcRecord(std::string_view value);

// The graphs.v1 key of an entry: the hex digest of the graph its key record names (the field
// labelled "graph"), then the hex action key. Empty when the record names no graph.
std::string GraphIndexKey(const v1::ActionResult& result, const std::string& action_key);

// The lru.v1 value: a fixed 8-byte little-endian tick.
std::string EncodeTick(uint64_t tick);
std::optional<uint64_t> DecodeTick(std::string_view value);

}  // namespace kiln::store
