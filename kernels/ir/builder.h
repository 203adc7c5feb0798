// Builder: appends nodes to a graph and infers each node's type at once, so passes that
// rewrite graphs can read the types of what they just made.
// Thread-safety: one builder per graph, one thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"

namespace kiln::ir {

class Builder {
 public:
  // Starts a graph with the inputs of `like` (types and names).
  explicit Builder(const Graph& like);

  // Appends `op` and returns its value. The op's type rule must accept it: failures are
  // Internal (a pass built something ill-typed), never the client's fault.
  absl::StatusOr<ValueId> Add(const std::string& op, std::vector<ValueId> inputs,
                              AttrMap attrs = {}, const std::string& name = "");
  // Scalar constant of dtype t.
  absl::StatusOr<ValueId> Scalar(DType t, double v);
  const TensorType& Type(ValueId v) const { return graph_.TypeOf(v); }
  Graph& graph() { return graph_; }
  Graph Finish(std::vector<ValueId> outputs);

 private:
  Graph graph_;
};

}  // namespace kiln::ir
