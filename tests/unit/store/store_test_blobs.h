// Test data for the store tests: deterministic blobs and the ActionResults that name them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/v1/service.pb.h"
#include "server/store/records.h"

namespace kiln::store {

// Deterministic bytes, distinct per seed.
inline std::string MakeBlob(int seed, size_t size) {
  std::string blob(size, '\0');
  uint32_t x = 2654435761u * static_cast<uint32_t>(seed + 1);
  for (char& c : blob) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return blob;
}

inline std::string HexDigest(const std::string& blob) { return DigestToHex(*Sha256(blob)); }

// A result with one shared-object artifact per blob.
inline v1::ActionResult MakeResult(const std::vector<std::string>& blobs,
                                   const std::string& log = "") {
  v1::ActionResult result;
  for (const std::string& blob : blobs) {
    v1::Artifact* artifact = result.add_artifacts();
    artifact->set_kind(v1::SHARED_OBJECT);
    artifact->set_digest(HexDigest(blob));
    artifact->set_size(static_cast<int64_t>(blob.size()));
  }
  result.set_compile_log(log);
  return result;
}

}  // namespace kiln::store
