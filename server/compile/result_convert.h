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

// The launch plan on the wire; CPU plans carry no launch geometry (`has_geometry` false).
void ToWirePlan(const LaunchPlan& plan, bool has_geometry, v1::LaunchPlan* wire);
// The reverse, for plans that cross a process boundary.
LaunchPlan FromWirePlan(const v1::LaunchPlan& wire);

void ToWireStats(const CompileStats& stats, v1::CompileStats* wire);
CompileStats FromWireStats(const v1::CompileStats& wire);

// The first artifact of `kind` in `result`, or nullptr.
const v1::Artifact* FindArtifact(const v1::ActionResult& result, v1::ArtifactKind kind);

}  // namespace kiln::compile
