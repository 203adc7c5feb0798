// Conversion of the compiler's CompileResult into the wire ActionResult the cache stores.
//
// Artifacts become (kind, SHA-256 digest, size) entries; their bytes are returned beside the
// result, in the same order, as the blobs ArtifactStore::PutResult expects.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "kernels/key/key.h"
#include "kernels/target.h"
#include "kiln/v1/service.pb.h"

namespace kiln::compile {

struct ConvertedResult {
  v1::ActionResult result;
  std::vector<std::string> blobs;  // artifact bytes, in result.artifacts() order
};

// Moves the artifact bytes out of `compiled`.
ConvertedResult ToActionResult(CompileResult compiled, const key::ActionKey& key,
                               const Target& target);

// The first artifact of `kind` in `result`, or nullptr.
const v1::Artifact* FindArtifact(const v1::ActionResult& result, v1::ArtifactKind kind);

}  // namespace kiln::compile
