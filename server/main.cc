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
// the one in use stays, and no connection or call is dropped either way. With
// --exit-on-stdin-eof, the end of standard input stops it as SIGTERM does.
//
// The flags, and the helpers that turn them into option structs, are in flags.h.
//
// `kilnd keygen PRIVATE.pem [PUBLIC.pem]` writes a new Ed25519 key pair for --signing-key (the
// public key, by default PRIVATE.pem.pub, is what clients trust) and exits.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
#include "server/flags.h"
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

namespace kiln::server {
namespace {

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

// A program installed beside kilnd (as the build puts it: server/ext/kiln-nvrtc next to
// server/kilnd, or the same folder), or the bare name for a PATH lookup.
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

  // A parent holding the write end of a pipe on kilnd's stdin (kiln.local.LocalDaemon) owns
  // the daemon's life: when that end closes, by the parent's exit or death alike, kilnd stops as
  // on SIGTERM. Nothing is read but the end of the stream; the thread is left blocked in read()
  // when kilnd stops for another reason.
  if (absl::GetFlag(FLAGS_exit_on_stdin_eof)) {
    std::thread([] {
      char buffer[256];
      ssize_t n = 0;
      while ((n = read(STDIN_FILENO, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
      }
      spdlog::info("standard input closed (--exit-on-stdin-eof): stopping");
      kill(getpid(), SIGTERM);
    }).detach();
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
    return absl::EndsWith(path, "server/flags.cc");
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
