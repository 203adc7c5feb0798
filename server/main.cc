// kilnd: the kiln compile server.
//
// Wires the concrete pieces together (this is the only file naming them): the RocksDB store,
// the kernel compiler, the compile service and the gRPC service, plus the standard health
// and reflection services, and with --metrics-listen a Prometheus endpoint. With
// --shared-cache the store becomes Tiered(RocksDB L1, Redis L2), compiles are coordinated
// with the other replicas through Redis leases, and the health service "kiln.SharedCache"
// reports whether Redis is reachable. Prints "kilnd
// metrics on HOST:PORT" when that endpoint is bound, then "kilnd listening on HOST:PORT" once
// gRPC serves (with port 0 the port is the one the system chose). On SIGTERM or SIGINT it
// turns lame duck (health NOT_SERVING, /healthz 503, new compiles refused), lets queued and
// running compiles finish within --grace-s, stops gRPC and the metrics endpoint, closes the
// store and exits 0; a second signal exits at once. On SIGHUP it re-reads the TLS
// certificates, the token file and the signing keys; a set that does not load is logged and
// the one in use stays, and no connection or call is dropped either way.
//
// `kilnd keygen PRIVATE.pem [PUBLIC.pem]` writes a new Ed25519 key pair for --signing-key (the
// public key, by default PRIVATE.pem.pub, is what clients trust) and exits.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "kernels/util/status_macros.h"
#include "server/auth/auth.h"
#include "server/compile/compile_service.h"
#include "server/compile/compiler.h"
#include "server/metrics.h"
#include "server/service.h"
#include "server/shared/lease_manager.h"
#include "server/shared/redis_client.h"
#include "server/shared/shared_store.h"
#include "server/store/rocksdb_store.h"
#include "server/store/tiered_store.h"
#include "server/worker/worker.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to serve on, HOST:PORT; port 0 lets the system choose one.");
ABSL_FLAG(std::string, metrics_listen, "",
          "Address of the Prometheus endpoint (GET /metrics, GET /healthz), HOST:PORT; port 0 "
          "lets the system choose one; empty: no endpoint.");
ABSL_FLAG(std::string, cache_dir, "./.kiln-cache", "Directory of the RocksDB cache.");
ABSL_FLAG(std::string, cache_size, "10GiB",
          "Byte budget of the cache, e.g. 512MiB, 10GiB, 2GB or a plain byte count; 0 is "
          "unlimited. Least recently used results are evicted beyond it.");
ABSL_FLAG(int, workers, 0, "Compile worker threads; 0: the number of cores.");
ABSL_FLAG(int64_t, queue_size, 256,
          "Compile jobs that may wait for a worker; beyond it requests get RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, negative_cache_s, 30,
          "Seconds a compile failure is replayed to identical requests; 0 disables it.");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off.");
ABSL_FLAG(double, grace_s, 20,
          "On SIGTERM/SIGINT, seconds in-flight compiles get to finish before kilnd exits.");
ABSL_FLAG(std::string, host_compiler, "g++", "C++ compiler that builds CPU kernels.");
ABSL_FLAG(double, compile_timeout_s, 60, "Limit on one host compiler run, in seconds.");
ABSL_FLAG(int, max_request_mib, 64, "Largest request accepted, in MiB.");
ABSL_FLAG(int, memory_cache_entries, 4096,
          "Recent results kept in memory in front of RocksDB; 0 disables it.");
ABSL_FLAG(int64_t, max_nodes, 100000,
          "Most nodes a graph may have; larger graphs get RESOURCE_EXHAUSTED naming max_nodes.");
ABSL_FLAG(int64_t, max_expr_depth, 256,
          "Deepest expression one kernel inlines; a deeper chain is split into several kernels "
          "through stored intermediates (never refused).");
ABSL_FLAG(double, max_frontend_ms, 10000,
          "Wall-clock limit on one compile's frontend (passes, fusion, codegen), in ms; beyond "
          "it the request gets RESOURCE_EXHAUSTED naming max_frontend_ms. 0: no limit.");
ABSL_FLAG(bool, compile_in_process, false,
          "Run the compiler inside kilnd instead of in supervised worker processes (a crash "
          "or hang in it then takes kilnd down). For debugging.");
ABSL_FLAG(bool, custom_builds, true,
          "Serve BuildExtension and CompileRawKernel (custom C++/CUDA builds, sandboxed with "
          "bubblewrap). Without a working sandbox they are refused, naming why.");
ABSL_FLAG(std::string, build_memory, "8GiB", "Address-space limit of one custom build command.");
ABSL_FLAG(double, build_timeout_s, 300, "Wall-clock limit of one custom build, all steps.");
ABSL_FLAG(int, build_max_processes, 64, "Processes one custom build may run at once.");
ABSL_FLAG(int, build_workers, 2, "Custom builds run at once.");
ABSL_FLAG(int, build_jobs, 0,
          "Compiler commands all custom builds run at once; one build alone compiles that many "
          "sources at once, as ninja does. 0: the host's cores (at least --build-workers).");
