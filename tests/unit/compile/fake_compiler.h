// FakeCompiler: a Compiler for compile-service tests. Counts calls, records the order in which
// graphs were compiled (by the length of their first input), can hold every compile at a gate
// until the test opens it, and can fail. With HonourCancel(), a compile held at the gate gives
// up (Cancelled) once the service cancels it.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/compile/compiler.h"

namespace kiln::testing {

class FakeCompiler final : public compile::Compiler {
 public:
  absl::Status CheckTarget(const Target&) const override { return absl::OkStatus(); }
  std::string Fingerprint(const Target& target) const override {
    return "fake-toolchain-1 " + target.ToString();
  }

  absl::StatusOr<CompileResult> Compile(const ir::Graph& graph, const Target&,
                                        const CompileOptions&) override {
    const int64_t tag =
        graph.inputs.empty() || graph.inputs[0].shape.empty() ? -1 : graph.inputs[0].shape[0];
    {
      absl::MutexLock lock(&mu_);
      started_.push_back(tag);
      mu_.Await(absl::Condition(&open_));
      order_.push_back(tag);
    }
    calls_.fetch_add(1);
    absl::Status fail;
    {
      absl::MutexLock lock(&mu_);
      fail = fail_;
    }
    if (!fail.ok()) return fail;
    CompileResult r;
    r.artifacts.push_back({ArtifactKind::kSharedObject, "ELF-so-for-" + std::to_string(tag)});
    r.artifacts.push_back({ArtifactKind::kSource, "// source " + std::to_string(tag)});
    r.artifacts.push_back({ArtifactKind::kFusionReport, "1 kernel"});
    r.plan.workspace_bytes = 64;
    r.plan.steps.push_back({});
    r.plan.steps.back().kernel = "k0";
    r.stats.num_kernels = 1;
    r.log = "ok";
    return r;
  }

  absl::StatusOr<CompileResult> CompileCancellable(const ir::Graph& graph, const Target& target,
                                                   const CompileOptions& options,
                                                   const std::atomic<bool>& cancel) override {
    if (honour_cancel_.load()) {
      absl::MutexLock lock(&mu_);
      while (!open_) {
        if (cancel.load()) {
          cancelled_.fetch_add(1);
          return absl::CancelledError("fake compiler: cancelled");
        }
        mu_.AwaitWithTimeout(absl::Condition(&open_), absl::Milliseconds(10));
      }
    }
    return Compile(graph, target, options);
  }
  void HonourCancel() { honour_cancel_.store(true); }
  int cancelled() const { return cancelled_.load(); }

  // While closed, compiles wait; the test opens it when it has arranged the queue.
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_ = std::move(status);
  }
  // Blocks until `n` compiles have started (reached the gate).
  void AwaitStarted(size_t n) {
    absl::MutexLock lock(&mu_);
    awaited_ = n;
    mu_.Await(absl::Condition(this, &FakeCompiler::StartedEnough));
  }
  int calls() const { return calls_.load(); }
  std::vector<int64_t> order() const {
    absl::MutexLock lock(&mu_);
    return order_;
  }

 private:
  bool StartedEnough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return started_.size() >= awaited_;
  }

  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  absl::Status fail_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> started_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> order_ ABSL_GUARDED_BY(mu_);
  size_t awaited_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> calls_{0};
  std::atomic<bool> honour_cancel_{false};
  std::atomic<int> cancelled_{0};
};

}  // namespace kiln::testing
