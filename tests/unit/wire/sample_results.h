// Test fixtures shared by the tests of signed results (tests/unit/wire, tests/unit/auth): a
// scratch folder, and action results that set every part of the signed encoding (FORMAT.md).
// Thread-safety: free functions without shared state; a TempDir has one owner.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/v1/service.pb.h"

namespace kiln::wire::testing {

inline constexpr char kHandle[] =
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// A fresh folder under the system's temporary folder, removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A static CPU result with every signed field set, and the unsigned ones too.
inline v1::ActionResult CpuResult() {
  v1::ActionResult r;
  v1::Artifact* so = r.add_artifacts();
  so->set_kind(v1::SHARED_OBJECT);
  so->set_digest(std::string(64, 'a'));
  so->set_size(12345);
  v1::Artifact* src = r.add_artifacts();
  src->set_kind(v1::SOURCE);
  src->set_digest(std::string(64, 'b'));
  src->set_size(678);
  v1::LaunchPlan* plan = r.mutable_plan();
  v1::PlanBuffer* in = plan->add_buffers();
  in->set_role(v1::INPUT);
  in->set_dtype(v1::F32);
  in->add_shape(4);
  in->add_shape(8);
  in->set_bytes(128);
  v1::PlanBuffer* tmp = plan->add_buffers();
  tmp->set_role(v1::TEMP);
  tmp->set_index(-1);  // a negative int32: ten bytes on the wire
  tmp->set_bytes(64);
  tmp->set_offset(64);
  v1::PlanStep* step = plan->add_steps();
  step->set_kernel("k0");
  step->add_grid(4000000000u);  // past INT32_MAX: a uint32 is signed by value
  step->add_block(128);
  step->set_shared_bytes(512);
  step->add_args(0);
  step->add_args(1);
  plan->set_workspace_bytes(128);
  plan->set_abi_version(1);
  v1::CpuTarget* cpu = r.mutable_target()->mutable_cpu();
  cpu->set_isa("x86-64-v3");
  cpu->add_features("avx2");
  cpu->add_features("fma");
  r.set_key_debug("graph=...\ntarget=cpu:x86-64-v3\n");
  v1::KeyField* f = r.add_key_fields();
  f->set_label("graph");
  f->set_value("abc");
  r.set_compile_log("g++ said nothing");
  r.mutable_stats()->set_total_ms(12.5);
  return r;
}

inline void SetExpr(v1::SizeExpr* e, int64_t coeff, std::vector<int32_t> exponents) {
  v1::SizeTerm* t = e->add_terms();
  t->set_coeff(coeff);
  for (int32_t x : exponents) t->add_exponents(x);
}

// A symbolic CUDA result with launch-time choices: every optional part of the encoding.
inline v1::ActionResult GuardedCudaResult() {
  v1::ActionResult r;
  v1::Artifact* cubin = r.add_artifacts();
  cubin->set_kind(v1::CUBIN);
  cubin->set_digest(std::string(64, 'c'));
  cubin->set_size(4096);
  v1::LaunchPlan* plan = r.mutable_plan();
  v1::PlanSymbol* b = plan->add_symbols();
  b->set_name("B");
  v1::PlanSymbol* t = plan->add_symbols();
  t->set_name("T");
  t->set_axis(1);
  for (int i = 0; i < 2; ++i) {
    v1::PlanBuffer* buf = plan->add_buffers();
    buf->set_role(i == 0 ? v1::INPUT : v1::OUTPUT);
    buf->set_dtype(v1::F16);
    SetExpr(buf->add_shape_exprs(), 1, {1});
    SetExpr(buf->add_shape_exprs(), 1, {0, 1});
    SetExpr(buf->mutable_bytes_expr(), 2, {1, 1});
  }
  for (int i = 0; i < 2; ++i) {
    v1::PlanStep* s = plan->add_steps();
    s->set_kernel("softmax_" + std::to_string(i));
    s->add_block(256);
    s->add_args(0);
    s->add_args(1);
    SetExpr(s->mutable_grid_work(), 1, {1});
    s->set_grid_per_block(1 + i);
    SetExpr(s->mutable_guard(), -3, {0, 1});  // a negative coefficient
    s->set_guard_min(i == 0 ? 1 : 1025);
    s->set_guard_max(i == 0 ? 1024 : 0);
  }
  SetExpr(plan->mutable_index_bound(), 1, {1, 1});
  plan->set_abi_version(2);
  r.mutable_target()->mutable_cuda()->set_sm(90);
  r.set_key_debug("graph=...\ntarget=cuda:sm_90\n");
  return r;
}

}  // namespace kiln::wire::testing
