#include "server/flags.h"

#include <cstdlib>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "kernels/util/status_macros.h"
#include "spdlog/spdlog.h"
#include "wire/wire.h"

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
ABSL_FLAG(bool, exit_on_stdin_eof, false,
          "Stop (as on SIGTERM) when standard input reaches end of file: a parent that starts "
          "kilnd with a pipe on its stdin takes the daemon down with it, even when killed.");
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

void NormalizeFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (arg[0] != '-' || arg[1] != '-' || arg[2] == '\0') continue;  // "--" ends flags
    for (char* p = arg + 2; *p != '\0' && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
}

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

bool LoopbackOnly(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  const size_t colon = listen.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? listen : listen.substr(0, colon);
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" ||
         absl::StartsWith(host, "127.");
}

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

}  // namespace kiln::server
