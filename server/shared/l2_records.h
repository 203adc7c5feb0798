// The records kilnd keeps in the shared tier (Redis) and the one function that vets every
// value read back. FORMAT.md beside this file is the prose version; the two change together.
//
// Keys carry the format version (`kiln:v1:`): a kilnd with another format neither reads nor
// overwrites these. Per cache entry the keys share a hash tag, so in a Redis Cluster an
// action's record and lease live in one slot, and a blob's chunks live with its head.
//
// VerifyL2Record is the trust boundary: whoever can write Redis may deny service (delete or
// garble values) but must never choose what kilnd serves. Every value read from the shared
// tier goes through it before anything else looks at it; a value that fails is treated as
// absent and counted as a corruption. It checks lengths and SHA-256 digests, and, when the
// replicas share a secret (--shared-cache-secret-file), each action record's HMAC-SHA256: then
// a writer without the secret cannot make a record any replica serves. Blobs need no MAC: they
// are named by their SHA-256 and reached only through an authenticated record.
//
// Thread-safety: free functions without state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::shared {

inline constexpr char kKeyPrefix[] = "kiln:v1:";
inline constexpr uint8_t kL2RecordVersion = 1;

// kiln:v1:ac:{KEY}, kiln:v1:lease:{KEY}, kiln:v1:cas:{DIGEST}, kiln:v1:cas:{DIGEST}:N
std::string ActionKey(absl::string_view action_key);
std::string LeaseKey(absl::string_view action_key);
std::string BlobKey(absl::string_view hex_digest);
std::string ChunkKey(absl::string_view hex_digest, uint32_t index);

enum class L2RecordKind {
  kAction,  // `name` is the action key; the value an encoded ActionResult record
  kBlob,    // `name` is the blob's hex digest; the value the whole blob, reassembled
};

// The replicas' shared secrets for action-record MACs. `secrets[0]` authenticates what this
// replica writes; a record read must carry the MAC of one of them. With no secrets, records
// are written without a MAC and read on their digest alone.
struct L2Auth {
  std::vector<std::string> secrets;
  // Also accept records that carry no MAC (a record whose MAC is wrong is refused still): for
  // moving a running cluster onto a secret one replica at a time.
  bool accept_unauthenticated = false;
};

// The smallest secret kilnd accepts, in bytes.
inline constexpr size_t kMinL2SecretBytes = 16;

// Action record: header (version, flags, header length, payload length, SHA-256 over the
// action key and the payload, and with `auth` secrets an HMAC-SHA256 of that digest) + payload
// (a serialized kiln.v1.ActionResult).
std::string EncodeActionRecord(absl::string_view action_key, absl::string_view payload,
                               const L2Auth& auth = {});

// Blob head: small header (version, kind, chunk count, total size), then the bytes when the
// blob is stored inline. A chunked blob's head holds only the header.
struct BlobHead {
  uint32_t chunks = 0;  // 0: the bytes are inline
  uint64_t size = 0;
  absl::string_view inline_bytes;
};
std::string EncodeBlobHead(uint32_t chunks, uint64_t size, absl::string_view inline_bytes);
// DataLoss when the head is malformed (too short, unknown version or kind, inline length !=
// size).
absl::StatusOr<BlobHead> DecodeBlobHead(absl::string_view value);

// Vets a value read from the shared tier and returns the part the caller may use: the
// ActionResult payload of an action record, or the blob itself. DataLoss when it is damaged,
// truncated, stored under the wrong name, or its digest does not match, and for a record
// version this reader does not know (formats change under a new key prefix, so within
// kiln:v1: an unknown version can only be damage). With `auth` secrets, also DataLoss for an
// action record whose MAC is missing (unless accept_unauthenticated) or matches none of them.
absl::StatusOr<absl::string_view> VerifyL2Record(L2RecordKind kind, absl::string_view name,
                                                 absl::string_view value, const L2Auth& auth = {});

}  // namespace kiln::shared
