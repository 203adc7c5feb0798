// The worker side: one process, one compile at a time, until kilnd closes the stream.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/ir/decode.h"
#include "server/compile/result_convert.h"
#include "server/worker/worker.h"

namespace kiln::worker {
namespace {

constexpr char kFaultPrefix[] = "kiln-fault:";

// The fault a graph asks for, when the worker was started with that fault enabled.
std::string RequestedFault(const v1::Graph& graph, const std::string& enabled) {
  if (enabled.empty()) return "";
  const std::vector<std::string> kinds = absl::StrSplit(enabled, ',', absl::SkipEmpty());
  for (const v1::Node& node : graph.nodes()) {
    if (node.name().rfind(kFaultPrefix, 0) != 0) continue;
    const std::string kind = node.name().substr(sizeof kFaultPrefix - 1);
    for (const std::string& k : kinds) {
      if (k == kind) return kind;
    }
  }
  return "";
}

// Never returns for the kinds the contract names.
void InjectFault(const std::string& kind) {
  std::fprintf(stderr, "kiln compile worker %d: injecting fault '%s'\n", getpid(), kind.c_str());
  if (kind == "crash") raise(SIGSEGV);
  if (kind == "abort") std::abort();
  if (kind == "hang") {
    for (;;) pause();
  }
  if (kind == "spin") {
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
  }
  if (kind == "oom") {
    std::vector<std::vector<char>> hog;
    for (;;) hog.emplace_back(size_t{64} << 20, 'x');  // touched, so really resident
  }
}

double CpuSecondsUsed() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// RLIMIT_CPU counts the whole life of the process, so each compile gets "what was used so far
// plus its allowance" as the soft limit; the hard limit stays open so the next compile can
// move it again. Past the soft limit the kernel sends SIGXCPU, which kills the worker.
void SetCpuAllowance(double seconds) {
  struct rlimit rl {};
  getrlimit(RLIMIT_CPU, &rl);
  rl.rlim_cur =
      seconds > 0 ? static_cast<rlim_t>(std::ceil(CpuSecondsUsed() + seconds)) : rl.rlim_max;
  setrlimit(RLIMIT_CPU, &rl);
}

v1::WorkerResponse Answer(const Pipeline& pipeline, const v1::WorkerRequest& request,
                          const WorkerConfig& config) {
  v1::WorkerResponse response;
  response.set_id(request.id());
  const v1::CompileRequest& wire = request.compile();

  absl::StatusOr<CompileResult> compiled = [&]() -> absl::StatusOr<CompileResult> {
    // kilnd validated this graph against its own limits already; the worker must not refuse
    // what kilnd accepted.
    ir::Limits unlimited;
    unlimited.max_nodes = int64_t{1} << 40;
    absl::StatusOr<ir::Graph> graph = ir::DecodeGraph(wire.graph(), unlimited);
    if (!graph.ok()) return graph.status();
    absl::StatusOr<Target> target = ir::DecodeTarget(wire.target());
    if (!target.ok()) return target.status();
    SetCpuAllowance(config.cpu_seconds);
    if (const std::string fault = RequestedFault(wire.graph(), config.fault_injection);
        !fault.empty()) {
      InjectFault(fault);
    }
    return pipeline.Compile(*graph, *target, ir::DecodeOptions(wire.options()));
  }();
  if (!compiled.ok()) {
    response.set_code(static_cast<int32_t>(compiled.status().code()));
    response.set_message(std::string(compiled.status().message()));
    return response;
  }
  for (Artifact& a : compiled->artifacts) {
    v1::WorkerArtifact* out = response.add_artifacts();
    out->set_kind(static_cast<v1::ArtifactKind>(a.kind));
    out->set_bytes(std::move(a.bytes));
  }
  compile::ToWirePlan(compiled->plan, /*has_geometry=*/true, response.mutable_plan());
  response.set_log(std::move(compiled->log));
  compile::ToWireStats(compiled->stats, response.mutable_stats());
  return response;
}

}  // namespace

int RunCompileWorker(int fd, const WorkerConfig& config) {
  absl::StatusOr<std::unique_ptr<Pipeline>> pipeline = Pipeline::Create(config.pipeline);
  if (!pipeline.ok()) {
    std::fprintf(stderr, "kiln compile worker %d: %s\n", getpid(),
                 pipeline.status().ToString().c_str());
    return 2;
  }
  for (;;) {
    v1::WorkerRequest request;
    absl::Status read = ReadFrame(fd, &request, absl::InfiniteFuture(), nullptr);
    if (absl::IsNotFound(read)) return 0;  // kilnd closed the stream: time to go
    if (!read.ok()) {
      std::fprintf(stderr, "kiln compile worker %d: %s\n", getpid(), read.ToString().c_str());
      return 3;
    }
    v1::WorkerResponse response;
    try {
      response = Answer(**pipeline, request, config);
    } catch (const std::bad_alloc&) {
      // The address-space cap refused an allocation: this graph needs more than a worker may
      // have. The worker itself is fine (the allocation never happened).
      response.Clear();
      response.set_id(request.id());
      response.set_code(static_cast<int32_t>(absl::StatusCode::kResourceExhausted));
      response.set_message(
          "the compile ran out of memory: it needs more than the worker's "
          "memory limit (--worker-memory)");
    } catch (const std::exception& e) {
      response.Clear();
      response.set_id(request.id());
      response.set_code(static_cast<int32_t>(absl::StatusCode::kInternal));
      response.set_message(absl::StrCat("compiler threw: ", e.what()));
    }
    SetCpuAllowance(0);
    if (absl::Status s = WriteFrame(fd, response); !s.ok()) {
      std::fprintf(stderr, "kiln compile worker %d: %s\n", getpid(), s.ToString().c_str());
      return 3;
    }
  }
}

}  // namespace kiln::worker
