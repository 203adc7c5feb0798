// Shared skeleton of the rewriting passes: walks nodes in order, asks a rule for each, and
// copies the node (inputs remapped) when the rule leaves it alone.
// Thread-safety: one rewrite per thread.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ir/builder.h"

namespace kiln::passes {

// A rule gets the builder, the original node, and its inputs already mapped into the new
// graph. It returns the new value standing for the node, or nullopt to copy the node as is.
using RewriteRule = std::function<absl::StatusOr<std::optional<ir::ValueId>>(
    ir::Builder& b, const ir::Node& node, const std::vector<ir::ValueId>& inputs)>;

absl::StatusOr<ir::Graph> Rewrite(const ir::Graph& graph, const RewriteRule& rule);

}  // namespace kiln::passes
