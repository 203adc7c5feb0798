#include "kernels/schedule/schedule.h"

#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/ir/op_registry.h"
#include "kernels/ir/symbols.h"
#include "kernels/lower/lower.h"
#include "kernels/schedule/legality.h"
#include "kernels/schedule/policy.h"
#include "kernels/util/status_macros.h"

namespace kiln::schedule {
namespace {

constexpr int64_t kAlign = 64;
// Reshape-like views (and concats) one kernel may nest along a path of inlined values.
constexpr int64_t kMaxIndexNesting = 6;

int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

void CollectLoads(const lower::ExprPtr& root, std::vector<int>* out) {
  std::set<const lower::Expr*> seen;
  std::function<void(const lower::Expr*)> walk = [&](const lower::Expr* e) {
    if (!seen.insert(e).second) return;
    if (e->kind == lower::Expr::Kind::kLoad || e->kind == lower::Expr::Kind::kGather)
      out->push_back(e->buffer);
    for (const auto& c : e->args) walk(c.get());
  };
  walk(root.get());
}

Buffer MakeBuffer(Buffer::Role role, int index, ir::DType dtype, const ir::Shape& shape,
                  std::vector<int64_t> strides) {
  Buffer b;
  b.role = role;
  b.index = index;
  b.dtype = dtype;
  b.shape = shape;
  b.strides = std::move(strides);
  return b;
}

std::string ShapeStr(const ir::Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

class Scheduler {
 public:
  Scheduler(const ir::Graph& g, const ScheduleOptions& options) : g_(g), options_(options) {}

  absl::StatusOr<Program> Run() {
    KILN_RETURN_IF_ERROR(CheckLowerable(g_));
    for (ir::ValueId v : g_.outputs)
      if (!g_.IsInput(v)) materialized_.insert(v);
    // A gather reads its source at positions known only when it runs: the source must be in
    // a buffer, written by an earlier kernel (a kernel never gathers from its own stores:
    // CanJoinKernel sees the gather's buffer among its loads).
    for (const ir::Node& n : g_.nodes) {
      if (n.op != "gather") continue;
      const ir::ValueId src = lower::GatherSource(g_, n).value;
      if (!g_.IsInput(src) && materialized_.insert(src).second)
        why_stored_[src] = "a gather reads it at positions held in a tensor";
    }
    CutDeepExpressions();
    // Stores a reduction whenever inlining it would recompute it, then lowers again: each
    // round only adds values, so this ends after at most one round per reduction.
    for (;;) {
      Program p;
      std::vector<std::pair<ir::ValueId, std::string>> refusals;
      KILN_RETURN_IF_ERROR(Build(&p, &refusals));
      if (refusals.empty()) {
        Report(&p);
        return p;
      }
      for (auto& [v, why] : refusals) {
        materialized_.insert(v);
        why_stored_[v] = why;
      }
    }
  }

 private:
  // One pass in node order: the depth of each value's inlined expression, counting through
  // every inlinable operand. Values stored for other reasons (outputs, refused reductions)
  // count as inlined, because later outputs of the kernel that stores them recompute them
  // (Lowerer::MarkStoredHere); only values cut here are always read back. So the bound holds
  // whatever the kernels turn out to be.
  //
  // Index arithmetic is bounded the same way: each reshape-like view (and concat) wraps the
  // index in division/modulo atoms that refer to the whole index before it, so the printed
  // index can grow with the product of ranks along a path. A path through more than
  // kMaxIndexNesting of them is cut too.
  void CutDeepExpressions() {
    std::vector<int64_t> depth(g_.num_values(), 0), nesting(g_.num_values(), 0);
    for (int k = 0; k < static_cast<int>(g_.nodes.size()); ++k) {
      ir::ValueId v = g_.num_inputs() + k;
      const ir::Node& n = g_.nodes[k];
      int64_t d = 0, nest = 0;
      for (ir::ValueId u : n.inputs) {
        if (g_.IsInput(u) || depth_cut_.count(u)) continue;
        d = std::max(d, depth[u]);
        nest = std::max(nest, nesting[u]);
      }
      d += lower::InlineDepth(n);
      nest += lower::NestsIndex(n) ? 1 : 0;
      depth[v] = d;
      nesting[v] = nest;
      std::string why;
      if (d > options_.max_expr_depth)
        why = absl::StrCat("its inlined expression would be ", d, " deep, over the limit of ",
                           options_.max_expr_depth, " (max_expr_depth)");
      else if (nest > kMaxIndexNesting)
        why = absl::StrCat("its index would nest ", nest,
                           " reshapes or concats, over the limit of ", kMaxIndexNesting);
      else
        continue;
      depth_cut_.insert(v);
      if (materialized_.insert(v).second) why_stored_[v] = why;
    }
  }

  absl::Status Build(Program* p, std::vector<std::pair<ir::ValueId, std::string>>* refusals) {
    buffer_of_.assign(g_.num_values(), -1);
    const_buffer_of_.assign(g_.num_values(), -1);
    out_buffers_.assign(g_.num_values(), {});
    p->num_inputs = g_.num_inputs();
    p->num_outputs = static_cast<int>(g_.outputs.size());
    value_of_buffer_.clear();
    for (int i = 0; i < g_.num_inputs(); ++i) {
      const ir::TensorType& t = g_.inputs[i];
      Buffer b = MakeBuffer(Buffer::Role::kInput, i, t.dtype, t.shape,
                            t.strides.empty() ? lower::ContiguousStrides(t.shape) : t.strides);
      buffer_of_[i] = AddBuffer(p, std::move(b));
      value_of_buffer_[buffer_of_[i]] = i;
    }
    for (size_t j = 0; j < g_.outputs.size(); ++j) {
      const ir::TensorType& t = g_.TypeOf(g_.outputs[j]);
      Buffer b = MakeBuffer(Buffer::Role::kOutput, static_cast<int>(j), t.dtype, t.shape,
                            lower::ContiguousStrides(t.shape));
      out_buffers_[g_.outputs[j]].push_back(AddBuffer(p, std::move(b)));
    }
    int temps = 0, consts = 0;
    for (int k = 0; k < static_cast<int>(g_.nodes.size()); ++k) {
      ir::ValueId v = g_.num_inputs() + k;
      const ir::Node& n = g_.nodes[k];
      if (n.op == "constant" && n.Tensor("value")->NumElements() > 1) {
        Buffer b = MakeBuffer(Buffer::Role::kConst, consts++, n.type.dtype, n.type.shape,
                              lower::ContiguousStrides(n.type.shape));
        b.value = *n.Tensor("value");
        const_buffer_of_[v] = AddBuffer(p, std::move(b));
      }
      if (!materialized_.count(v)) continue;
      if (!out_buffers_[v].empty()) {
        buffer_of_[v] = out_buffers_[v][0];
      } else {
        Buffer b = MakeBuffer(Buffer::Role::kTemp, temps++, n.type.dtype, n.type.shape,
                              lower::ContiguousStrides(n.type.shape));
        buffer_of_[v] = AddBuffer(p, std::move(b));
        out_buffers_[v].push_back(buffer_of_[v]);
      }
      value_of_buffer_[buffer_of_[v]] = v;
    }
    // Outputs that are graph inputs are copies: they get a kernel of their own too.
    std::set<ir::ValueId> stored_set = materialized_;
    for (ir::ValueId v : g_.outputs)
      if (g_.IsInput(v)) stored_set.insert(v);
    std::vector<ir::ValueId> stored(stored_set.begin(), stored_set.end());

    lower::Lowerer lw(g_, buffer_of_, const_buffer_of_);
    Kernel* cur = nullptr;
    std::unordered_set<int> cur_buffers;
    std::vector<lower::Affine> idx;
    for (ir::ValueId v : stored) {
      if (options_.budget) KILN_RETURN_IF_ERROR(options_.budget->Check("schedule"));
      const ir::Shape& shape = g_.TypeOf(v).shape;
      bool joined = false;
      if (cur && (cur->domain == shape || SameElements(cur->domain, shape))) {
        // Try this value in the open kernel (same domain, or the same elements in another
        // shape: a bias add on [B*T, C] and the gelu of its [B, T, C] view): legal when it
        // reads none of the kernel's own stores. Outputs are contiguous, so an output of
        // another shape is stored at the same flat position as the domain's element.
        size_t mark = cur->outputs.size();
        const size_t inlined_mark = lw.inlined().size(), fused_mark = lw.fused_values().size();
        lower::ExprPtr e =
            lw.Lower(v, cur->domain == shape ? idx : lw.ReshapeIndex(idx, cur->domain, shape),
                     /*root=*/true);
        std::vector<int> loads;
        CollectLoads(e, &loads);
        // A reduction this kernel stores is recomputed, not read back, by its later outputs (its
        // store is not visible at other indices within the loop). Where that would evaluate it
        // more than once per result (a row sum of `where(x > x.mean(axis=0), ...)`: the column
        // means recomputed for every row, cubic work), the value goes to a new kernel that
        // reads the stored result.
        std::string recomputed;
        for (size_t i = inlined_mark; i < lw.inlined().size() && recomputed.empty(); ++i) {
          const lower::InlinedReduction& r = lw.inlined()[i];
          std::string why;
          if (materialized_.count(r.value) &&
              !ShouldInlineReduction(r.evaluations, r.elements, &why))
            recomputed = absl::StrCat("would recompute ", g_.Describe(r.value),
                                      ", stored by the same-domain kernel: ", why);
        }
        if (CanJoinKernel(loads, cur_buffers) && recomputed.empty()) {
          AddOutputs(cur, v, e, &cur_buffers, &lw);
          joined = true;
        } else {
          cur->outputs.resize(mark);
          lw.ForgetFusedAfter(fused_mark);
          split_reason_[v] = recomputed.empty()
                                 ? absl::StrCat("reads ", Describe(v, loads, cur_buffers),
                                                " stored by the same-domain kernel before it")
                                 : recomputed;
        }
      } else if (cur) {
        split_reason_[v] =
            absl::StrCat("iteration domain ", ShapeStr(shape),
                         " differs from the previous kernel's ", ShapeStr(cur->domain));
      }
      if (!joined) {
        if (cur) Finish(cur, lw, refusals);
        p->kernels.emplace_back();
        cur = &p->kernels.back();
        cur->name = absl::StrCat("k", p->kernels.size() - 1);
        cur->domain = shape;
        cur_buffers.clear();
        idx = lw.BeginKernel(shape);
        cur->out_index = idx;
        for (int64_t d : shape) cur->num_loops += d != 1;
        lower::ExprPtr e = lw.Lower(v, idx, /*root=*/true);
        AddOutputs(cur, v, e, &cur_buffers, &lw);
      }
    }
    if (cur) Finish(cur, lw, refusals);
    PlanWorkspace(p);
    return absl::OkStatus();
  }

  // Shapes of equal, static element counts (symbolic sizes keep to equal shapes: the sample
  // sizes a symbolic kernel is fitted from could agree where the sizes do not).
  static bool SameElements(const ir::Shape& a, const ir::Shape& b) {
    int64_t na = 1, nb = 1;
    for (int64_t d : a) {
      if (ir::VariesWithSizes(d)) return false;
      na *= d;
    }
    for (int64_t d : b) {
      if (ir::VariesWithSizes(d)) return false;
      nb *= d;
    }
    return na == nb && na > 0;
  }

  std::string Describe(ir::ValueId, const std::vector<int>& loads,
                       const std::unordered_set<int>& kernel_buffers) {
    for (int b : loads) {
      auto it = value_of_buffer_.find(b);
      if (kernel_buffers.count(b) && it != value_of_buffer_.end()) return g_.Describe(it->second);
    }
    return "a value";
  }

  void AddOutputs(Kernel* k, ir::ValueId v, const lower::ExprPtr& e, std::unordered_set<int>* bufs,
                  lower::Lowerer* lw) {
    // A value stored to cut a deep expression is read back by later kernels, never
    // recomputed from its definition.
    if (!depth_cut_.count(v)) lw->MarkStoredHere(v);
    for (int b : out_buffers_[v]) {
      k->outputs.push_back({b, e, v});
      bufs->insert(b);
    }
  }

  void Finish(Kernel* k, const lower::Lowerer& lw,
              std::vector<std::pair<ir::ValueId, std::string>>* refusals) {
    k->extents = lw.extents();
    for (ir::ValueId v : lw.fused_values()) k->fused_values.push_back(v);
    std::sort(k->fused_values.begin(), k->fused_values.end());
    for (const lower::InlinedReduction& r : lw.inlined()) {
      std::string why;
      if (!ShouldInlineReduction(r.evaluations, r.elements, &why) && !materialized_.count(r.value))
        refusals->push_back({r.value, why});
    }
  }

  int AddBuffer(Program* p, Buffer b) {
    int64_t n = 1;
    for (int64_t d : b.shape) n *= d;
    b.bytes = n * ir::DTypeSize(b.dtype);
    p->buffers.push_back(std::move(b));
    return static_cast<int>(p->buffers.size()) - 1;
  }

  // Temps live from the kernel that stores them to the last kernel that reads them; first-fit
  // placement in the workspace reuses the bytes of temps that are dead by then.
  void PlanWorkspace(Program* p) {
    int nb = static_cast<int>(p->buffers.size());
    std::vector<int> first(nb, -1), last(nb, -1);
    for (int k = 0; k < static_cast<int>(p->kernels.size()); ++k) {
      for (const KernelOutput& o : p->kernels[k].outputs) {
        if (first[o.buffer] < 0) first[o.buffer] = k;
        last[o.buffer] = std::max(last[o.buffer], k);
        std::vector<int> loads;
        CollectLoads(o.value, &loads);
        for (int b : loads) last[b] = std::max(last[b], k);
      }
    }
    struct Placed {
      int64_t off, end;
      int first, last;
    };
    // Temps in order of the kernel that first stores them (buffer order already is, as
    // kernels store values in node order); a placed temp dead before the current one's first
    // kernel is dead for every later one too, so it is dropped and each step sees only the
    // temps alive at that point.
    std::vector<int> temps;
    for (int b = 0; b < nb; ++b)
      if (p->buffers[b].role == Buffer::Role::kTemp) temps.push_back(b);
    std::stable_sort(temps.begin(), temps.end(), [&](int a, int b) { return first[a] < first[b]; });
    std::vector<Placed> placed;
    int64_t total = 0;
    for (int b : temps) {
      Buffer& buf = p->buffers[b];
      int64_t size = AlignUp(std::max<int64_t>(buf.bytes, 1));
      placed.erase(std::remove_if(placed.begin(), placed.end(),
                                  [&](const Placed& q) { return q.last < first[b]; }),
                   placed.end());
      std::vector<std::pair<int64_t, int64_t>> busy;
      for (const Placed& q : placed)
        if (!(q.last < first[b] || last[b] < q.first)) busy.push_back({q.off, q.end});
      std::sort(busy.begin(), busy.end());
      int64_t off = 0;
      for (auto [lo, hi] : busy) {
        if (off + size <= lo) break;
        off = std::max(off, hi);
      }
      buf.offset = off;
      placed.push_back({off, off + size, first[b], last[b]});
      total = std::max(total, off + size);
    }
    p->workspace_bytes = total;
  }

  void Report(Program* p) {
    std::string r;
    for (const Kernel& k : p->kernels) {
      absl::StrAppend(&r, "kernel ", k.name, " domain ", ShapeStr(k.domain), " stores");
      for (const KernelOutput& o : k.outputs) {
        const Buffer& b = p->buffers[o.buffer];
        absl::StrAppend(&r, " ", b.role == Buffer::Role::kOutput ? "out" : "tmp", b.index, "=%",
                        o.graph_value);
      }
      absl::StrAppend(&r, "\n  fuses:");
      for (ir::ValueId v : k.fused_values) absl::StrAppend(&r, " %", v, ":", g_.NodeOf(v).op);
      absl::StrAppend(&r, "\n");
    }
    for (const auto& [v, why] : why_stored_)
      absl::StrAppend(&r, "not fused: ", g_.Describe(v), " stored to a buffer: ", why, "\n");
    for (const auto& [v, why] : split_reason_)
      if (materialized_.count(v) || g_.IsInput(v))
        absl::StrAppend(&r, "new kernel for ", g_.Describe(v), ": ", why, "\n");
    p->report = r;
  }

  const ir::Graph& g_;
  const ScheduleOptions options_;
  std::set<ir::ValueId> materialized_;
  std::set<ir::ValueId> depth_cut_;  // stored because their expressions would be too deep
  std::unordered_map<int, ir::ValueId> value_of_buffer_;
  std::map<ir::ValueId, std::string> why_stored_;
  std::map<ir::ValueId, std::string> split_reason_;
  std::vector<int> buffer_of_, const_buffer_of_;
  std::vector<std::vector<int>> out_buffers_;
};

}  // namespace

absl::StatusOr<Program> Schedule(const ir::Graph& graph, const ScheduleOptions& options) {
  return Scheduler(graph, options).Run();
}

}  // namespace kiln::schedule
