#include "server/ext/ext.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "kernels/key/digest.h"
#include "kernels/toolchain/subprocess.h"
#include "server/ext/cuda_toolkit.h"
#include "spdlog/spdlog.h"

namespace kiln::ext {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxLogBytes = 32 << 10;
constexpr int kMaxFlags = 512;
constexpr size_t kMaxFlagBytes = 4096;

std::string Deterministic(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

bool IsIdentifier(const std::string& s) {
  if (s.empty() || s.size() > 128 || absl::ascii_isdigit(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
}

bool IsPlainToken(const std::string& s, size_t max) {
  return s.size() <= max && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.' || c == '+';
         });
}

template <typename Request>
compile::Priority PriorityOf(const Request& r) {
  return r.priority() == v1::PREWARM ? compile::Priority::kPrewarm
                                     : compile::Priority::kInteractive;
}

bool IsCudaSource(const std::string& path) { return absl::EndsWith(path, ".cu"); }

bool IsCompilable(const std::string& path) {
  for (const char* ext : {".c", ".cc", ".cpp", ".cxx", ".cu"}) {
    if (absl::EndsWith(path, ext)) return true;
  }
  return false;
}

// The absolute path of `program` (as given when it has a '/', else on PATH), or empty.
std::string Which(const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos)
    return access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string p = absl::StrCat(dir, "/", program);
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// What `argv` prints (first line), run directly: for toolchain identities only.
std::string VersionOf(const std::vector<std::string>& argv) {
  absl::StatusOr<toolchain::ProcessResult> r =
      toolchain::RunSandboxed(argv, "/", toolchain::SandboxLimits{.timeout_s = 10});
  if (!r.ok() || r->exit_code != 0) return "";
  return std::string(absl::StripAsciiWhitespace(r->output));
}

std::string Truncated(const std::string& s) {
  if (s.size() <= kMaxLogBytes) return s;
  return absl::StrCat(s.substr(0, kMaxLogBytes), "\n[... ", s.size() - kMaxLogBytes,
                      " more bytes]");
}

absl::Status CheckFlags(const google::protobuf::RepeatedPtrField<std::string>& flags,
                        const char* field, int* total) {
  for (const std::string& f : flags) {
    if (++*total > kMaxFlags)
      return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxFlags, " flags"));
    if (f.size() > kMaxFlagBytes || f.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": a flag longer than ", kMaxFlagBytes, " bytes"));
    }
    if (std::string why = ForbiddenFlagReason(f); !why.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": flag '", f, "' is not allowed: ", why));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const v1::BuildExtensionRequest& r, bool* has_cuda,
                      std::vector<CudaTarget>* targets) {
  if (!IsIdentifier(r.name())) {
    return absl::InvalidArgumentError(absl::StrCat("name '", r.name(), "' is not a C identifier"));
  }
  if (!IsHexDigest(r.source_tree()))
    return absl::InvalidArgumentError("source_tree: not a SHA-256 digest");
  if (r.compile_size() == 0) return absl::InvalidArgumentError("compile: no source to compile");
  if (r.compile_size() > 256) return absl::InvalidArgumentError("compile: more than 256 sources");
  *has_cuda = false;
  for (const std::string& c : r.compile()) {
    if (!IsCleanRelativePath(c))
      return absl::InvalidArgumentError(
          absl::StrCat("compile: '", c, "' is not a clean relative path"));
    if (!IsCompilable(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("compile: '", c, "' is not a .c, .cc, .cpp, .cxx or .cu file"));
    }
    *has_cuda |= IsCudaSource(c);
  }
  if (r.include_dirs_size() > 64) return absl::InvalidArgumentError("include_dirs: more than 64");
  for (const v1::IncludeDir& d : r.include_dirs()) {
    if (!IsHexDigest(d.tree()))
      return absl::InvalidArgumentError("include_dirs: a tree is not a SHA-256 digest");
    if (!d.subdir().empty() && !IsCleanRelativePath(d.subdir())) {
      return absl::InvalidArgumentError(
          absl::StrCat("include_dirs: subdir '", d.subdir(), "' is not a clean relative path"));
    }
  }
  int total = 0;
  for (auto [flags, field] :
       {std::pair{&r.cflags(), "cflags"}, std::pair{&r.cuda_cflags(), "cuda_cflags"},
        std::pair{&r.ldflags(), "ldflags"}}) {
    if (absl::Status s = CheckFlags(*flags, field, &total); !s.ok()) return s;
  }
  absl::StatusOr<std::vector<CudaTarget>> archs = CudaTargets(r);
  if (!archs.ok()) return archs.status();
  if (*has_cuda && archs->empty()) {
    return absl::InvalidArgumentError(
        "cuda_archs: .cu sources need at least one architecture (TORCH_CUDA_ARCH_LIST)");
  }
  *targets = *std::move(archs);
  if (!IsPlainToken(r.python_tag(), 128))
    return absl::InvalidArgumentError("python_tag: not a plain token");
  if (r.link_sonames_size() > 32) return absl::InvalidArgumentError("link_sonames: more than 32");
  for (const std::string& so : r.link_sonames()) {
    if (!absl::StartsWith(so, "lib") || so.find(".so") == std::string::npos ||
        !IsPlainToken(so, 128)) {
      return absl::InvalidArgumentError(
          absl::StrCat("link_sonames: '", so, "' is not a library soname"));
    }
  }
  if (r.client_abi_size() > 32)
    return absl::InvalidArgumentError("client_abi: more than 32 entries");
  for (const auto& [k, v] : r.client_abi()) {
    if (k.size() > 128 || v.size() > 1024)
      return absl::InvalidArgumentError("client_abi: an entry is too long");
  }
  return absl::OkStatus();
}

