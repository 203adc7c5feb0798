// Frontend scaling: decode + verify, key, and the frontend (passes, fusion, codegen; no
// toolchain) for a dependent chain `y = exp(x); y = y + x` repeated, at growing node counts.
// Time should grow linearly with nodes. Run: build/tests/bench/frontend_bench [max_nodes]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/ir/decode.h"
#include "kernels/key/key.h"
#include "kernels/pipeline.h"
#include "tests/integration/wire_graph.h"

namespace {

double Ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

kiln::v1::Graph Chain(int64_t nodes) {
  kiln::testing::WireGraph g;
  const int x = g.Input("x", kiln::v1::F32, {1024});
  int y = g.Op("exp", {x});
  for (int64_t i = 1; i < nodes; ++i) y = g.Op("add", {y, x});
  g.Output(y);
  return g.graph();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t max_nodes = argc > 1 ? std::atoll(argv[1]) : 100000;
  kiln::PipelineConfig config;
  config.max_frontend_ms = 0;  // measure, do not limit
  auto pipeline = kiln::Pipeline::Create(config);
  if (!pipeline.ok()) {
    std::fprintf(stderr, "%s\n", pipeline.status().ToString().c_str());
    return 1;
  }
  kiln::ir::Limits limits;
  limits.max_nodes = max_nodes;
  std::vector<kiln::Target> targets = {kiln::Target{}};
  targets[0].kind = kiln::Target::Kind::kCpu;
  targets[0].isa = "x86-64-v3";
  kiln::Target cuda;
  cuda.kind = kiln::Target::Kind::kCuda;
  cuda.sm = 90;
  bool have_cuda = (*pipeline)->CheckTarget(cuda).ok();
  std::printf("%8s %10s %8s %14s %15s %8s\n", "nodes", "decode_ms", "key_ms", "frontend_cpu_ms",
              have_cuda ? "frontend_sm90_ms" : "(no NVRTC)", "kernels");
  for (int64_t n = 1000; n <= max_nodes; n *= 10) {
    kiln::v1::Graph wire = Chain(n);
    auto t0 = std::chrono::steady_clock::now();
    auto graph = kiln::ir::DecodeGraph(wire, limits);
    double decode_ms = Ms(t0);
    if (!graph.ok()) {
      std::fprintf(stderr, "%s\n", graph.status().ToString().c_str());
      return 1;
    }
    t0 = std::chrono::steady_clock::now();
    std::string canonical = kiln::key::CanonicalBytes(*graph);
    double key_ms = Ms(t0);
    t0 = std::chrono::steady_clock::now();
    auto cpu = (*pipeline)->Generate(*graph, targets[0], kiln::CompileOptions{});
    double cpu_ms = Ms(t0);
    if (!cpu.ok()) {
      std::fprintf(stderr, "%s\n", cpu.status().ToString().c_str());
      return 1;
    }
    double cuda_ms = 0;
    if (have_cuda) {
      t0 = std::chrono::steady_clock::now();
      auto gpu = (*pipeline)->Generate(*graph, cuda, kiln::CompileOptions{});
      cuda_ms = Ms(t0);
      if (!gpu.ok()) {
        std::fprintf(stderr, "%s\n", gpu.status().ToString().c_str());
        return 1;
      }
    }
    std::printf("%8lld %10.1f %8.1f %14.1f %15.1f %8d\n", static_cast<long long>(n), decode_ms,
                key_ms, cpu_ms, cuda_ms, cpu->num_kernels);
    std::fflush(stdout);
  }
  return 0;
}
