// CPU toolchain: C++ source text -> a shared object, built by the host C++ compiler in a
// private temporary directory (toolchain/subprocess.h). Knows no IR.
// Thread-safety: immutable after Create; Build may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/target.h"

namespace kiln::toolchain {

struct BuildOutput {
  std::string binary;
  std::string log;
  double ms = 0;
};

class HostCompiler {
 public:
  // Probes `compiler --version`; FailedPrecondition when it cannot run.
  static absl::StatusOr<std::unique_ptr<HostCompiler>> Create(const std::string& compiler,
                                                              double timeout_s);

  // The flags used for a target, in order (no file names).
  std::vector<std::string> Flags(const Target& target, const CompileOptions& options) const;
  // Compiler identity + flags + runtime header digest: what decides the output bytes.
  std::string Fingerprint(const Target& target, const CompileOptions& options) const;
  // `headers` are (file name, text) pairs placed beside the source.
  absl::StatusOr<BuildOutput> Build(const std::string& source,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    const Target& target, const CompileOptions& options) const;
  const std::string& version() const { return version_; }

 private:
  HostCompiler(std::string compiler, std::string version, double timeout_s)
      : compiler_(std::move(compiler)), version_(std::move(version)), timeout_s_(timeout_s) {}
  std::string compiler_;
  std::string version_;  // first line of --version
  double timeout_s_;
};

}  // namespace kiln::toolchain
