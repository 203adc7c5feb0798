// The action key: a labelled, versioned record of everything that decides a compile's output,
// hashed with SHA-256. The graph enters as canonical bytes (CanonicalBytes below), never as
// serialized protobuf, which is not canonical across versions.
// Thread-safety: value types and pure functions.
#pragma once

#include <string>
#include <vector>

#include "kernels/ir/graph.h"
#include "kernels/key/digest.h"
#include "kernels/target.h"

namespace kiln::key {

// Bumped when the meaning of a key field changes.
inline constexpr int kKeyFormatVersion = 1;

struct ActionKey {
  // (label, value) pairs in a fixed order.
  std::vector<std::pair<std::string, std::string>> fields;
  std::string digest;  // lowercase hex SHA-256 over the fields

  // One "label: value" per line; the graph field is shown as its own digest.
  std::string DebugString() const;
};

// Canonical bytes of a graph: independent of node names, of the order in which independent
// nodes were added, and of attribute order. REQUIRES: VerifyAndInfer passed.
std::string CanonicalBytes(const ir::Graph& graph);

ActionKey ComputeKey(const ir::Graph& graph, const Target& target, const CompileOptions& options,
                     const std::string& toolchain_fingerprint);

}  // namespace kiln::key
