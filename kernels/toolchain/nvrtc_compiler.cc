#include "kernels/toolchain/nvrtc_compiler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#ifdef KILN_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace kiln::toolchain {

#ifdef KILN_HAVE_NVRTC

namespace {

bool HasHalfHeaders(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && std::filesystem::exists(dir + "/cuda_fp16.h", ec) &&
         std::filesystem::exists(dir + "/cuda_bf16.h", ec);
}

std::string FindIncludeDir(const std::string& wanted) {
  std::vector<std::string> candidates;
  if (!wanted.empty()) candidates.push_back(wanted);
#ifdef KILN_CUDA_INCLUDE_DIR
  candidates.push_back(KILN_CUDA_INCLUDE_DIR);
#endif
  if (const char* home = std::getenv("CUDA_HOME"))
    candidates.push_back(absl::StrCat(home, "/include"));
  candidates.push_back("/usr/local/cuda/include");
  for (const std::string& c : candidates)
    if (HasHalfHeaders(c)) return c;
  return "";
}

// Owns an nvrtcProgram for the length of one build.
class Program {
 public:
  explicit Program(nvrtcProgram p) : p_(p) {}
  ~Program() { nvrtcDestroyProgram(&p_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return p_; }

 private:
  nvrtcProgram p_;
};

absl::Status Check(nvrtcResult r, const char* what) {
  if (r == NVRTC_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("nvrtc ", what, ": ", nvrtcGetErrorString(r)));
}

}  // namespace

bool NvrtcCompiler::Available() { return true; }

absl::StatusOr<std::unique_ptr<NvrtcCompiler>> NvrtcCompiler::Create(
    const std::string& include_dir) {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
    return absl::FailedPreconditionError("NVRTC is linked but does not answer its version query");
  std::vector<int> archs;
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0) {
    archs.resize(n);
    if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) archs.clear();
  }
  return std::unique_ptr<NvrtcCompiler>(new NvrtcCompiler(
      absl::StrCat(major, ".", minor), FindIncludeDir(include_dir), std::move(archs)));
}

bool NvrtcCompiler::Supports(int sm) const {
  return std::find(archs_.begin(), archs_.end(), sm) != archs_.end();
}

std::vector<std::string> NvrtcCompiler::Options(int sm) const {
  return {
      // A real architecture: NVRTC then gives SASS (the cubin) and the PTX it came from.
      absl::StrCat("--gpu-architecture=sm_", sm),
      "-default-device",
      "--std=c++17",
      // IEEE single and double precision, as the CPU backend: correctly rounded division
      // and sqrt, denormals kept, and no contraction of a*b+c into one rounding.
      "--prec-div=true",
      "--prec-sqrt=true",
      "--ftz=false",
      "--fmad=false",
  };
}

std::string NvrtcCompiler::Fingerprint(int sm) const {
  return absl::StrCat("nvrtc ", version_, "|", absl::StrJoin(Options(sm), " "));
}

absl::StatusOr<CudaBuildOutput> NvrtcCompiler::Build(
    const std::string& source, const std::vector<std::pair<std::string, std::string>>& headers,
    int sm) const {
  auto t0 = std::chrono::steady_clock::now();
  bool needs_half = source.find("KILN_NEED_FP16") != std::string::npos ||
                    source.find("KILN_NEED_BF16") != std::string::npos;
  if (needs_half && include_dir_.empty())
    return absl::FailedPreconditionError(
        "the kernel uses f16/bf16 but cuda_fp16.h/cuda_bf16.h were not found (set CUDA_HOME)");
  std::vector<const char*> names, texts;
  for (const auto& [name, text] : headers) {
    names.push_back(name.c_str());
    texts.push_back(text.c_str());
  }
  nvrtcProgram raw = nullptr;
  nvrtcResult made =
      nvrtcCreateProgram(&raw, source.c_str(), "kernel.cu", static_cast<int>(headers.size()),
                         texts.data(), names.data());
  if (made != NVRTC_SUCCESS) return Check(made, "create program");
  Program prog(raw);
  std::vector<std::string> opts = Options(sm);
  if (needs_half) opts.push_back(absl::StrCat("--include-path=", include_dir_));
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  nvrtcResult compiled =
      nvrtcCompileProgram(prog.get(), static_cast<int>(argv.size()), argv.data());
  CudaBuildOutput out;
  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(prog.get(), &log_size) == NVRTC_SUCCESS && log_size > 1) {
    out.log.resize(log_size);
    nvrtcGetProgramLog(prog.get(), out.log.data());
    out.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (compiled != NVRTC_SUCCESS)
    return absl::InternalError(absl::StrCat("generated CUDA code failed to compile (nvrtc ",
                                            version_, ", sm_", sm, ": ",
                                            nvrtcGetErrorString(compiled), "):\n", out.log));
  size_t size = 0;
  if (auto st = Check(nvrtcGetCUBINSize(prog.get(), &size), "cubin size"); !st.ok()) return st;
  out.cubin.resize(size);
  if (auto st = Check(nvrtcGetCUBIN(prog.get(), out.cubin.data()), "cubin"); !st.ok()) return st;
  if (auto st = Check(nvrtcGetPTXSize(prog.get(), &size), "ptx size"); !st.ok()) return st;
  out.ptx.resize(size);
  if (auto st = Check(nvrtcGetPTX(prog.get(), out.ptx.data()), "ptx"); !st.ok()) return st;
  if (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

#else  // !KILN_HAVE_NVRTC

bool NvrtcCompiler::Available() { return false; }

absl::StatusOr<std::unique_ptr<NvrtcCompiler>> NvrtcCompiler::Create(const std::string&) {
  return absl::FailedPreconditionError(
      "this build of kiln has no CUDA toolkit (NVRTC): CUDA targets are unavailable");
}

bool NvrtcCompiler::Supports(int) const { return false; }
std::vector<std::string> NvrtcCompiler::Options(int) const { return {}; }
std::string NvrtcCompiler::Fingerprint(int) const { return "nvrtc unavailable"; }

absl::StatusOr<CudaBuildOutput> NvrtcCompiler::Build(
    const std::string&, const std::vector<std::pair<std::string, std::string>>&, int) const {
  return absl::FailedPreconditionError("this build of kiln has no CUDA toolkit (NVRTC)");
}

#endif

}  // namespace kiln::toolchain
