// kilnc: the compiler alone, without the daemon. Reads a graph (kiln.v1.Graph as protobuf
// text `.txtpb`/`.pbtxt`, JSON `.json` or binary `.pb`), compiles it for a target and writes
// the artifacts to a folder: kernel.so or kernel.cubin + kernel.ptx, kernel.cc/.cu, report.txt,
// key.txt, and the launch plan as plan.json (kernels/codegen/PLAN.md).
//
//   kilnc GRAPH [--target cpu:x86-64-v3|cuda:sm_90] [--out DIR] [--source-only] [--trace]
//         [--no-algebraic-rewrites]
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/strings/str_join.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/codegen/symbolic.h"
#include "kernels/ir/decode.h"
#include "kernels/key/key.h"
#include "kernels/pipeline.h"

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "kilnc: %s\n", msg.c_str());
  return 1;
}

const char* RoleName(kiln::BufferRole r) {
  switch (r) {
    case kiln::BufferRole::kInput:
      return "input";
    case kiln::BufferRole::kOutput:
      return "output";
    case kiln::BufferRole::kTemp:
      return "temp";
  }
  return "?";
}

std::vector<std::string> SymbolNames(const kiln::LaunchPlan& plan) {
  std::vector<std::string> names;
  for (const kiln::PlanSymbol& s : plan.symbols) names.push_back(s.name);
  return names;
}

