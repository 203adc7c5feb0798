// WireGraph: builds kiln.v1.Graph messages by hand for tests and benchmarks, the way a client
// would, including malformed ones (it checks nothing).
// Thread-safety: a plain value type.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/v1/service.pb.h"

namespace kiln::testing {

class WireGraph {
 public:
  // Inputs are values 0..k-1, so add them all before the first node.
  int Input(const std::string& name, v1::DType dtype, std::vector<int64_t> shape) {
    v1::Input* in = graph_.add_inputs();
    in->set_name(name);
    in->mutable_type()->set_dtype(dtype);
    for (int64_t d : shape) in->mutable_type()->add_shape(d);
    return graph_.inputs_size() - 1;
  }

  int Op(const std::string& op, std::vector<int> inputs,
         std::map<std::string, v1::AttrValue> attrs = {}, const std::string& name = "") {
    v1::Node* node = graph_.add_nodes();
    node->set_op(op);
    for (int v : inputs) node->add_inputs(v);
    for (auto& [k, v] : attrs) (*node->mutable_attrs())[k] = v;
    node->set_name(name.empty() ? op + std::to_string(graph_.nodes_size() - 1) : name);
    return graph_.inputs_size() + graph_.nodes_size() - 1;
  }

  // A scalar constant of dtype f32.
  int Scalar(double value) {
    v1::AttrValue attr;
    v1::TensorValue* t = attr.mutable_tensor();
    t->set_dtype(v1::F32);
    t->add_float_values(value);
    return Op("constant", {}, {{"value", attr}});
  }

  void Output(int value) { graph_.add_outputs(value); }
  const v1::Graph& graph() const { return graph_; }
  v1::Graph* mutable_graph() { return &graph_; }

  static v1::AttrValue Ints(std::vector<int64_t> values) {
    v1::AttrValue a;
    for (int64_t v : values) a.mutable_ints()->add_values(v);
    return a;
  }
  static v1::AttrValue Int(int64_t v) {
    v1::AttrValue a;
    a.set_i(v);
    return a;
  }
  static v1::AttrValue Str(const std::string& s) {
    v1::AttrValue a;
    a.set_s(s);
    return a;
  }

 private:
  v1::Graph graph_;
};

// x*sin(x) + cos(x)^2 - sin(x) + c on f32[n]. Every element of the result depends on its own
// input element through every op (swapping sin and cos, flipping an operator or reading a
// neighbour all change it); SinCosReference computes it on the host. Distinct `c` gives
// distinct keys.
inline v1::Graph SinCosGraph(int64_t n, double c = 0.0) {
  WireGraph g;
  const int x = g.Input("x", v1::F32, {n});
  const int s = g.Op("sin", {x});
  const int co = g.Op("cos", {x});
  const int xs = g.Op("mul", {x, s});
  const int c2 = g.Op("mul", {co, co});
  int y = g.Op("sub", {g.Op("add", {xs, c2}), s});
  if (c != 0.0) y = g.Op("add", {y, g.Scalar(c)});
  g.Output(y);
  return g.graph();
}

// SinCosGraph's value at one element, in double.
inline double SinCosReference(float x, double c = 0.0) {
  const double s = std::sin(static_cast<double>(x)), co = std::cos(static_cast<double>(x));
  return x * s + co * co - s + static_cast<float>(c);
}

inline v1::Target CpuTarget(const std::string& isa = "x86-64-v2") {
  v1::Target t;
  t.mutable_cpu()->set_isa(isa);
  return t;
}

inline v1::CompileRequest MakeRequest(const v1::Graph& graph,
                                      const v1::Target& target = CpuTarget(),
                                      v1::Priority priority = v1::INTERACTIVE) {
  v1::CompileRequest r;
  *r.mutable_graph() = graph;
  *r.mutable_target() = target;
  r.set_priority(priority);
  return r;
}

}  // namespace kiln::testing
