#include "server/compile/result_convert.h"

#include <utility>

#include "kernels/ir/decode.h"

namespace kiln::compile {
namespace {

void ToWireSizeExpr(const SizeExpr& e, v1::SizeExpr* wire) {
  for (const SizeTerm& t : e.terms) {
    v1::SizeTerm* out = wire->add_terms();
    out->set_coeff(t.coeff);
    for (int32_t x : t.exponents) out->add_exponents(x);
  }
}

SizeExpr FromWireSizeExpr(const v1::SizeExpr& wire) {
  SizeExpr e;
  for (const v1::SizeTerm& t : wire.terms())
    e.terms.push_back({t.coeff(), {t.exponents().begin(), t.exponents().end()}});
  return e;
}

}  // namespace

void ToWirePlan(const LaunchPlan& plan, bool has_geometry, v1::LaunchPlan* wire) {
  for (const PlanBuffer& b : plan.buffers) {
    v1::PlanBuffer* out = wire->add_buffers();
    // The enum numbers are shared with the wire on purpose (see kernels/target.h).
    out->set_role(static_cast<v1::BufferRole>(b.role));
    out->set_index(b.index);
    out->set_dtype(static_cast<v1::DType>(b.dtype));
    for (int64_t d : b.shape) out->add_shape(d);
    out->set_bytes(b.bytes);
    out->set_offset(b.offset);
    for (const SizeExpr& e : b.shape_exprs) ToWireSizeExpr(e, out->add_shape_exprs());
    if (!plan.symbols.empty()) ToWireSizeExpr(b.bytes_expr, out->mutable_bytes_expr());
  }
  for (const PlanStep& s : plan.steps) {
    v1::PlanStep* out = wire->add_steps();
    out->set_kernel(s.kernel);
    if (has_geometry) {
      for (uint32_t g : s.grid) out->add_grid(g);
      for (uint32_t b : s.block) out->add_block(b);
    }
    out->set_shared_bytes(s.shared_bytes);
    for (int32_t a : s.args) out->add_args(a);
    if (s.grid_per_block > 0) {
      ToWireSizeExpr(s.grid_work_expr, out->mutable_grid_work());
      out->set_grid_per_block(s.grid_per_block);
    }
    if (s.guarded()) {
      ToWireSizeExpr(s.guard_expr, out->mutable_guard());
      out->set_guard_min(s.guard_min);
      out->set_guard_max(s.guard_max);
    }
  }
  wire->set_workspace_bytes(plan.workspace_bytes);
  wire->set_abi_version(plan.abi_version);
  for (const PlanSymbol& sym : plan.symbols) {
    v1::PlanSymbol* out = wire->add_symbols();
    out->set_name(sym.name);
    out->set_input(sym.input);
    out->set_axis(sym.axis);
  }
  if (!plan.index_bound_expr.terms.empty())
    ToWireSizeExpr(plan.index_bound_expr, wire->mutable_index_bound());
}

void ToWireStats(const CompileStats& stats, v1::CompileStats* wire) {
  wire->set_num_kernels(stats.num_kernels);
  wire->set_num_nodes_in(stats.num_nodes_in);
  wire->set_num_nodes_lowered(stats.num_nodes_lowered);
  wire->set_frontend_ms(stats.frontend_ms);
  wire->set_toolchain_ms(stats.toolchain_ms);
  wire->set_total_ms(stats.total_ms);
}

CompileStats FromWireStats(const v1::CompileStats& wire) {
  CompileStats stats;
  stats.num_kernels = wire.num_kernels();
  stats.num_nodes_in = wire.num_nodes_in();
  stats.num_nodes_lowered = wire.num_nodes_lowered();
  stats.frontend_ms = wire.frontend_ms();
  stats.toolchain_ms = wire.toolchain_ms();
  stats.total_ms = wire.total_ms();
  return stats;
}

LaunchPlan FromWirePlan(const v1::LaunchPlan& wire) {
  LaunchPlan plan;
  for (const v1::PlanBuffer& b : wire.buffers()) {
    PlanBuffer& out = plan.buffers.emplace_back();
    out.role = static_cast<BufferRole>(b.role());
    out.index = b.index();
    out.dtype = static_cast<ir::DType>(b.dtype());
    out.shape.assign(b.shape().begin(), b.shape().end());
    out.bytes = b.bytes();
    out.offset = b.offset();
    for (const v1::SizeExpr& e : b.shape_exprs()) out.shape_exprs.push_back(FromWireSizeExpr(e));
    out.bytes_expr = FromWireSizeExpr(b.bytes_expr());
  }
  for (const v1::PlanStep& s : wire.steps()) {
    PlanStep& out = plan.steps.emplace_back();
    out.kernel = s.kernel();
    for (int i = 0; i < 3 && i < s.grid_size(); ++i) out.grid[i] = s.grid(i);
    for (int i = 0; i < 3 && i < s.block_size(); ++i) out.block[i] = s.block(i);
    out.shared_bytes = s.shared_bytes();
    out.args.assign(s.args().begin(), s.args().end());
    out.grid_per_block = s.grid_per_block();
    out.grid_work_expr = FromWireSizeExpr(s.grid_work());
    out.guard_expr = FromWireSizeExpr(s.guard());
    out.guard_min = s.guard_min();
    out.guard_max = s.guard_max();
  }
  plan.index_bound_expr = FromWireSizeExpr(wire.index_bound());
  plan.workspace_bytes = wire.workspace_bytes();
  plan.abi_version = wire.abi_version();
  for (const v1::PlanSymbol& s : wire.symbols())
    plan.symbols.push_back({s.name(), s.input(), s.axis()});
  return plan;
}

ConvertedResult ToActionResult(CompileResult compiled, const key::ActionKey& key,
                               const Target& target) {
  ConvertedResult out;
  v1::ActionResult& r = out.result;
  out.blobs.reserve(compiled.artifacts.size());
  for (Artifact& a : compiled.artifacts) {
    v1::Artifact* wire = r.add_artifacts();
    wire->set_kind(static_cast<v1::ArtifactKind>(a.kind));
    wire->set_digest(key::Sha256Hex(a.bytes));
    wire->set_size(static_cast<int64_t>(a.bytes.size()));
    out.blobs.push_back(std::move(a.bytes));
  }
  // CPU steps carry no launch geometry: the .so runs its kernels itself.
  ToWirePlan(compiled.plan, target.is_cuda(), r.mutable_plan());
  r.set_compile_log(std::move(compiled.log));
  ToWireStats(compiled.stats, r.mutable_stats());
  r.set_key_debug(key.DebugString());
  for (const auto& [label, value] : key.fields) {
    v1::KeyField* field = r.add_key_fields();
    field->set_label(label);
    field->set_value(value);
  }
  *r.mutable_target() = ir::EncodeTarget(target);
  return out;
}

const v1::Artifact* FindArtifact(const v1::ActionResult& result, v1::ArtifactKind kind) {
  for (const v1::Artifact& a : result.artifacts()) {
    if (a.kind() == kind) return &a;
  }
  return nullptr;
}

}  // namespace kiln::compile
