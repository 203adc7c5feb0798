// kilnd's command-line flags (defined in flags.cc, read by main.cc) and the helpers that turn
// them into the option structs of the pieces main.cc wires together. Flags are documented
// where they are defined; `kilnd --help` prints them.
// Thread-safety: flags are read after parsing, from the main thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/shared/l2_records.h"
#include "server/shared/redis_client.h"

ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, cache_dir);
ABSL_DECLARE_FLAG(std::string, cache_size);
ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(int64_t, queue_size);
ABSL_DECLARE_FLAG(double, negative_cache_s);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(double, grace_s);
ABSL_DECLARE_FLAG(bool, exit_on_stdin_eof);
ABSL_DECLARE_FLAG(std::string, host_compiler);
ABSL_DECLARE_FLAG(double, compile_timeout_s);
ABSL_DECLARE_FLAG(int, max_request_mib);
ABSL_DECLARE_FLAG(int, memory_cache_entries);
ABSL_DECLARE_FLAG(int64_t, max_nodes);
ABSL_DECLARE_FLAG(int64_t, max_expr_depth);
ABSL_DECLARE_FLAG(double, max_frontend_ms);
ABSL_DECLARE_FLAG(bool, compile_in_process);
ABSL_DECLARE_FLAG(bool, custom_builds);
ABSL_DECLARE_FLAG(std::string, build_memory);
ABSL_DECLARE_FLAG(double, build_timeout_s);
ABSL_DECLARE_FLAG(int, build_max_processes);
ABSL_DECLARE_FLAG(int, build_workers);
ABSL_DECLARE_FLAG(int, build_jobs);
ABSL_DECLARE_FLAG(std::string, build_inputs_size);
ABSL_DECLARE_FLAG(std::string, nvcc);
ABSL_DECLARE_FLAG(std::string, worker_memory);
ABSL_DECLARE_FLAG(double, worker_cpu_s);
ABSL_DECLARE_FLAG(double, worker_timeout_s);
ABSL_DECLARE_FLAG(std::string, fault_injection);
ABSL_DECLARE_FLAG(int, compile_worker_fd);
ABSL_DECLARE_FLAG(std::string, shared_cache);
ABSL_DECLARE_FLAG(std::string, shared_cache_password_file);
ABSL_DECLARE_FLAG(std::string, shared_cache_tls_ca);
ABSL_DECLARE_FLAG(std::string, shared_cache_tls_cert);
ABSL_DECLARE_FLAG(std::string, shared_cache_tls_key);
ABSL_DECLARE_FLAG(std::string, shared_cache_tls_server_name);
ABSL_DECLARE_FLAG(std::string, shared_cache_secret_file);
ABSL_DECLARE_FLAG(bool, shared_cache_accept_unauthenticated);
ABSL_DECLARE_FLAG(int, shared_cache_timeout_ms);
ABSL_DECLARE_FLAG(double, shared_cache_ttl_s);
ABSL_DECLARE_FLAG(double, lease_ttl_s);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_client_ca);
ABSL_DECLARE_FLAG(bool, metrics_plaintext);
ABSL_DECLARE_FLAG(std::string, auth_tokens);
ABSL_DECLARE_FLAG(int, token_max_compiles);
ABSL_DECLARE_FLAG(std::string, signing_key);
ABSL_DECLARE_FLAG(std::string, trusted_keys);

namespace kiln::server {

// kilnd's documented flags are spelled with hyphens (--cache-dir); Abseil flag names use
// underscores. Both spellings are accepted: names are rewritten in place before parsing.
void NormalizeFlagNames(int argc, char** argv);

// "10GiB", "512MiB", "2GB", "100k", "12345" -> bytes; false when `text` is none of these.
bool ParseByteSize(std::string text, int64_t* bytes);

// Whether `listen` (HOST:PORT, [V6]:PORT or unix:PATH) accepts local connections only.
bool LoopbackOnly(absl::string_view listen);

// The shared tier's client from --shared-cache `url` and its companion flags. Credentials come
// from the URL, else --shared-cache-password-file, else the environment; TLS files only with
// rediss://. InvalidArgument naming the flag for what cannot be used.
absl::StatusOr<std::unique_ptr<shared::RedisClient>> MakeRedisClient(const std::string& url);

// The replicas' MAC secrets from --shared-cache-secret-file (one per line, blank lines and
// surrounding whitespace ignored, each at least kMinL2SecretBytes) and
// --shared-cache-accept-unauthenticated.
absl::StatusOr<shared::L2Auth> LoadL2Auth();

}  // namespace kiln::server
