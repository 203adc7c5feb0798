// The compiler's graph IR: an SSA list of single-output nodes over typed tensors.
//
// Graph inputs are values 0..num_inputs()-1; node i defines value num_inputs()+i. A node only
// uses values defined before it. Every node carries its inferred output type once the graph
// has been through ir::Verify / ir::DecodeGraph.
// Thread-safety: a plain value type; const access from many threads is safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "kernels/ir/dtype.h"

namespace kiln::ir {

using ValueId = int32_t;
using Shape = std::vector<int64_t>;

struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;
  // Graph inputs only, in elements; empty means row-major contiguous.
  std::vector<int64_t> strides;
  // Graph inputs only: per dimension, the id of the symbol it stands for (Graph::symbols),
  // or -1 for a static dimension; empty when every dimension is static. The matching entry
  // of `shape` holds the symbol's current sample value (kernels/ir/symbols.h).
  std::vector<int32_t> dim_symbols;

  int64_t NumElements() const;
  int64_t Rank() const { return static_cast<int64_t>(shape.size()); }
  bool operator==(const TensorType&) const = default;
  std::string ToString() const;  // "f32[4,8]"
};

// A small constant: a scalar when shape is empty. Values are held as double (float dtypes)
// or int64 (integer and bool dtypes).
struct Constant {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<double> f;
  std::vector<int64_t> i;
  bool operator==(const Constant&) const = default;
  int64_t NumElements() const;
  double AsDouble(int64_t k) const { return f.empty() ? static_cast<double>(i[k]) : f[k]; }
};

using IntList = std::vector<int64_t>;
using FloatList = std::vector<double>;
using AttrValue =
    std::variant<int64_t, double, std::string, bool, DType, IntList, FloatList, Constant>;
// Ordered by name, so iteration order never depends on how a client built the map.
using AttrMap = std::map<std::string, AttrValue>;

struct Node {
  std::string op;
  std::vector<ValueId> inputs;
  AttrMap attrs;
  std::string name;  // for messages only
  TensorType type;   // inferred output type

  // Typed attribute access; the registry has already checked kinds at the door.
  bool Has(const std::string& key) const { return attrs.count(key) != 0; }
  int64_t Int(const std::string& key, int64_t dflt = 0) const;
  double Float(const std::string& key, double dflt = 0) const;  // accepts int attrs too
  bool Bool(const std::string& key, bool dflt = false) const;
  std::string Str(const std::string& key, const std::string& dflt = "") const;
  IntList Ints(const std::string& key, const IntList& dflt = {}) const;
  DType Dtype(const std::string& key, DType dflt) const;
  const Constant* Tensor(const std::string& key) const;
};

struct Graph {
  std::vector<TensorType> inputs;
  std::vector<std::string> input_names;  // same length as inputs
  std::vector<Node> nodes;
  std::vector<ValueId> outputs;
  // Names of the symbolic sizes, by id, numbered in order of first appearance over the
  // inputs' dimensions. Empty for a graph of static shapes.
  std::vector<std::string> symbols;

  bool is_symbolic() const { return !symbols.empty(); }
  int32_t num_inputs() const { return static_cast<int32_t>(inputs.size()); }
  int32_t num_values() const { return num_inputs() + static_cast<int32_t>(nodes.size()); }
  bool IsInput(ValueId v) const { return v < num_inputs(); }
  const Node& NodeOf(ValueId v) const { return nodes[v - num_inputs()]; }
  Node& NodeOf(ValueId v) { return nodes[v - num_inputs()]; }
  const TensorType& TypeOf(ValueId v) const { return IsInput(v) ? inputs[v] : NodeOf(v).type; }
  // Appends a node (type left for inference) and returns its value id.
  ValueId Add(std::string op, std::vector<ValueId> inputs, AttrMap attrs = {});
  // "node 7 (add 'h1')" or "input 0 ('x')": how messages name a value.
  std::string Describe(ValueId v) const;
  // One line per node; for traces and golden files. Names are left out.
  std::string ToString() const;
};

}  // namespace kiln::ir