ABSL_FLAG(std::string, build_inputs_size, "4GiB",
          "Bytes of uploaded build inputs (sources, header trees) kept; least recently used "
          "go first.");
ABSL_FLAG(std::string, nvcc, "",
          "nvcc for the .cu sources of custom builds (a path, or a name on PATH). Empty: found "
          "as PyTorch finds it: $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, nvcc on PATH, "
          "/usr/local/cuda/bin/nvcc.");
ABSL_FLAG(std::string, worker_memory, "8GiB",
          "Address-space limit of each compile worker process (and the host compiler it "
          "runs), e.g. 4GiB; 0: none.");
ABSL_FLAG(double, worker_cpu_s, 120, "CPU seconds one compile may use in its worker; 0: none.");
ABSL_FLAG(double, worker_timeout_s, 300,
          "Wall-clock seconds one compile may take in its worker before the worker is killed; "
          "0: none.");
ABSL_FLAG(std::string, fault_injection, "",
          "TESTS ONLY. Comma-separated worker faults to enable (crash, abort, hang, spin, oom): a "
          "graph with a node named kiln-fault:KIND then triggers it in its compile worker.");
ABSL_FLAG(int, compile_worker_fd, -1,
          "Internal: run as a compile worker serving the socket on this descriptor.");
ABSL_FLAG(
    std::string, shared_cache, "",
    "Shared cache tier behind the local one, for replicas that share compiles: "
    "redis://[[USER]:PASSWORD@]HOST:PORT[/DB] or redis-cluster://[[USER]:PASSWORD@]H1:P1,..., "
    "rediss:// and rediss-cluster:// over TLS; empty: local only. --shared-cache-password-file "
    "or $KILN_REDIS_PASSWORD (with $KILN_REDIS_USER for an ACL user) supply the credentials "
    "when the URL has none, keeping them out of the process list.");
ABSL_FLAG(std::string, shared_cache_password_file, "",
          "File holding the shared cache's password (its first line).");
ABSL_FLAG(std::string, shared_cache_tls_ca, "",
          "PEM CA bundle a rediss:// server's certificate must chain to; empty: the system's.");
ABSL_FLAG(std::string, shared_cache_tls_cert, "",
          "PEM client certificate chain for a rediss:// server that requires one.");
ABSL_FLAG(std::string, shared_cache_tls_key, "", "PEM private key of --shared-cache-tls-cert.");
ABSL_FLAG(std::string, shared_cache_tls_server_name, "",
          "Name every rediss:// server's certificate must carry (and SNI); empty: the host "
          "connected to, as named in the URL or the cluster's slot map.");
ABSL_FLAG(std::string, shared_cache_secret_file, "",
          "File of the replicas' shared secrets, one per line (at least 16 bytes each): results "
          "written to the shared cache carry an HMAC-SHA256 under the first, and a result read "
          "is served only when its MAC verifies under one of them. Every replica needs the "
          "file; it guards results in Redis without --signing-key.");
ABSL_FLAG(bool, shared_cache_accept_unauthenticated, false,
          "With --shared-cache-secret-file: also serve shared results that carry no MAC (while "
          "replicas move onto the secret one at a time). Results with a wrong MAC are refused.");
ABSL_FLAG(int, shared_cache_timeout_ms, 250,
          "Limit on each connect and call to the shared cache, in milliseconds.");
ABSL_FLAG(double, shared_cache_ttl_s, 0,
          "Expiry of keys written to the shared cache, in seconds; 0: none (use Redis "
          "maxmemory with allkeys-lru).");
ABSL_FLAG(double, lease_ttl_s, 10,
          "Cluster-wide compile lease expiry, in seconds: how soon another replica takes over "
          "the compile of one that died. Renewed while compiling.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve gRPC (and the metrics endpoint) over TLS. Needs "
          "--tls-key. Re-read on SIGHUP.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mTLS).");
ABSL_FLAG(bool, metrics_plaintext, false,
          "Serve the metrics endpoint over plain HTTP even when --tls-cert is given.");
ABSL_FLAG(std::string, auth_tokens, "",
          "Token file, one 'NAME ROLE TOKEN [compiles=N]' per line (roles: read, compile, "
          "admin): every call then needs 'authorization: Bearer TOKEN'. Re-read on SIGHUP.");
ABSL_FLAG(int, token_max_compiles, 0,
          "Compiles one token may have in flight when its line sets no compiles=N; 0: no limit.");
ABSL_FLAG(std::string, signing_key, "",
          "PEM Ed25519 private key (kilnd keygen): sign every result, and serve only stored "
          "results that verify. Re-read on SIGHUP.");
ABSL_FLAG(std::string, trusted_keys, "",
          "Comma-separated PEM Ed25519 public keys whose signatures are also accepted on stored "
          "results (earlier signing keys, while a rotation is under way).");