// Processes one sandboxed compile runs at once (bwrap's two, the driver, the compiler proper,
// the assembler, with room), and each further nvcc thread (cicc, ptxas): a build's commands
// running at once share its process cap, so it bounds how many run.
constexpr int kProcessesPerCommand = 8;
constexpr int kProcessesPerNvccThread = 4;

// Whether `flags` choose nvcc's thread count themselves.
bool SetsNvccThreads(const google::protobuf::RepeatedPtrField<std::string>& flags) {
  return std::any_of(flags.begin(), flags.end(), [](const std::string& f) {
    return f == "-t" || absl::StartsWith(f, "--threads") ||
           (absl::StartsWith(f, "-t") && f.size() > 2 && absl::ascii_isdigit(f[2])) ||
           absl::StartsWith(f, "-t=") || absl::StartsWith(f, "--split-compile") ||
           absl::StartsWith(f, "-split-compile");
  });
}

// The outcome of one sandboxed step as the caller sees it.
absl::Status StepStatus(const absl::StatusOr<toolchain::ProcessResult>& r, const std::string& what,
                        double timeout_s, std::string* log) {
  if (!r.ok()) {
    if (absl::IsDeadlineExceeded(r.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " ran past the build time limit (", timeout_s, " s)"));
    }
    return absl::UnavailableError(absl::StrCat(what, ": ", r.status().message()));
  }
  absl::StrAppend(log, r->output);
  if (r->signal != 0) {
    const char* limit = r->signal == SIGXCPU   ? "the CPU time limit"
                        : r->signal == SIGXFSZ ? "the output size limit"
                                               : "a limit";
    return absl::ResourceExhaustedError(absl::StrCat(what, " was killed by signal ", r->signal,
                                                     " (", limit, "):\n", Truncated(r->output)));
  }
  if (r->exit_code != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " failed (exit ", r->exit_code, "):\n", Truncated(r->output)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ForbiddenFlagReason(const std::string& flag) {
  if (absl::StartsWith(flag, "@")) return "response files are not read";
  // Comma-separated pass-through lists: to the linker (whose own -B... flags are harmless)...
  for (const char* pass : {"-Wl,", "-Xlinker=", "--linker-options=", "-Wa,"}) {
    if (absl::StartsWith(flag, pass)) {
      for (absl::string_view part : absl::StrSplit(flag.substr(strlen(pass)), ',')) {
        if (absl::StartsWith(part, "@")) return "response files are not read";
        if (absl::StartsWith(part, "--plugin") || absl::StartsWith(part, "-plugin"))
          return "it loads a plugin into the linker";
      }
      return "";
    }
  }
  // ... and to the host compiler through nvcc or the driver: every element is a flag of its own.
  for (const char* pass : {"-Xcompiler=", "--compiler-options=", "-Wp,"}) {
    if (absl::StartsWith(flag, pass)) {
      for (absl::string_view part : absl::StrSplit(flag.substr(strlen(pass)), ',')) {
        if (std::string why = ForbiddenFlagReason(std::string(part)); !why.empty()) return why;
      }
      return "";
    }
  }
  struct Rule {
    const char* prefix;
    const char* why;
  };
  static constexpr Rule kRules[] = {
      {"-fplugin", "it loads a plugin into the compiler"},
      {"-iplugindir", "it loads a plugin into the compiler"},
      {"--plugin", "it loads a plugin into the linker"},
      {"-plugin", "it loads a plugin into the linker"},
      {"-specs", "a specs file can run any program"},
      {"--specs", "a specs file can run any program"},
      {"-B", "it chooses which programs the compiler runs"},
      {"-wrapper", "it runs a program around the compiler's"},
      {"-fuse-ld", "it chooses the linker program"},
      {"-ccbin", "it chooses nvcc's host compiler"},
      {"--compiler-bindir", "it chooses nvcc's host compiler"},
      {"-optf", "option files are not read"},
      {"--options-file", "option files are not read"},
      {"--run", "it runs the program built"},
      {"-run", "it runs the program built"},
      {"-o", "kilnd names the outputs"},
      {"--output-file", "kilnd names the outputs"},
      {"--output-directory", "kilnd names the outputs"},
  };
  for (const Rule& rule : kRules) {
    if (absl::StartsWith(flag, rule.prefix)) {
      // Exact flags that merely share a prefix with a rule.
      if (flag == "-rdynamic" || absl::StartsWith(flag, "-O") || absl::StartsWith(flag, "-pthread"))
        return "";
      return rule.why;
    }
  }
  return "";
}

ExtensionBuilder::ExtensionBuilder(ExtOptions options, store::ArtifactStore* store)
    : options_(std::move(options)),
      store_(store),
      failures_(options_.negative_ttl),
      slots_(options_.jobs > 0
                 ? options_.jobs
                 : std::max<int>({1, options_.workers,
                                  static_cast<int>(std::thread::hardware_concurrency())})),
      pool_(std::max(1, options_.workers), std::max<int64_t>(1, options_.queue_size)) {}

ExtensionBuilder::~ExtensionBuilder() { pool_.Stop(absl::Now() + absl::Seconds(1)); }

absl::StatusOr<std::unique_ptr<ExtensionBuilder>> ExtensionBuilder::Create(
    const ExtOptions& options, store::ArtifactStore* store) {
  ExtOptions resolved = options;
  resolved.cxx = Which(options.cxx);
  resolved.nvrtc_tool = Which(options.nvrtc_tool);
  // nvcc runs by its real path; the sandbox holds its toolkit and the links that name it, so
  // that an include naming /usr/local/cuda/... finds the same files inside.
  const CudaToolkit toolkit = FindCudaToolkit(
      options.nvcc, [](const char* name) -> const char* { return std::getenv(name); });
  resolved.nvcc = toolkit.nvcc;
  if (!toolkit.mount.empty()) resolved.sandbox.toolchain_dirs.push_back(toolkit.mount);
  for (const auto& link : toolkit.links) resolved.sandbox.toolchain_links.push_back(link);
  if (!toolkit.nvcc.empty()) {
    spdlog::info("custom builds: nvcc {} ({})", toolkit.nvcc, toolkit.how);
  } else {
    spdlog::info("custom builds: no nvcc ({}): .cu sources are refused", toolkit.how);
  }
  std::unique_ptr<ExtensionBuilder> b(new ExtensionBuilder(std::move(resolved), store));
  b->nvcc_search_ = toolkit.how;
  if (options.scratch_dir.empty()) {
    absl::StatusOr<toolchain::TempDir> scratch = toolchain::TempDir::Create("kiln-builds-");
    if (!scratch.ok()) return scratch.status();
    b->scratch_ = std::make_unique<toolchain::TempDir>(std::move(*scratch));
    b->scratch_path_ = b->scratch_->path();
  } else {
    b->scratch_path_ = options.scratch_dir;
    std::error_code ec;
    fs::create_directories(b->scratch_path_, ec);
  }
  // Traversable, not listable, by the sandbox's identity.
  chmod(b->scratch_path_.c_str(), 0711);
  const std::string trees = b->scratch_path_ + "/trees";
  absl::StatusOr<std::unique_ptr<InputStore>> inputs =
      InputStore::Open(options.dir, trees, options.input_capacity_bytes, options.shared_inputs);
  chmod(trees.c_str(), 0711);
  // The NVRTC program, where the sandbox can reach it.
  if (!b->options_.nvrtc_tool.empty()) {
    const std::string copy = b->scratch_path_ + "/kiln-nvrtc";
    std::error_code ec;
    fs::copy_file(b->options_.nvrtc_tool, copy, fs::copy_options::overwrite_existing, ec);
    if (!ec) {
      chmod(copy.c_str(), 0755);
      b->nvrtc_in_scratch_ = copy;
    }
  }
  if (!inputs.ok()) return inputs.status();
  b->inputs_ = std::move(*inputs);
  if (b->options_.cxx.empty()) {
    b->unavailable_ = absl::StrCat("no host compiler '", options.cxx, "' on this server");
  } else if (absl::Status probe = ProbeSandbox(b->options_.sandbox); !probe.ok()) {
    b->unavailable_ = std::string(probe.message());
  }
  if (!b->unavailable_.empty()) spdlog::warn("custom builds are off: {}", b->unavailable_);
  return b;
}

void ExtensionBuilder::ReadVersions() {
  // On first use, not at start: a host compiler that hangs must not hold up kilnd's start.
  absl::call_once(versions_once_, [this] {
    if (!options_.cxx.empty()) {
      cxx_version_ = absl::StrCat(VersionOf({options_.cxx, "-dumpfullversion"}), " ",
                                  VersionOf({options_.cxx, "-dumpmachine"}));
    }
    if (!options_.nvcc.empty()) nvcc_version_ = VersionOf({options_.nvcc, "--version"});
    if (!nvrtc_in_scratch_.empty()) nvrtc_version_ = VersionOf({nvrtc_in_scratch_, "--version"});
  });
}

std::string ExtensionBuilder::Fingerprint(bool cuda) {
  ReadVersions();
  return absl::StrCat("cxx=", cxx_version_, "\nnvcc=", cuda ? nvcc_version_ : "", "\n");
}

v1::FindMissingBlobsResponse ExtensionBuilder::FindMissing(
    const v1::FindMissingBlobsRequest& request) {
  v1::FindMissingBlobsResponse out;
  for (const std::string& d : request.digests()) {
    if (!IsHexDigest(d) || !inputs_->Reachable(d)) out.add_missing(d);
  }
  return out;
}

absl::StatusOr<v1::UploadBlobsResponse> ExtensionBuilder::Upload(
    const v1::UploadBlobsRequest& request) {
  int64_t total = 0;
  for (const std::string& b : request.blobs()) total += static_cast<int64_t>(b.size());
  if (total > options_.max_upload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an upload of ", total, " bytes is over the limit of ",
                     options_.max_upload_bytes, " per call: split it"));
  }
  v1::UploadBlobsResponse out;
  for (const std::string& b : request.blobs()) {
    absl::StatusOr<std::string> hex = inputs_->Put(b);
    if (!hex.ok()) return hex.status();
    out.add_digests(*hex);
  }
  return out;
}