// The launch plan as JSON (kernels/codegen/PLAN.md), one buffer or step per line.
std::string PlanJson(const kiln::LaunchPlan& plan, const std::string& target) {
  auto ints = [](const auto& v) {
    std::string s = "[";
    for (size_t i = 0; i < std::size(v); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  std::string j =
      "{\n  \"abi_version\": " + std::to_string(plan.abi_version) + ",\n  \"target\": \"" + target +
      "\",\n  \"workspace_bytes\": " + std::to_string(plan.workspace_bytes) + ",\n  \"buffers\": [";
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const kiln::PlanBuffer& b = plan.buffers[i];
    j += std::string(i ? "," : "") + "\n    {\"role\": \"" + RoleName(b.role) +
         "\", \"index\": " + std::to_string(b.index) + ", \"dtype\": \"" +
         kiln::ir::DTypeName(b.dtype) + "\", \"shape\": " + ints(b.shape) +
         ", \"bytes\": " + std::to_string(b.bytes) + ", \"offset\": " + std::to_string(b.offset);
    if (!plan.symbols.empty()) {  // symbolic plans: shape and size as expressions of the symbols
      const std::vector<std::string> names = SymbolNames(plan);
      std::vector<std::string> dims;
      for (const kiln::SizeExpr& e : b.shape_exprs)
        dims.push_back("\"" + kiln::codegen::SizeExprToString(e, names) + "\"");
      j += ", \"shape_exprs\": [" + absl::StrJoin(dims, ", ") + "], \"bytes_expr\": \"" +
           kiln::codegen::SizeExprToString(b.bytes_expr, names) + "\"";
    }
    j += "}";
  }
  if (!plan.symbols.empty()) {
    j += "\n  ],\n  \"symbols\": [";
    for (size_t i = 0; i < plan.symbols.size(); ++i)
      j += std::string(i ? "," : "") + "\n    {\"name\": \"" + plan.symbols[i].name +
           "\", \"input\": " + std::to_string(plan.symbols[i].input) +
           ", \"axis\": " + std::to_string(plan.symbols[i].axis) + "}";
  }
  j += "\n  ],\n  \"steps\": [";
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const kiln::PlanStep& s = plan.steps[i];
    j += std::string(i ? "," : "") + "\n    {\"kernel\": \"" + s.kernel +
         "\", \"grid\": " + ints(s.grid) + ", \"block\": " + ints(s.block) +
         ", \"shared_bytes\": " + std::to_string(s.shared_bytes) + ", \"args\": " + ints(s.args);
    if (s.grid_per_block > 0)  // symbolic CUDA plans: grid x = ceil(grid_work / grid_per_block)
      j += ", \"grid_work\": \"" +
           kiln::codegen::SizeExprToString(s.grid_work_expr, SymbolNames(plan)) +
           "\", \"grid_per_block\": " + std::to_string(s.grid_per_block);
    if (s.guarded())  // a launch-time choice: runs when guard_min <= guard <= guard_max (0:
                      // unbounded)
      j += ", \"guard\": \"" + kiln::codegen::SizeExprToString(s.guard_expr, SymbolNames(plan)) +
           "\", \"guard_min\": " + std::to_string(s.guard_min) +
           ", \"guard_max\": " + std::to_string(s.guard_max);
    j += "}";
  }
  j += "\n  ]";
  if (!plan.index_bound_expr.terms.empty())
    j += ",\n  \"index_bound\": \"" +
         kiln::codegen::SizeExprToString(plan.index_bound_expr, SymbolNames(plan)) + "\"";
  return j + "\n}\n";
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path, target_text = "cpu:x86-64-v3", out_dir = ".";
  bool source_only = false, trace = false;
  kiln::CompileOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--target" && i + 1 < argc)
      target_text = argv[++i];
    else if (a == "--out" && i + 1 < argc)
      out_dir = argv[++i];
    else if (a == "--source-only")
      source_only = true;
    else if (a == "--trace")
      trace = true;
    else if (a == "--no-algebraic-rewrites")
      options.algebraic_rewrites = false;
    else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: kilnc GRAPH [--target cpu:ISA|cuda:sm_NN] [--out DIR] [--source-only] [--trace] "
          "[--no-algebraic-rewrites]\n");
      return 0;
    } else
      graph_path = a;
  }
  if (graph_path.empty()) return Fail("no graph file given (see --help)");
  std::ifstream f(graph_path, std::ios::binary);
  if (!f) return Fail("cannot read " + graph_path);
  std::stringstream ss;
  ss << f.rdbuf();
  kiln::v1::Graph wire;
  bool parsed = EndsWith(graph_path, ".json")
                    ? google::protobuf::util::JsonStringToMessage(ss.str(), &wire).ok()
                : EndsWith(graph_path, ".pb")
                    ? wire.ParseFromString(ss.str())
                    : google::protobuf::TextFormat::ParseFromString(ss.str(), &wire);
  if (!parsed) return Fail("cannot parse " + graph_path);

  kiln::v1::Target wt;
  if (target_text.rfind("cuda:sm_", 0) == 0)
    wt.mutable_cuda()->set_sm(std::atoi(target_text.c_str() + 8));
  else if (target_text.rfind("cpu:", 0) == 0)
    wt.mutable_cpu()->set_isa(target_text.substr(4));
  else
    return Fail("bad --target " + target_text);

  auto graph = kiln::ir::DecodeGraph(wire);
  if (!graph.ok()) return Fail(std::string(graph.status().message()));
  auto target = kiln::ir::DecodeTarget(wt);
  if (!target.ok()) return Fail(std::string(target.status().message()));
  kiln::PipelineConfig config;
  config.trace = trace;
  auto pipeline = kiln::Pipeline::Create(config);
  if (!pipeline.ok()) return Fail(std::string(pipeline.status().message()));
  std::filesystem::create_directories(out_dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream o(out_dir + "/" + name, std::ios::binary);
    o.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  bool cuda = target->is_cuda();
  if (source_only) {
    auto gen = (*pipeline)->Generate(*graph, *target, options);
    if (!gen.ok()) return Fail(std::string(gen.status().message()));
    write(cuda ? "kernel.cu" : "kernel.cc", gen->source);
    write("report.txt", gen->fusion_report);
    write("plan.json", PlanJson(gen->plan, target->ToString()));
    std::printf("%d kernel(s)\n", gen->num_kernels);
    return 0;
  }
  auto r = (*pipeline)->Compile(*graph, *target, options);
  if (!r.ok()) return Fail(std::string(r.status().message()));
  for (const kiln::Artifact& a : r->artifacts) {
    switch (a.kind) {
      case kiln::ArtifactKind::kSharedObject:
        write("kernel.so", a.bytes);
        break;
      case kiln::ArtifactKind::kCubin:
        write("kernel.cubin", a.bytes);
        break;
      case kiln::ArtifactKind::kPtx:
        write("kernel.ptx", a.bytes);
        break;
      case kiln::ArtifactKind::kSource:
        write(cuda ? "kernel.cu" : "kernel.cc", a.bytes);
        break;
      case kiln::ArtifactKind::kFusionReport:
        write("report.txt", a.bytes);
        break;
    }
  }
  write("plan.json", PlanJson(r->plan, target->ToString()));
  auto key = kiln::key::ComputeKey(*graph, *target, options, (*pipeline)->Fingerprint(*target));
  write("key.txt", key.DebugString());
  std::printf("%d kernel(s), frontend %.1f ms, toolchain %.1f ms, key %s\n", r->stats.num_kernels,
              r->stats.frontend_ms, r->stats.toolchain_ms, key.digest.c_str());
  return 0;
}