namespace kiln::server {
namespace {

// kilnd's documented flags are spelled with hyphens (--cache-dir); Abseil flag names use
// underscores. Both spellings are accepted: names are rewritten before parsing.
void NormalizeFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (arg[0] != '-' || arg[1] != '-' || arg[2] == '\0') continue;  // "--" ends flags
    for (char* p = arg + 2; *p != '\0' && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
}

// "10GiB", "512MiB", "2GB", "100k", "12345" -> bytes.
bool ParseByteSize(std::string text, int64_t* bytes) {
  text = std::string(absl::StripAsciiWhitespace(absl::AsciiStrToLower(text)));
  size_t split = 0;
  while (split < text.size() && (absl::ascii_isdigit(text[split]) || text[split] == '.')) ++split;
  double number = 0;
  if (split == 0 || !absl::SimpleAtod(text.substr(0, split), &number)) return false;
  const std::string unit(absl::StripAsciiWhitespace(text.substr(split)));
  struct Unit {
    const char* name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},          {"b", 1},
      {"k", 1024.0},    {"kb", 1e3},
      {"kib", 1024.0},  {"m", 1 << 20},
      {"mb", 1e6},      {"mib", 1 << 20},
      {"g", 1 << 30},   {"gb", 1e9},
      {"gib", 1 << 30}, {"t", 1099511627776.0},
      {"tb", 1e12},     {"tib", 1099511627776.0},
  };
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      const double value = number * u.scale;
      if (value < 0 || value > 9.0e18) return false;
      *bytes = static_cast<int64_t>(value);
      return true;
    }
  }
  return false;
}

// The gRPC health service name that reports the shared cache tier's reachability.
constexpr char kSharedHealthService[] = "kiln.SharedCache";

// A stderr sink that buffers lines and writes them in batches: one line per request at tens of
// thousands of requests a second must not cost a syscall (or a thread hop) each. The buffer is
// written when it fills, on warnings and errors, every second, and at exit.
class BufferedStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  ~BufferedStderrSink() override { flush_(); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    formatter_->format(msg, buffer_);
    if (buffer_.size() >= kFlushAt) flush_();
  }
  void flush_() override {
    const char* data = buffer_.data();
    size_t left = buffer_.size();
    while (left > 0) {
      const ssize_t n = write(STDERR_FILENO, data, left);
      if (n <= 0) break;  // nowhere to log to: drop rather than stall requests
      data += n;
      left -= static_cast<size_t>(n);
    }
    buffer_.clear();
  }

 private:
  static constexpr size_t kFlushAt = 32 * 1024;
  spdlog::memory_buf_t buffer_;
};

bool SetUpLogging(const std::string& level_name) {
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") return false;
  auto logger = std::make_shared<spdlog::logger>("kilnd", std::make_shared<BufferedStderrSink>());
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  spdlog::flush_every(std::chrono::seconds(1));
  return true;
}

// The address clients should dial: `listen` with the port gRPC actually bound.
std::string BoundAddress(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || listen.rfind("unix:", 0) == 0) return listen;
  return absl::StrCat(listen.substr(0, colon), ":", port);
}

// A program installed beside kilnd (as the build puts it: server/ext/kiln-nvrtc next to
// server/kilnd, or the same folder), or the bare name for a PATH lookup.
// Whether `listen` (HOST:PORT, [V6]:PORT or unix:PATH) accepts local connections only.
bool LoopbackOnly(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  const size_t colon = listen.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? listen : listen.substr(0, colon);
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" ||
         absl::StartsWith(host, "127.");
}

