#include "kernels/toolchain/host_compiler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/toolchain/subprocess.h"
#include "kernels/util/status_macros.h"

namespace kiln::toolchain {

absl::StatusOr<std::unique_ptr<HostCompiler>> HostCompiler::Create(const std::string& compiler,
                                                                   double timeout_s) {
  KILN_ASSIGN_OR_RETURN(TempDir dir, TempDir::Create("kiln-probe-"));
  auto r = RunSandboxed({compiler, "--version"}, dir.path(), SandboxLimits{10});
  if (!r.ok() || r->exit_code != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("host compiler '", compiler, "' does not run"));
  std::string version = r->output.substr(0, r->output.find('\n'));
  return std::unique_ptr<HostCompiler>(new HostCompiler(compiler, version, timeout_s));
}

std::vector<std::string> HostCompiler::Flags(const Target& target,
                                             const CompileOptions& options) const {
  std::vector<std::string> f = {
      absl::StrCat("-O", options.opt_level),
      "-std=c++17",
      "-fPIC",
      "-shared",
      "-fopenmp",
      // No errno from math calls, so they vectorise; IEEE semantics (NaN, inf, signed zero,
      // evaluation order) are otherwise kept: no -ffast-math.
      "-fno-math-errno",
      "-fno-trapping-math",
      // GCC merges sin(x) and cos(x) into a scalar sincos call before vectorising, which
      // loses the vector variants: keep the two apart.
      "-fno-builtin-sin",
      "-fno-builtin-cos",
      "-fno-builtin-sinf",
      "-fno-builtin-cosf",
      "-fno-exceptions",
      "-fno-rtti",
      "-fvisibility=hidden",
      "-fno-semantic-interposition",
      "-w",
      // libstdc++ is not needed at load time: the generated code uses no library C++.
      "-Wl,--as-needed",
      "-Wl,-O1",
      "-static-libgcc",
  };
  if (!target.isa.empty()) {
    f.push_back(absl::StrCat("-march=", target.isa));
  } else {
    f.push_back("-march=x86-64");
    for (const std::string& feature : target.features) f.push_back(absl::StrCat("-m", feature));
  }
  f.push_back("-mtune=generic");
  if (target.isa == "x86-64-v4" ||
      std::count(target.features.begin(), target.features.end(), "avx512f"))
    f.push_back("-mprefer-vector-width=512");
  return f;
}

std::string HostCompiler::Fingerprint(const Target& target, const CompileOptions& options) const {
  return absl::StrCat(version_, "|", absl::StrJoin(Flags(target, options), " "));
}

absl::StatusOr<BuildOutput> HostCompiler::Build(
    const std::string& source, const std::vector<std::pair<std::string, std::string>>& headers,
    const Target& target, const CompileOptions& options) const {
  KILN_ASSIGN_OR_RETURN(TempDir dir, TempDir::Create("kiln-build-"));
  KILN_RETURN_IF_ERROR(WriteFile(dir.path() + "/kernel.cc", source));
  for (const auto& [name, text] : headers)
    KILN_RETURN_IF_ERROR(WriteFile(dir.path() + "/" + name, text));
  std::vector<std::string> argv = {compiler_};
  for (std::string& f : Flags(target, options)) argv.push_back(std::move(f));
  argv.insert(argv.end(), {"-I.", "kernel.cc", "-o", "kernel.so"});
  SandboxLimits limits;
  limits.timeout_s = timeout_s_;
  KILN_ASSIGN_OR_RETURN(ProcessResult r, RunSandboxed(argv, dir.path(), limits));
  BuildOutput out;
  out.log = r.output;
  out.ms = r.ms;
  if (r.exit_code != 0)
    return absl::InternalError(
        absl::StrCat("generated code failed to compile (", compiler_, " exit ", r.exit_code,
                     r.signal ? absl::StrCat(", signal ", r.signal) : "", "):\n", r.output));
  KILN_ASSIGN_OR_RETURN(out.binary, ReadFile(dir.path() + "/kernel.so"));
  return out;
}

}  // namespace kiln::toolchain
