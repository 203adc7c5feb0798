// The door from the wire: kiln.v1 protobuf messages -> ir::Graph / Target / CompileOptions.
// The only place in kernels/ that sees protobuf types. Everything is validated here: a bad
// graph is InvalidArgument (ResourceExhausted for limits) naming the node, the op and the rule.
// Thread-safety: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"
#include "kernels/ir/op_registry.h"
#include "kernels/target.h"
#include "kiln/v1/service.pb.h"

namespace kiln::ir {

absl::StatusOr<Graph> DecodeGraph(const v1::Graph& wire, const Limits& limits = {});
// Checks the ISA name / sm value is one kiln knows.
absl::StatusOr<Target> DecodeTarget(const v1::Target& wire);
CompileOptions DecodeOptions(const v1::CompileOptions& wire);

// The reverse direction, for clients and tests written in C++.
v1::Graph EncodeGraph(const Graph& graph);
v1::Target EncodeTarget(const Target& target);

}  // namespace kiln::ir