// Warnings for bearer tokens an observer could read: sent without TLS to a non-local address,
// or kept in a file that others on the machine may read.
void WarnAboutTokenExposure(const std::string& token_file, bool tls, const std::string& listen) {
  if (!tls && !LoopbackOnly(listen)) {
    spdlog::warn(
        "--auth-tokens without --tls-cert on {}: bearer tokens cross the network in clear text; "
        "serve TLS, or listen on a loopback address only",
        listen);
  }
  struct stat st;
  if (stat(token_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    spdlog::warn("token file {} is readable by others on this machine (mode {:o}): chmod 600 it",
                 token_file, st.st_mode & 0777);
  }
}

// The shared tier's client from --shared-cache and its companion flags. Credentials come from
// the URL, else the password file, else the environment; TLS files only with rediss://.
absl::StatusOr<std::unique_ptr<shared::RedisClient>> MakeRedisClient(const std::string& url) {
  absl::StatusOr<shared::RedisOptions> options = shared::ParseRedisUrl(url);
  if (!options.ok()) return options.status();
  if (options->password.empty()) {
    const std::string file = absl::GetFlag(FLAGS_shared_cache_password_file);
    const char* env = std::getenv("KILN_REDIS_PASSWORD");
    if (!file.empty()) {
      KILN_ASSIGN_OR_RETURN(std::string text,
                            wire::ReadSecretFile(file, "--shared-cache-password-file"));
      options->password =
          std::string(absl::StripSuffix(absl::string_view(text).substr(0, text.find('\n')), "\r"));
      if (options->password.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--shared-cache-password-file ", file,
                                                       ": its first line holds no password"));
      }
    } else if (env != nullptr && *env != '\0') {
      options->password = env;
    }
    if (const char* user = std::getenv("KILN_REDIS_USER");
        !options->password.empty() && user != nullptr && options->username.empty()) {
      options->username = user;
    }
  }
  options->tls.ca_file = absl::GetFlag(FLAGS_shared_cache_tls_ca);
  options->tls.cert_file = absl::GetFlag(FLAGS_shared_cache_tls_cert);
  options->tls.key_file = absl::GetFlag(FLAGS_shared_cache_tls_key);
  options->tls.server_name = absl::GetFlag(FLAGS_shared_cache_tls_server_name);
  const bool tls_flags = !options->tls.ca_file.empty() || !options->tls.cert_file.empty() ||
                         !options->tls.key_file.empty() || !options->tls.server_name.empty();
  if (tls_flags && !options->tls.enabled) {
    return absl::InvalidArgumentError(
        "--shared-cache-tls-* are given but the shared cache URL is not rediss:// or "
        "rediss-cluster://: the connection would not use them");
  }
  if (!options->password.empty() && !options->tls.enabled &&
      absl::c_any_of(options->seeds,
                     [](const shared::RedisEndpoint& e) { return !LoopbackOnly(e.ToString()); })) {
    spdlog::warn(
        "the shared cache password crosses the network in clear text: use rediss:// (Redis "
        "with TLS), or a Redis on a loopback address");
  }
  const absl::Duration timeout =
      absl::Milliseconds(std::max(1, absl::GetFlag(FLAGS_shared_cache_timeout_ms)));
  options->connect_timeout = timeout;
  options->command_timeout = timeout;
  return shared::RedisClient::Create(*std::move(options));
}

// The replicas' MAC secrets from --shared-cache-secret-file: one per line, blank lines and
// surrounding whitespace ignored; each long enough that it cannot be guessed.
absl::StatusOr<shared::L2Auth> LoadL2Auth() {
  shared::L2Auth auth;
  auth.accept_unauthenticated = absl::GetFlag(FLAGS_shared_cache_accept_unauthenticated);
  const std::string file = absl::GetFlag(FLAGS_shared_cache_secret_file);
  if (file.empty()) {
    if (auth.accept_unauthenticated) {
      return absl::InvalidArgumentError(
          "--shared-cache-accept-unauthenticated needs --shared-cache-secret-file");
    }
    return auth;
  }
  KILN_ASSIGN_OR_RETURN(std::string text, wire::ReadSecretFile(file, "--shared-cache-secret-file"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (line.size() < shared::kMinL2SecretBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shared-cache-secret-file ", file, ": line ", auth.secrets.size() + 1,
                       " holds ", line.size(), " bytes; a secret needs at least ",
                       shared::kMinL2SecretBytes, " (e.g. `head -c 32 /dev/urandom | base64`)"));
    }
    auth.secrets.emplace_back(line);
  }
  if (auth.secrets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shared-cache-secret-file ", file, " holds no secret"));
  }
  return auth;
}

std::string NextToSelf(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const std::filesystem::path& p :
         {self.parent_path() / name, self.parent_path() / "ext" / name}) {
      if (access(p.c_str(), X_OK) == 0) return p.string();
    }
  }
  return name;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "kilnd: %s\n", message.c_str());
  spdlog::shutdown();
  return 1;
}

PipelineConfig PipelineConfigFromFlags() {
  PipelineConfig config;
  config.host_compiler = absl::GetFlag(FLAGS_host_compiler);
  config.compile_timeout_s = absl::GetFlag(FLAGS_compile_timeout_s);
  config.max_expr_depth = std::max<int64_t>(1, absl::GetFlag(FLAGS_max_expr_depth));
  config.max_frontend_ms = absl::GetFlag(FLAGS_max_frontend_ms);
  return config;
}

