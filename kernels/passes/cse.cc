// EliminateCommonSubexpressions: nodes with the same op, inputs and attributes are computed
// once. Nodes are keyed after their inputs were mapped, so chains of duplicates collapse in
// one pass.
#include <cstring>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/passes/passes.h"
#include "kernels/passes/rewrite.h"

namespace kiln::passes {
namespace {

// Every attribute bit for bit: doubles by their bit patterns and constants in full (the
// printed graph rounds numbers and elides long constants, so it cannot tell them apart).
std::string ExactAttrKey(const ir::AttrMap& attrs) {
  std::string key;
  auto bits = [&key](double d) {
    uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    absl::StrAppend(&key, u, ",");
  };
  for (const auto& [name, value] : attrs) {
    absl::StrAppend(&key, name, "#", value.index(), "=");
    if (auto* p = std::get_if<int64_t>(&value))
      absl::StrAppend(&key, *p);
    else if (auto* p = std::get_if<double>(&value))
      bits(*p);
    else if (auto* p = std::get_if<std::string>(&value))
      absl::StrAppend(&key, p->size(), ":", *p);
    else if (auto* p = std::get_if<bool>(&value))
      absl::StrAppend(&key, *p);
    else if (auto* p = std::get_if<ir::DType>(&value))
      absl::StrAppend(&key, static_cast<int>(*p));
    else if (auto* p = std::get_if<ir::IntList>(&value))
      absl::StrAppend(&key, absl::StrJoin(*p, ","));
    else if (auto* p = std::get_if<ir::FloatList>(&value))
      for (double d : *p) bits(d);
    else if (auto* p = std::get_if<ir::Constant>(&value)) {
      absl::StrAppend(&key, static_cast<int>(p->dtype), "[", absl::StrJoin(p->shape, ","), "]f");
      for (double d : p->f) bits(d);
      absl::StrAppend(&key, "i", absl::StrJoin(p->i, ","));
    }
    absl::StrAppend(&key, ";");
  }
  return key;
}

}  // namespace

absl::StatusOr<ir::Graph> EliminateCommonSubexpressions(const ir::Graph& graph) {
  using Key = std::tuple<std::string, std::vector<ir::ValueId>, std::string>;
  std::map<Key, ir::ValueId> seen;
  return Rewrite(
      graph,
      [&seen](ir::Builder& b, const ir::Node& n,
              const std::vector<ir::ValueId>& in) -> absl::StatusOr<std::optional<ir::ValueId>> {
        Key key{n.op, in, ExactAttrKey(n.attrs)};
        auto it = seen.find(key);
        if (it != seen.end()) return it->second;
        auto v = b.Add(n.op, in, n.attrs, n.name);
        if (!v.ok()) return v.status();
        seen[key] = *v;
        return *v;
      });
}

}  // namespace kiln::passes