template <typename Response>
bool ExtensionBuilder::ServeStored(const std::string& key, Response* response) {
  absl::StatusOr<std::optional<v1::ActionResult>> cached = store_->GetResult(key);
  if (!cached.ok() || !cached->has_value()) return false;
  hits_.fetch_add(1);
  *response->mutable_result() = std::move(**cached);
  response->set_cache_hit(true);
  return true;
}

template <typename Response>
std::function<void(ExtensionBuilder::Outcome)> ExtensionBuilder::Answer(
    Response response, std::function<void(absl::Status, Response)> done,
    std::chrono::steady_clock::time_point start) {
  return [response = std::move(response), done = std::move(done), start](Outcome o) mutable {
    if (!o.status.ok()) return done(o.status, {});
    *response.mutable_result() = *o.result;
    response.set_server_ms(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    done(absl::OkStatus(), std::move(response));
  };
}

void ExtensionBuilder::GetOrBuild(const std::string& key, compile::Priority priority,
                                  std::function<absl::StatusOr<v1::ActionResult>()> build,
                                  std::function<void(Outcome)> done) {
  {
    absl::MutexLock lock(&mu_);
    auto it = in_flight_.find(key);
    if (it != in_flight_.end()) {
      it->second.push_back(std::move(done));
      return;
    }
    in_flight_[key].push_back(std::move(done));
  }
  auto finish = [this, key](Outcome outcome) {
    std::vector<std::function<void(Outcome)>> waiters;
    {
      absl::MutexLock lock(&mu_);
      waiters = std::move(in_flight_[key]);
      in_flight_.erase(key);
    }
    for (auto& w : waiters) w(outcome);
  };
  absl::Status submitted = pool_.Submit(priority, [this, key, build = std::move(build), finish] {
    Outcome outcome;
    absl::StatusOr<v1::ActionResult> result = build();
    if (!result.ok()) {
      failures_count_.fetch_add(1);
      if (!absl::IsUnavailable(result.status())) failures_.Put(key, result.status(), absl::Now());
      outcome.status = result.status();
    } else {
      outcome.result = std::make_shared<const v1::ActionResult>(std::move(*result));
    }
    finish(std::move(outcome));
  });
  if (!submitted.ok()) finish(Outcome{submitted, nullptr, false});
}

void ExtensionBuilder::Build(const v1::BuildExtensionRequest& request, BuildCallback done) {
  auto start = Clock::now();
  auto ms = [start] {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  if (!unavailable_.empty()) return done(absl::FailedPreconditionError(unavailable_), {});
  bool has_cuda = false;
  std::vector<CudaTarget> targets;
  if (absl::Status s = Validate(request, &has_cuda, &targets); !s.ok()) return done(s, {});
  if (has_cuda && options_.nvcc.empty()) {
    return done(
        absl::FailedPreconditionError(absl::StrCat("this server has no nvcc (looked at ",
                                                   nvcc_search_, "): it cannot build .cu sources")),
        {});
  }
  v1::BuildExtensionRequest canon = request;
  canon.clear_priority();
  SetCanonicalTargets(targets, &canon);
  const std::string key = key::Sha256Hex(
      absl::StrCat("kiln-ext-v1\n", Deterministic(canon), "\n", Fingerprint(has_cuda)));
  v1::BuildExtensionResponse response;
  response.set_handle(key);
  if (ServeStored(key, &response)) {
    response.set_server_ms(ms());
    return done(absl::OkStatus(), std::move(response));
  }
  if (absl::Status failed = failures_.Get(key, absl::Now()); !failed.ok()) return done(failed, {});
  std::vector<std::string> missing = inputs_->MissingFor(request.source_tree());
  for (const v1::IncludeDir& d : request.include_dirs()) {
    for (std::string& m : inputs_->MissingFor(d.tree())) missing.push_back(std::move(m));
  }
  if (!missing.empty()) {
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    for (std::string& m : missing) response.add_missing(std::move(m));
    response.set_server_ms(ms());
    return done(absl::OkStatus(), std::move(response));
  }
  GetOrBuild(
      key, PriorityOf(request),
      [this, request, targets = std::move(targets), key] {
        return RunBuild(request, targets, key);
      },
      Answer(std::move(response), std::move(done), start));
}

absl::StatusOr<v1::ActionResult> ExtensionBuilder::RunBuild(
    const v1::BuildExtensionRequest& request, const std::vector<CudaTarget>& targets,
    const std::string& key) {
  if (absl::StatusOr<std::optional<v1::ActionResult>> again = store_->GetResult(key);
      again.ok() && again->has_value()) {
    return std::move(**again);
  }
  builds_.fetch_add(1);
  auto start = Clock::now();
  const double budget = options_.sandbox.limits.timeout_s;
  auto remaining = [&] {
    return budget - std::chrono::duration<double>(Clock::now() - start).count();
  };
  absl::StatusOr<toolchain::TempDir> tmp = toolchain::TempDir::CreateIn(scratch_path_, "ext-");
  if (!tmp.ok()) return tmp.status();
  const std::string out = tmp->path() + "/out";
  std::error_code ec;
  fs::create_directories(out + "/stubs", ec);
  chmod(tmp->path().c_str(), 0755);
  for (const std::string& d : {out, out + "/stubs"}) {
    if (absl::Status s = PrepareWritable(options_.sandbox, d); !s.ok()) return s;
  }
  std::vector<Mount> mounts;
  absl::StatusOr<std::string> src = inputs_->Materialize(request.source_tree());
  if (!src.ok())
    return absl::UnavailableError(absl::StrCat("source tree: ", src.status().message()));
  mounts.push_back({*src, "/src", false});
  std::vector<std::string> includes = {"-I/src"};
  absl::flat_hash_map<std::string, std::string> tree_mounts;
  for (const v1::IncludeDir& d : request.include_dirs()) {
    auto [it, fresh] = tree_mounts.try_emplace(d.tree(), absl::StrCat("/inc/", tree_mounts.size()));
    if (fresh) {
      absl::StatusOr<std::string> dir = inputs_->Materialize(d.tree());
      if (!dir.ok())
        return absl::UnavailableError(absl::StrCat("include tree: ", dir.status().message()));
      mounts.push_back({*dir, it->second, false});
    }
    std::string dir = absl::StrCat(it->second, d.subdir().empty() ? "" : "/", d.subdir());
    if (d.system()) {
      includes.push_back("-isystem");  // nvcc takes it as two arguments only
      includes.push_back(std::move(dir));
    } else {
      includes.push_back("-I" + dir);
    }
  }
  mounts.push_back({out, "/out", true});
  spdlog::info("extension {}: inputs in place after {:.0f} ms", request.name(),
               std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  for (const std::string& c : request.compile()) {
    if (!fs::is_regular_file(fs::path(*src) / c, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("compile: '", c, "' is not in the source tree"));
    }
  }
  // One sandboxed command, holding a job slot while it runs.
  auto step = [&](const std::string& what, const std::vector<std::string>& argv,
                  std::string* log) -> absl::Status {
    slots_.Acquire();
    const auto began = Clock::now();
    double left = remaining();
    absl::Status s = left <= 0
                         ? absl::ResourceExhaustedError(absl::StrCat(
                               what, ": the build time limit (", budget, " s) is spent"))
                         : StepStatus(RunInSandbox(options_.sandbox, mounts, "/out", argv, left),
                                      what, budget, log);
    slots_.Release();
    // Each step's time, so a slow build shows which command it waited for.
    spdlog::info("extension {}: {} took {:.0f} ms", request.name(), what,
                 std::chrono::duration<double, std::milli>(Clock::now() - began).count());
    return s;
  };
  // The link stubs and the translation units: independent of each other, run several at once.
  struct Command {
    std::string what;
    std::vector<std::string> argv;
  };
  std::vector<Command> commands;
  for (const std::string& so : request.link_sonames()) {
    commands.push_back(
        {absl::StrCat("stub ", so),
         {options_.cxx, "-shared", "-nostdlib", "-o", absl::StrCat("/out/stubs/", so),
          absl::StrCat("-Wl,-soname,", so), "-x", "c", "/dev/null"}});
  }
  // nvcc builds a file's architectures on threads of its own, unless the flags say otherwise.
  const int nvcc_threads = SetsNvccThreads(request.cuda_cflags())
                               ? 1
                               : std::clamp(GencodeCount(targets), 1, slots_.size());
  std::vector<std::string> objects;
  bool has_cuda = false;
  for (int i = 0; i < request.compile_size(); ++i) {
    const std::string& c = request.compile(i);
    std::string obj = absl::StrCat("/out/obj", i, ".o");
    std::vector<std::string> argv;
    if (IsCudaSource(c)) {
      has_cuda = true;
      argv = {options_.nvcc, "-c", "/src/" + c, "-o", obj, "-Xcompiler", "-fPIC"};
      argv.insert(argv.end(), includes.begin(), includes.end());
      for (std::string& flag : GencodeFlags(targets)) argv.push_back(std::move(flag));
      if (nvcc_threads > 1) argv.insert(argv.end(), {"--threads", absl::StrCat(nvcc_threads)});
      argv.insert(argv.end(), request.cuda_cflags().begin(), request.cuda_cflags().end());
    } else {
      argv = {options_.cxx, "-c", "/src/" + c, "-o", obj, "-fPIC", "-fdiagnostics-color=never"};
      argv.insert(argv.end(), includes.begin(), includes.end());
      argv.insert(argv.end(), request.cflags().begin(), request.cflags().end());
    }
    commands.push_back({absl::StrCat("compiling ", c), std::move(argv)});
    objects.push_back(obj);
  }
  const int per_command =
      kProcessesPerCommand + (has_cuda ? (nvcc_threads - 1) * kProcessesPerNvccThread : 0);
  const int64_t max_processes = options_.sandbox.limits.max_processes;
  const int lanes = static_cast<int>(std::min<int64_t>(
      slots_.size(),
      max_processes > 0 ? std::max<int64_t>(1, max_processes / per_command) : slots_.size()));
  std::vector<std::string> logs;
  absl::Status compiled = RunAll(
      static_cast<int>(commands.size()), lanes,
      [&](int i, std::string* out) { return step(commands[i].what, commands[i].argv, out); },
      &logs);
  std::string log = absl::StrJoin(logs, "");
  if (!compiled.ok()) return compiled;
  const std::string module = absl::StrCat("/out/", request.name(), ".so");
  std::vector<std::string> link = {options_.cxx, "-shared", "-o", module};
  link.insert(link.end(), objects.begin(), objects.end());
  link.insert(link.end(), {"-L/out/stubs", "-Wl,--no-as-needed"});
  for (const std::string& so : request.link_sonames()) link.push_back("-l:" + so);
  if (has_cuda) {
    fs::path cuda_root = fs::canonical(options_.nvcc, ec).parent_path().parent_path();
    link.insert(link.end(), {absl::StrCat("-L", (cuda_root / "lib64").string()), "-lcudart_static",
                             "-ldl", "-lrt", "-lpthread"});
  }
  link.insert(link.end(), request.ldflags().begin(), request.ldflags().end());
  if (absl::Status s = step("linking", link, &log); !s.ok()) return s;
  const std::string host_module = out + module.substr(4);
  if (fs::file_size(host_module, ec) > static_cast<uintmax_t>(options_.max_artifact_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat("the module is larger than the limit of ",
                                                     options_.max_artifact_bytes, " bytes"));
  }
  absl::StatusOr<std::string> bytes = toolchain::ReadFile(host_module);
  if (!bytes.ok()) return absl::InternalError("the build produced no module");
  v1::ActionResult result;
  v1::Artifact* a = result.add_artifacts();
  a->set_kind(v1::SHARED_OBJECT);
  a->set_digest(key::Sha256Hex(*bytes));
  a->set_size(static_cast<int64_t>(bytes->size()));
  result.set_compile_log(Truncated(log));
  result.mutable_stats()->set_toolchain_ms(
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  result.mutable_stats()->set_total_ms(result.stats().toolchain_ms());
  for (auto [label, value] : {std::pair<std::string, std::string>{"kind", "extension"},
                              {"name", request.name()},
                              {"cuda_archs", TargetsLabel(targets)},
                              {"python_tag", request.python_tag()},
                              {"toolchain", Fingerprint(has_cuda)}}) {
    v1::KeyField* f = result.add_key_fields();
    f->set_label(label);
    f->set_value(value);
  }
  if (options_.sign) {
    if (absl::Status s = options_.sign(key, &result); !s.ok()) return s;
  }
  if (absl::Status s = store_->PutResult(key, result, {*bytes}); !s.ok()) {
    spdlog::warn("extension {}: not stored: {}", request.name(), std::string(s.message()));
  }
  spdlog::info("extension {} built in {:.0f} ms ({} bytes)", request.name(),
               result.stats().toolchain_ms(), bytes->size());
  return result;
}

void ExtensionBuilder::CompileRaw(const v1::CompileRawKernelRequest& request, RawCallback done) {
  auto start = Clock::now();
  auto ms = [start] {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  if (!unavailable_.empty()) return done(absl::FailedPreconditionError(unavailable_), {});
  if (nvrtc_in_scratch_.empty()) {
    return done(absl::FailedPreconditionError(
                    "this server has no NVRTC: it cannot compile raw CUDA kernels"),
                {});
  }
  if (request.source().empty() || request.source().size() > (size_t{8} << 20)) {
    return done(absl::InvalidArgumentError("source: empty or larger than 8 MiB"), {});
  }
  if (request.name().empty() || request.name().size() > 1024 ||
      request.name().find('\0') != std::string::npos) {
    return done(absl::InvalidArgumentError("name: empty or malformed"), {});
  }
  if (request.sm() < 50 || request.sm() > 199) {
    return done(absl::InvalidArgumentError(absl::StrCat(
                    "sm: sm_", request.sm(), " is not a CUDA architecture kilnd builds for")),
                {});
  }
  if (request.options_size() > 128)
    return done(absl::InvalidArgumentError("options: more than 128"), {});
  for (const std::string& o : request.options()) {
    if (o.empty() || o[0] != '-' || o.size() > kMaxFlagBytes) {
      return done(
          absl::InvalidArgumentError(absl::StrCat("options: '", o, "' is not an NVRTC option")),
          {});
    }
    if (absl::StartsWith(o, "-arch") || absl::StartsWith(o, "--gpu-architecture")) {
      return done(absl::InvalidArgumentError(
                      absl::StrCat("options: '", o, "': the architecture comes from `sm`")),
                  {});
    }
  }
  v1::CompileRawKernelRequest canon = request;
  canon.clear_priority();
  ReadVersions();
  const std::string key = key::Sha256Hex(
      absl::StrCat("kiln-raw-v1\n", Deterministic(canon), "\nnvrtc=", nvrtc_version_));
  v1::CompileRawKernelResponse response;
  response.set_handle(key);
  if (ServeStored(key, &response)) {
    response.set_server_ms(ms());
    return done(absl::OkStatus(), std::move(response));
  }
  if (absl::Status failed = failures_.Get(key, absl::Now()); !failed.ok()) return done(failed, {});
  GetOrBuild(
      key, PriorityOf(request), [this, request, key] { return RunRaw(request, key); },
      Answer(std::move(response), std::move(done), start));
}

absl::StatusOr<v1::ActionResult> ExtensionBuilder::RunRaw(
    const v1::CompileRawKernelRequest& request, const std::string& key) {
  builds_.fetch_add(1);
  auto start = Clock::now();
  absl::StatusOr<toolchain::TempDir> tmp = toolchain::TempDir::CreateIn(scratch_path_, "raw-");
  if (!tmp.ok()) return tmp.status();
  const std::string out = tmp->path() + "/out";
  std::error_code ec;
  fs::create_directories(out, ec);
  chmod(tmp->path().c_str(), 0755);
  if (absl::Status s = toolchain::WriteFile(out + "/kernel.cu", request.source()); !s.ok())
    return s;
  chmod((out + "/kernel.cu").c_str(), 0644);
  if (absl::Status s = PrepareWritable(options_.sandbox, out); !s.ok()) return s;
  std::vector<Mount> mounts = {{out, "/out", true},
                               {nvrtc_in_scratch_, "/opt/kiln/kiln-nvrtc", false}};
  std::vector<std::string> argv = {"/opt/kiln/kiln-nvrtc", "/out/kernel.cu", "/out/kernel.cubin",
                                   absl::StrCat("sm_", request.sm()), request.name()};
  argv.insert(argv.end(), request.options().begin(), request.options().end());
  std::string log;
  const double budget = options_.sandbox.limits.timeout_s;
  absl::Status s = StepStatus(RunInSandbox(options_.sandbox, mounts, "/out", argv, budget),
                              absl::StrCat("NVRTC on '", request.name(), "'"), budget, &log);
  if (!s.ok()) return s;
  absl::StatusOr<std::string> cubin = toolchain::ReadFile(out + "/kernel.cubin");
  absl::StatusOr<std::string> lowered = toolchain::ReadFile(out + "/kernel.cubin.name");
  if (!cubin.ok() || !lowered.ok()) return absl::InternalError("NVRTC produced no cubin");
  if (static_cast<int64_t>(cubin->size()) > options_.max_artifact_bytes) {
    return absl::ResourceExhaustedError("the cubin is larger than the artifact limit");
  }
  v1::ActionResult result;
  v1::Artifact* a = result.add_artifacts();
  a->set_kind(v1::CUBIN);
  a->set_digest(key::Sha256Hex(*cubin));
  a->set_size(static_cast<int64_t>(cubin->size()));
  // The entry point the cubin exports (the lowered name of `name`).
  result.mutable_plan()->add_steps()->set_kernel(std::string(absl::StripAsciiWhitespace(*lowered)));
  result.mutable_target()->mutable_cuda()->set_sm(request.sm());
  result.set_compile_log(Truncated(log));
  result.mutable_stats()->set_toolchain_ms(
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  if (options_.sign) {
    if (absl::Status signed_ok = options_.sign(key, &result); !signed_ok.ok()) return signed_ok;
  }
  if (absl::Status put = store_->PutResult(key, result, {*cubin}); !put.ok()) {
    spdlog::warn("raw kernel {}: not stored: {}", request.name(), std::string(put.message()));
  }
  return result;
}

ExtStats ExtensionBuilder::Stats() const {
  return ExtStats{builds_.load(), failures_count_.load(), hits_.load(), inputs_->blobs(),
                  inputs_->bytes()};
}

void ExtensionBuilder::AddStats(v1::GetStatsResponse* response) const {
  const ExtStats s = Stats();
  response->set_ext_builds(s.builds);
  response->set_ext_failures(s.failures);
  response->set_ext_cache_hits(s.cache_hits);
  response->set_ext_input_blobs(s.input_blobs);
  response->set_ext_input_bytes(s.input_bytes);
}

}  // namespace kiln::ext