// The compiler kilnd uses: by default `threads` pre-started worker processes (this binary
// again, in --compile-worker-fd mode, with the flags that shape a compile).
absl::StatusOr<std::unique_ptr<compile::Compiler>> MakeCompiler(int threads) {
  const PipelineConfig config = PipelineConfigFromFlags();
  if (absl::GetFlag(FLAGS_compile_in_process)) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<compile::PipelineCompiler> in_process,
                          compile::PipelineCompiler::Create(config));
    return in_process;
  }
  int64_t memory = 0;
  if (!ParseByteSize(absl::GetFlag(FLAGS_worker_memory), &memory)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read --worker-memory '", absl::GetFlag(FLAGS_worker_memory), "'"));
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  memory = 0;  // sanitizers reserve terabytes of address space up front
#endif
  worker::WorkerProcessOptions options;
  options.argv = {
      "/proc/self/exe",  // this very binary, even if the file was replaced since
      absl::StrCat("--host-compiler=", config.host_compiler),
      absl::StrCat("--compile-timeout-s=", config.compile_timeout_s),
      absl::StrCat("--max-expr-depth=", config.max_expr_depth),
      absl::StrCat("--max-frontend-ms=", config.max_frontend_ms),
      absl::StrCat("--worker-cpu-s=", absl::GetFlag(FLAGS_worker_cpu_s)),
      absl::StrCat("--log-level=", absl::GetFlag(FLAGS_log_level)),
      absl::StrCat("--fault-injection=", absl::GetFlag(FLAGS_fault_injection)),
  };
  options.workers = threads;
  options.memory_bytes = memory;
  options.timeout_s = absl::GetFlag(FLAGS_worker_timeout_s);
  options.cpu_seconds = absl::GetFlag(FLAGS_worker_cpu_s);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> local, Pipeline::Create(config));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<worker::WorkerProcessCompiler> workers,
                        worker::WorkerProcessCompiler::Create(options, std::move(local)));
  if (!absl::GetFlag(FLAGS_fault_injection).empty()) {
    spdlog::warn("fault injection is on ({}): for tests only",
                 absl::GetFlag(FLAGS_fault_injection));
  }
  return workers;
}

// --compile-worker-fd: this process is a compile worker (server/worker/worker.h).
int RunWorker(int fd) {
  if (!SetUpLogging(absl::GetFlag(FLAGS_log_level))) return 2;
  worker::WorkerConfig config;
  config.pipeline = PipelineConfigFromFlags();
  config.cpu_seconds = absl::GetFlag(FLAGS_worker_cpu_s);
  config.fault_injection = absl::GetFlag(FLAGS_fault_injection);
  const int code = worker::RunCompileWorker(fd, config);
  spdlog::shutdown();
  return code;
}

// `kilnd keygen PRIVATE [PUBLIC]`.
int Keygen(int argc, char** argv) {
  if (argc < 3 || argc > 4 || argv[2][0] == '-') {
    std::fprintf(stderr, "usage: kilnd keygen PRIVATE.pem [PUBLIC.pem]\n");
    return 2;
  }
  const std::string private_path = argv[2];
  const std::string public_path = argc == 4 ? argv[3] : private_path + ".pub";
  if (absl::Status s = auth::WriteKeyPair(private_path, public_path); !s.ok()) {
    std::fprintf(stderr, "kilnd keygen: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<auth::SigningKey>> key =
      auth::SigningKey::FromPemFile(private_path);
  std::printf("wrote %s (private, for --signing-key) and %s (public, for clients); key id %s\n",
              private_path.c_str(), public_path.c_str(), key.ok() ? (*key)->key_id().c_str() : "?");
  return 0;
}

// What SIGHUP reloads; each part is optional.
struct Reloadable {
  auth::TlsMaterial* tls = nullptr;
  auth::Authorizer* authorizer = nullptr;
  auth::ResultSigner* signer = nullptr;

  void Reload() const {
    auto report = [](const char* what, const absl::Status& s) {
      if (s.ok()) {
        spdlog::info("SIGHUP: reloaded {}", what);
      } else {
        spdlog::error("SIGHUP: kept the current {}: {}", what, s.ToString());
      }
    };
    if (tls != nullptr) report("TLS certificates", tls->Reload());
    if (authorizer != nullptr && authorizer->enabled()) {
      report("token file", authorizer->Reload());
    }
    if (signer != nullptr) {
      absl::Status s = signer->Reload();
      report("signing keys", s);
      if (s.ok()) spdlog::info("signing results with key {}", signer->key_id());
    }
  }
};

int Run() {
  // Signals are taken synchronously by sigwait below; block them before any thread starts so
  // every thread inherits the mask and none is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t signals = stop_signals;
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (!SetUpLogging(absl::GetFlag(FLAGS_log_level))) {
    return Fail(absl::StrCat("unknown --log-level '", absl::GetFlag(FLAGS_log_level), "'"));
  }
  int64_t capacity = 0;
  if (!ParseByteSize(absl::GetFlag(FLAGS_cache_size), &capacity)) {
    return Fail(absl::StrCat("cannot read --cache-size '", absl::GetFlag(FLAGS_cache_size),
                             "' (try 512MiB or 10GiB)"));
  }

  store::RocksDbStoreOptions store_options;
  store_options.path = absl::GetFlag(FLAGS_cache_dir);
  store_options.capacity_bytes = capacity;
  absl::StatusOr<std::unique_ptr<store::RocksDbStore>> store =
      store::RocksDbStore::Open(store_options);
  if (!store.ok()) {
    return Fail(absl::StrCat("cannot open the cache at ", store_options.path, ": ",
                             store.status().ToString()));
  }

  std::unique_ptr<auth::ResultSigner> signer;
  if (const std::string key_file = absl::GetFlag(FLAGS_signing_key); !key_file.empty()) {
    std::vector<std::string> trusted =
        absl::StrSplit(absl::GetFlag(FLAGS_trusted_keys), ',', absl::SkipEmpty());
    absl::StatusOr<std::unique_ptr<auth::ResultSigner>> loaded =
        auth::ResultSigner::Load(key_file, std::move(trusted));
    if (!loaded.ok()) return Fail(absl::StrCat("--signing-key: ", loaded.status().message()));
    signer = *std::move(loaded);
    spdlog::info("signing results with key {}", signer->key_id());
  } else if (!absl::GetFlag(FLAGS_trusted_keys).empty()) {
    return Fail("--trusted-keys needs --signing-key");
  }

  // The shared tier, when asked for: Tiered(L1, L2) becomes the store every reader uses, and
  // the lease manager coordinates compiles with the other replicas.
  std::unique_ptr<shared::RedisClient> redis;
  std::unique_ptr<shared::SharedStore> l2;
  std::unique_ptr<store::TieredStore> tiered;
  std::unique_ptr<shared::LeaseManager> leases;
  store::ArtifactStore* cache = store->get();
  if (const std::string url = absl::GetFlag(FLAGS_shared_cache); !url.empty()) {
    absl::StatusOr<std::unique_ptr<shared::RedisClient>> client = MakeRedisClient(url);
    if (!client.ok()) return Fail(client.status().ToString());
    redis = *std::move(client);
    shared::SharedStoreOptions l2_options;
    l2_options.ttl = absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_shared_cache_ttl_s)));
    absl::StatusOr<shared::L2Auth> auth = LoadL2Auth();
    if (!auth.ok()) return Fail(auth.status().ToString());
    l2_options.auth = *std::move(auth);
    if (!l2_options.auth.secrets.empty()) {
      spdlog::info("shared results are authenticated with {} secret(s){}",
                   l2_options.auth.secrets.size(),
                   l2_options.auth.accept_unauthenticated ? "; unauthenticated ones accepted" : "");
    }
    if (signer == nullptr && l2_options.auth.secrets.empty()) {
      spdlog::warn(
          "--shared-cache without --signing-key or --shared-cache-secret-file: results read "
          "from Redis are checked against their digests only, so whoever can write to Redis "
          "decides what code clients run; give every replica the same --signing-key or "
          "--shared-cache-secret-file");
    }
    if (signer != nullptr) {
      l2_options.verify = [s = signer.get()](const std::string& key, const v1::ActionResult& r) {
        return s->VerifyStored(key, r);
      };
    }
    l2 = std::make_unique<shared::SharedStore>(redis.get(), l2_options);
    tiered = std::make_unique<store::TieredStore>(store->get(), l2.get());
    shared::LeaseOptions lease_options;
    lease_options.ttl = absl::Seconds(std::max(0.1, absl::GetFlag(FLAGS_lease_ttl_s)));
    leases = std::make_unique<shared::LeaseManager>(redis.get(), lease_options);
    cache = tiered.get();
    // One call up front, so an unreachable Redis is reported at start (once) rather than on
    // the first request. Not fatal: kilnd serves from L1 and reconnects by itself.
    redis->Command({"PING"}, 0).IgnoreError();
    spdlog::info("shared cache {} ({}), lease owner {}", redis->description(),
                 redis->available() ? "reachable" : "unreachable for now", leases->owner_id());
  }

  const int threads = absl::GetFlag(FLAGS_workers) > 0
                          ? absl::GetFlag(FLAGS_workers)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  absl::StatusOr<std::unique_ptr<compile::Compiler>> compiler = MakeCompiler(threads);
  if (!compiler.ok()) {
    return Fail(absl::StrCat("cannot set up the compiler: ", compiler.status().ToString()));
  }

  std::unique_ptr<auth::TlsMaterial> tls;
  if (!absl::GetFlag(FLAGS_tls_cert).empty() || !absl::GetFlag(FLAGS_tls_key).empty() ||
      !absl::GetFlag(FLAGS_tls_client_ca).empty()) {
    absl::StatusOr<std::unique_ptr<auth::TlsMaterial>> loaded =
        auth::TlsMaterial::Load({absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                 absl::GetFlag(FLAGS_tls_client_ca)});
    if (!loaded.ok()) return Fail(absl::StrCat("TLS: ", loaded.status().message()));
    tls = *std::move(loaded);
  }
  absl::StatusOr<std::unique_ptr<auth::Authorizer>> authorizer = auth::Authorizer::Create(
      absl::GetFlag(FLAGS_auth_tokens), absl::GetFlag(FLAGS_token_max_compiles));
  if (!authorizer.ok()) {
    return Fail(absl::StrCat("--auth-tokens: ", authorizer.status().message()));
  }
  if ((*authorizer)->enabled()) {
    WarnAboutTokenExposure(absl::GetFlag(FLAGS_auth_tokens), tls != nullptr,
                           absl::GetFlag(FLAGS_listen));
  }

  compile::CompileServiceOptions compile_options;
  compile_options.workers = threads;
  compile_options.queue_size = absl::GetFlag(FLAGS_queue_size);
  compile_options.limits.max_nodes = absl::GetFlag(FLAGS_max_nodes);
  compile_options.negative_ttl = absl::Seconds(absl::GetFlag(FLAGS_negative_cache_s));
  compile_options.memory_cache_entries =
      static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_memory_cache_entries)));
  compile_options.coordinator = leases.get();
  if (signer != nullptr) {
    compile_options.sign = [s = signer.get()](const std::string& key, v1::ActionResult* r) {
      return s->Sign(key, r);
    };
    compile_options.verify_stored = [s = signer.get()](const std::string& key,
                                                       const v1::ActionResult& r) {
      return s->VerifyStored(key, r);
    };
  }
  auto compile_service =
      std::make_unique<compile::CompileService>(compiler->get(), cache, compile_options);
  ServiceOptions service_options;
  if ((*authorizer)->enabled()) service_options.authorizer = authorizer->get();
  std::unique_ptr<ext::ExtensionBuilder> ext_builder;
  if (absl::GetFlag(FLAGS_custom_builds)) {
    ext::ExtOptions ext_options;
    ext_options.dir = absl::StrCat(absl::GetFlag(FLAGS_cache_dir), "/build-inputs");
    int64_t inputs_size = 0, build_memory = 0;
    if (!ParseByteSize(absl::GetFlag(FLAGS_build_inputs_size), &inputs_size)) {
      return Fail(absl::StrCat("cannot read --build-inputs-size '",
                               absl::GetFlag(FLAGS_build_inputs_size), "'"));
    }
    if (!ParseByteSize(absl::GetFlag(FLAGS_build_memory), &build_memory)) {
      return Fail(
          absl::StrCat("cannot read --build-memory '", absl::GetFlag(FLAGS_build_memory), "'"));
    }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    build_memory = int64_t{1} << 40;  // sanitizers reserve terabytes of address space up front
#endif
    ext_options.input_capacity_bytes = inputs_size;
    ext_options.workers = std::max(1, absl::GetFlag(FLAGS_build_workers));
    ext_options.jobs = std::max(0, absl::GetFlag(FLAGS_build_jobs));
    ext_options.negative_ttl = absl::Seconds(absl::GetFlag(FLAGS_negative_cache_s));
    ext_options.max_upload_bytes = int64_t{absl::GetFlag(FLAGS_max_request_mib)} << 20;
    ext_options.sandbox.limits.timeout_s = absl::GetFlag(FLAGS_build_timeout_s);
    ext_options.sandbox.limits.address_space_bytes = build_memory;
    ext_options.sandbox.limits.max_processes = absl::GetFlag(FLAGS_build_max_processes);
    ext_options.cxx = absl::GetFlag(FLAGS_host_compiler);
    ext_options.nvcc = absl::GetFlag(FLAGS_nvcc);
    ext_options.nvrtc_tool = NextToSelf("kiln-nvrtc");
    ext_options.sign = compile_options.sign;
    if (l2 != nullptr) {
      // Inputs uploaded to one replica are every replica's: a Redis error is a miss (the
      // client is asked for the blob) or an unshared upload, never a failed build.
      shared::SharedStore* tier = l2.get();
      ext_options.shared_inputs = {[tier](const std::string& hex) {
                                     absl::StatusOr<bool> has = tier->HasBlob(hex);
                                     return has.ok() && *has;
                                   },
                                   [tier](const std::string& hex) -> std::optional<std::string> {
                                     absl::StatusOr<std::optional<std::string>> got =
                                         tier->GetBlob(hex);
                                     return got.ok() ? *std::move(got) : std::nullopt;
                                   },
                                   [tier](const std::string& hex, const std::string& bytes) {
                                     tier->PutBlob(hex, bytes).IgnoreError();
                                   }};
    }
    absl::StatusOr<std::unique_ptr<ext::ExtensionBuilder>> made =
        ext::ExtensionBuilder::Create(ext_options, cache);
    if (!made.ok()) return Fail(absl::StrCat("custom builds: ", made.status().message()));
    ext_builder = *std::move(made);
    service_options.ext = ext_builder.get();
  }
  auto service = std::make_unique<KilnService>(compile_service.get(), cache, service_options);

  // Bound before gRPC so a bad address fails the start with nothing else serving yet. It reads
  // the same snapshot as GetStats, so the two never disagree on what a counter means.
  std::unique_ptr<MetricsServer> metrics;
  if (const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
      !metrics_listen.empty()) {
    metrics = std::make_unique<MetricsServer>(
        [stats = compile_service.get(), tokens = authorizer->get(), ext = ext_builder.get()] {
          v1::GetStatsResponse s = stats->Stats();
          tokens->AddStats(&s);
          if (ext != nullptr) ext->AddStats(&s);
          return s;
        });
    HttpsSetup https;
    if (tls != nullptr && !absl::GetFlag(FLAGS_metrics_plaintext)) {
      https = [material = tls.get()](ssl_ctx_st* ctx) { return material->ConfigureHttps(ctx); };
    }
    absl::StatusOr<int> metrics_port = metrics->Start(metrics_listen, https);
    if (!metrics_port.ok()) {
      return Fail(absl::StrCat("cannot serve metrics: ", metrics_port.status().ToString()));
    }
    const std::string metrics_address = BoundAddress(metrics_listen, *metrics_port);
    spdlog::info("metrics on {}://{}/metrics", https ? "https" : "http", metrics_address);
    std::printf("kilnd metrics on %s\n", metrics_address.c_str());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(
      listen, tls != nullptr ? tls->GrpcServerCredentials() : grpc::InsecureServerCredentials(),
      &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_request_mib) << 20);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (port == 0 && listen.rfind("unix:", 0) != 0)) {
    return Fail(absl::StrCat("cannot listen on ", listen));
  }
  const std::string address = BoundAddress(listen, port);
  spdlog::info("kilnd serving on {} with {} compile workers, cache {} ({} bytes budget); {}, {}",
               address, compile_service->workers(), store_options.path, capacity,
               tls == nullptr ? "plaintext" : (tls->requires_client_cert() ? "mTLS" : "TLS"),
               (*authorizer)->enabled() ? "bearer tokens required" : "no tokens");
  std::printf("kilnd listening on %s\n", address.c_str());
  std::fflush(stdout);

  // With a shared tier, its reachability is a health service of its own: kilnd itself keeps
  // serving ("" stays SERVING) while Redis is away. The probe also reconnects without waiting
  // for a request.
  absl::Notification stop_watching;
  std::thread shared_watch;
  if (redis != nullptr) {
    shared_watch = std::thread(
        [&stop_watching, client = redis.get(), health = server->GetHealthCheckService()] {
          do {
            client->Command({"PING"}, 0).IgnoreError();
            health->SetServingStatus(kSharedHealthService, client->available());
          } while (!stop_watching.WaitForNotificationWithTimeout(absl::Seconds(1)));
        });
  }

  const Reloadable reloadable{tls.get(), authorizer->get(), signer.get()};
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) == 0 && signal_number == SIGHUP) {
    reloadable.Reload();
  }
  const absl::Duration grace = absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_grace_s)));
  spdlog::info("{} received: draining for up to {}", strsignal(signal_number),
               absl::FormatDuration(grace));
  // A second signal means "now": skip the drain.
  std::thread([stop_signals] {
    int again = 0;
    sigwait(&stop_signals, &again);
    std::fprintf(stderr, "kilnd: second signal, exiting without draining\n");
    std::_Exit(1);
  }).detach();

  // Lame duck first: health says NOT_SERVING so balancers move away, new compiles are refused
  // (UNAVAILABLE, retryable elsewhere) while hits and fetches are still answered, and the jobs
  // already queued or running get until the grace deadline. Then gRPC stops: by then every
  // compile waiter has its answer, so calls still open are short ones (a fetch in progress),
  // and they get one more second.
  const absl::Time drain_deadline = absl::Now() + grace;
  stop_watching.Notify();
  if (shared_watch.joinable()) shared_watch.join();
  server->GetHealthCheckService()->SetServingStatus(false);
  if (metrics != nullptr) metrics->SetDraining();
  compile_service->StopAccepting();
  compile_service->Shutdown(drain_deadline);
  spdlog::debug("compile workers stopped");
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  server->Wait();
  spdlog::debug("gRPC server stopped");
  metrics.reset();  // stops it, before the compile service it reads goes away
  server.reset();
  service.reset();
  compile_service.reset();
  signer.reset();
  leases.reset();
  tiered.reset();
  l2.reset();
  redis.reset();
  compiler->reset();
  store->reset();  // flushes and closes RocksDB
  spdlog::debug("cache closed");
  spdlog::info("kilnd stopped");
  spdlog::shutdown();
  return 0;
}

}  // namespace
}  // namespace kiln::server

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "keygen") == 0) return kiln::server::Keygen(argc, argv);
  // --help lists the flags of this file (Abseil would look for a file named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "kiln compile server.\n"
      "  kilnd [--listen=127.0.0.1:50051] [--cache-dir=DIR] [--cache-size=10GiB] "
      "[--workers=N] ...\n"
      "  kilnd keygen PRIVATE.pem [PUBLIC.pem]   (an Ed25519 key pair for --signing-key)\n"
      "Flag names may be spelled with hyphens or underscores.");
  kiln::server::NormalizeFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  // Lock-order checking walks a graph on every Mutex acquisition; the hit path takes several,
  // and kiln's tests (TSan, debug builds) are where lock order is checked.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (const int fd = absl::GetFlag(FLAGS_compile_worker_fd); fd >= 0) {
    return kiln::server::RunWorker(fd);
  }
  return kiln::server::Run();
}
