"""The deliberate bugs the mutation check plants in kiln, one at a time.

Each mutant names one file, a piece of its text that must occur there exactly once, and what
replaces it; the build targets the tests below need; and the tests that must fail once the bug
is in. Test specs:

    gtest:TARGET[:FILTER]    a kiln_cc_test binary (through ctest), optionally with --gtest_filter
    pytest:ARGS              python3 -m pytest ARGS (paths relative to the repository root)

A mutant whose text no longer matches fails the run: edit the entry with the code it follows.
Add a mutant with every subsystem, and with every bug a test should have caught.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    build: tuple[str, ...] = field(default=())


def _daemon(*pytest_args: str) -> tuple[str, ...]:
    return tuple(f"pytest:{a}" for a in pytest_args)


MUTANTS: list[Mutant] = [
    Mutant(
        name="add-printed-as-sub",
        what="the C-family expression printer writes `add` as `-`",
        file="kernels/codegen/c_expr.cc",
        find='if (op == "add") return Typed(result, infix("+"));',
        replace='if (op == "add") return Typed(result, infix("-"));',
        tests=("gtest:kernels_test:Pipeline.*",),
    ),
    Mutant(
        name="cpu-sin-cos-swapped",
        what="the CPU runtime header maps kiln_sin onto cos and kiln_cos onto sin",
        file="kernels/runtime/kiln_cpu.h",
        find="KILN_UNARY(log1p) KILN_UNARY(sin) KILN_UNARY(cos) KILN_UNARY(tan)",
        replace=("KILN_UNARY(log1p) KILN_UNARY(tan)\n"
                 "KILN_INLINE float kiln_sin(float x) { return cosf(x); }\n"
                 "KILN_INLINE double kiln_sin(double x) { return cos(x); }\n"
                 "KILN_INLINE float kiln_cos(float x) { return sinf(x); }\n"
                 "KILN_INLINE double kiln_cos(double x) { return sin(x); }\n"),
        tests=("gtest:kernels_test:Pipeline.*",),
    ),
    Mutant(
        name="cuda-sin-cos-swapped",
        what="the CUDA runtime header maps kiln_sin onto cos and kiln_cos onto sin",
        file="kernels/runtime/kiln_cuda.h",
        find="KILN_UNARY(log1p) KILN_UNARY(sin) KILN_UNARY(cos) KILN_UNARY(tan)",
        replace=("KILN_UNARY(log1p) KILN_UNARY(tan)\n"
                 "KILN_D float kiln_sin(float x) { return cosf(x); }\n"
                 "KILN_D double kiln_sin(double x) { return cos(x); }\n"
                 "KILN_D float kiln_cos(float x) { return sinf(x); }\n"
                 "KILN_D double kiln_cos(double x) { return sin(x); }\n"),
        tests=("gtest:cuda_codegen_test:CudaEmulation.Pointwise",),
    ),
    Mutant(
        name="slice-start-off-by-one",
        what="a slice's index expression starts one element late",
        file="kernels/lower/lower.cc",
        find="r[a] = AddConst(Scale(index[a], steps[i]), sl->first);",
        replace="r[a] = AddConst(Scale(index[a], steps[i]), sl->first + 1);",
        tests=("gtest:kernels_test:Pipeline.*:Fusion.*",),
    ),
    Mutant(
        name="concat-boundary-off-by-one",
        what="concat switches to the next input one element early",
        file="kernels/lower/lower.cc",
        find="parts.push_back({MakeCast(Lower(n.inputs[k], r), out.dtype), offsets[k] + size});",
        replace="parts.push_back({MakeCast(Lower(n.inputs[k], r), out.dtype), offsets[k] + size - 1});",
        tests=("gtest:cuda_codegen_test:CudaEmulation.Views",),
    ),
    Mutant(
        name="sum-identity-one",
        what="a sum starts from 1 instead of 0",
        file="kernels/codegen/c_expr.cc",
        find='if (op == "sum") return Literal(t, 0, 0);',
        replace='if (op == "sum") return Literal(t, 1, 1);',
        tests=("gtest:kernels_test:Pipeline.*:Fusion.*",),
    ),
    Mutant(
        name="any-identity-true",
        what="`any` starts from true instead of false",
        file="kernels/codegen/c_expr.cc",
        find='if (op == "any") return "0";',
        replace='if (op == "any") return "1";',
        tests=_daemon("tests/python/test_ops.py -k 'test_reductions and any'"),
        build=("kilnd",),
    ),
    Mutant(
        name="ge-printed-as-gt",
        what="`ge` is printed as a strict comparison",
        file="kernels/codegen/c_expr.cc",
        find='if (op == "ge") return infix(">=");',
        replace='if (op == "ge") return infix(">");',
        tests=_daemon("tests/python/test_ops.py -k 'test_binary_broadcast and ge'"),
        build=("kilnd",),
    ),
    Mutant(
        name="input-strides-ignored",
        what="the scheduler ignores an input's declared strides and reads it as contiguous",
        file="kernels/schedule/schedule.cc",
        find="t.strides.empty() ? lower::ContiguousStrides(t.shape) : t.strides);",
        replace="lower::ContiguousStrides(t.shape));",
        tests=("gtest:cuda_codegen_test:CudaEmulation.Views",),
    ),
    Mutant(
        name="store-blob-digest-unchecked",
        what="the RocksDB store serves a blob without checking it hashes to its digest",
        file="server/store/rocksdb_store.cc",
        find=('  if (actual != raw) {\n'
              '    KILN_RETURN_IF_ERROR(HandleCorruptBlob(raw, "content does not match its digest"));'),
        replace=('  if (actual.empty()) {\n'
                 '    KILN_RETURN_IF_ERROR(HandleCorruptBlob(raw, "content does not match its digest"));'),
        tests=("gtest:store_test",),
    ),
    Mutant(
        name="client-cache-digest-unchecked",
        what="the client core's artifact store trusts a file without comparing its hash with its name",
        file="client/core/store.cc",
        find="  if (hex != digest) return Check::kCorrupt;",
        replace="  if (hex.empty()) return Check::kCorrupt;",
        build=("kiln_core",),
        tests=("gtest:client_artifact_cache_test", "pytest:tests/python/test_core.py -k damaged"),
    ),
    Mutant(
        name="python-fetch-digest-unchecked",
        what="the client core stores fetched bytes without checking their digest",
        file="client/core/store.cc",
        find="  if (const std::string got = key::Sha256Hex(bytes); got != digest) {",
        replace="  if (const std::string got = key::Sha256Hex(bytes); got.empty()) {",
        build=("kiln_core",),
        tests=("pytest:tests/python/test_builder_offline.py -k test_artifact_cache_verifies_digests",),
    ),
    Mutant(
        name="cpp-signature-unchecked",
        what="the C++ trust policy accepts a signed result without verifying the signature",
        file="wire/signatures.cc",
        find="  if (!VerifyEd25519(it->second.get(), CanonicalResultBytes(handle, result), sig.signature())) {",
        replace="  if (false && !VerifyEd25519(it->second.get(), CanonicalResultBytes(handle, result), sig.signature())) {",
        tests=("gtest:auth_test:Signing.*",),
    ),
    Mutant(
        name="python-signature-unchecked",
        what="the Python trust policy accepts a signed result without verifying the signature",
        file="client/python/kiln/trust.py",
        find="            key.verify(bytes(sig.signature), canonical_result_bytes(handle, result))\n",
        replace="            pass\n",
        tests=_daemon("tests/python/test_trust.py -k 'tampered_records'"),
        build=("kilnd",),
    ),
    Mutant(
        name="l2-action-digest-unchecked",
        what="an action record read from Redis is served without checking its bound digest",
        file="server/shared/l2_records.cc",
        find="  if (digest != BoundDigest(name, payload)) {",
        replace="  if (false && digest != BoundDigest(name, payload)) {",
        tests=("gtest:shared_tier_test:L2RecordsTest.*",),
    ),
    Mutant(
        name="role-check-skipped",
        what="a token's role is not compared with the role a call needs",
        file="server/auth/tokens.cc",
        find="  if (entry.role < needed) {",
        replace="  if (false && entry.role < needed) {",
        tests=("gtest:auth_test:Authorizer.*",),
    ),
    Mutant(
        name="token-in-flight-reported-zero",
        what="GetStats reports every token's compiles in flight as 0",
        file="server/auth/tokens.cc",
        find="    t->set_compiles_in_flight(c.compiles_in_flight.load(std::memory_order_relaxed));",
        replace="    t->set_compiles_in_flight(0);",
        tests=_daemon("tests/python/test_trust.py::test_per_token_compile_limit_refuses_misses_but_serves_hits"),
        build=("kilnd",),
    ),
    Mutant(
        name="model-record-digest-unchecked",
        what="the Python client uses a compiled-model record without comparing it with its signed digest",
        file="client/python/kiln/connection.py",
        find="        if got != arts[0].digest:",
        replace="        if False and got != arts[0].digest:",
        tests=_daemon("tests/python/test_torch_records.py::test_tampered_record_is_refused"),
    ),
    Mutant(
        name="lease-release-any-holder",
        what="releasing a lease deletes it whoever holds it now (a holder whose lease ran out and was taken over)",
        file="server/shared/lease_manager.cc",
        find="""    "if redis.call('get', KEYS[1]) == ARGV[1] then "\n    "return redis.call('del', KEYS[1])""",
        replace="""    "if true then "\n    "return redis.call('del', KEYS[1])""",
        tests=("gtest:shared_tier_test:SharedTierTest.AHolderThatLostItsLease*",),
    ),
    Mutant(
        name="lease-renew-any-holder",
        what="renewing a lease extends it whoever holds it now, and the old holder never notices the loss",
        file="server/shared/lease_manager.cc",
        find="""    "if redis.call('get', KEYS[1]) == ARGV[1] then "\n    "return redis.call('pexpire'""",
        replace="""    "if true then "\n    "return redis.call('pexpire'""",
        tests=("gtest:shared_tier_test:SharedTierTest.AHolderThatLostItsLease*",),
    ),
    Mutant(
        name="sigterm-grace-dropped",
        what="on SIGTERM kilnd drops the compiles already queued instead of letting them finish",
        file="server/main.cc",
        find="  const absl::Time drain_deadline = absl::Now() + grace;",
        replace="  const absl::Time drain_deadline = absl::Now();",
        tests=_daemon("tests/fault/test_load_faults.py -k sigterm"),
        build=("kilnd",),
    ),
    Mutant(
        name="redis-auth-skipped",
        what="kilnd never sends its Redis password (a password-protected shared tier refuses every call)",
        file="server/shared/redis_client.cc",
        find="    if (!options_.password.empty()) {",
        replace="    if (false) {",
        tests=("gtest:shared_tier_test:SharedTierTest.PasswordsAuthenticate*",),
    ),
    Mutant(
        name="build-extension-role-read",
        what="BuildExtension asks only for role read (a read-only token could run server-side builds)",
        file="server/service.cc",
        find='Authorize(context, auth::Role::kCompile, "BuildExtension")',
        replace='Authorize(context, auth::Role::kRead, "BuildExtension")',
        tests=_daemon("tests/python/test_trust.py::test_every_rpc_needs_its_role"),
        build=("kilnd",),
    ),
    Mutant(
        name="bundle-import-signature-unchecked",
        what="a signing kilnd imports bundle entries signed by a key it does not trust",
        file="server/compile/compile_service.cc",
        find="    } else if (options_.verify_stored) {\n      if (absl::Status v = options_.verify_stored(entry.key(), checked); !v.ok())",
        replace="    } else if (options_.verify_stored) {\n      if (absl::Status v = absl::OkStatus(); !v.ok())",
        tests=_daemon("tests/python/test_bundle.py::test_a_signing_daemon_takes_only_entries_it_trusts"),
        build=("kilnd",),
    ),
    Mutant(
        name="precompile-source-unchecked",
        what="a precompiled model is loaded without checking the sources Dynamo traced",
        file="client/python/kiln/torch/precompile.py",
        find="            changed = _changed_source(entry)",
        replace="            changed = None",
        tests=_daemon("tests/python/test_torch_precompile.py::test_changed_source_is_compiled_again"),
    ),
    Mutant(
        name="worker-inherits-descriptors",
        what="a compile worker keeps every descriptor kilnd had open (sockets, store files) instead of closing them",
        file="server/worker/supervisor.cc",
        find="    close_range(kWorkerFd + 1, ~0U, 0);         // nothing else of kilnd's (sockets, files) leaks in\n",
        replace="",
        tests=_daemon("tests/fault/test_workers.py -k inherit_no_descriptor"),
        build=("kilnd",),
    ),
    Mutant(
        name="sandbox-keeps-environment",
        what="the build sandbox passes kilnd's environment (tokens, passwords) to the commands it runs",
        file="server/ext/sandbox.cc",
        find='"--new-session", "--clearenv",',
        replace='"--new-session",',
        tests=("gtest:sandbox_test:SandboxTest.SeesNoHostEnvironment",),
    ),
    Mutant(
        name="metrics-tls-accepts-any-client",
        what="the HTTPS metrics endpoint's verify callback accepts any client certificate",
        file="server/auth/tls.cc",
        find="SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);",
        replace=("SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,\n"
                 "                       [](int, X509_STORE_CTX*) { return 1; });"),
        tests=_daemon("tests/python/test_trust.py::test_metrics_endpoint_speaks_https_with_client_certificates"),
        build=("kilnd",),
    ),
    Mutant(
        name="symbolic-check-point-skipped",
        what="the symbolic generaliser trusts its interpolation without evaluating it at the check point",
        file="kernels/codegen/symbolic.cc",
        find="  for (size_t i = 0; i < values.size(); ++i)\n    if (Evaluate(p, points[i]) != values[i]) return false;",
        replace="  for (size_t i = 0; i < grid; ++i)\n    if (Evaluate(p, points[i]) != values[i]) return false;",
        tests=("gtest:kernels_test:SymbolicTest.*",),
    ),
    Mutant(
        name="cuda-index-bound-reductions-multiplied",
        what="a symbolic CUDA plan bounds a kernel's indices by the product of its reductions' ranges (a fused safe softmax, three row reductions, is refused at every second sequence length)",
        file="kernels/codegen/cuda/cuda_codegen.cc",
        find="            reduced += range;",
        replace="            reduced *= range;",
        tests=_daemon("tests/python/test_jit_cuda.py::test_symbolic_safe_softmax_compiles_one_kernel"),
        build=("kilnd",),
    ),
    Mutant(
        name="group-norm-chunk-spread-dropped",
        what="a long GroupNorm group reduced in chunks sums the chunks' squared deviations but drops the spread of their means",
        file="client/python/kiln/torch/lowering.py",
        find="                                 ctx.value(float(per), acc)))",
        replace="                                 ctx.value(0.0, acc)))",
        tests=_daemon("tests/python/test_torch_backend.py -k test_group_norm_alone"),
    ),
    Mutant(
        name="group-norm-result-layout-not-restored",
        what="the channels-last pass leaves a group norm's result contiguous, so everything after it reads the residual stream strided",
        file="client/python/kiln/torch/passes/channels_last.py",
        find="                    restored += _result_in_format(g, n, fmt)",
        replace="                    pass",
        tests=_daemon("tests/python/test_torch_backend.py -k test_group_norm_after_convolutions"),
    ),
    Mutant(
        name="avg-pool-divisor-counts-padding",
        what="average pooling divides by the padded window where torch, without count_include_pad, divides by the taps inside the operand",
        file="client/python/kiln/torch/lowering.py",
        find="        if not count_include_pad:",
        replace="        if False:",
        tests=_daemon("tests/python/test_torch_backend.py -k test_average_pooling_runs_in_kiln"),
    ),
    Mutant(
        name="symbolic-relayout-left-to-torch",
        what="a clone of a tensor with symbolic sizes into another layout (attention's head split and merge) is not taken as a copy worth a kiln part",
        file="client/python/kiln/torch/partition.py",
        find="    if not (L.is_static_tensor(src) or L.is_symbolic_tensor(src)):",
        replace="    if not L.is_static_tensor(src):",
        tests=_daemon("tests/python/test_torch_backend.py -k test_dynamic_attention_head_copies_run_in_kiln"),
    ),
    Mutant(
        name="sunk-bias-in-wrong-shape",
        what="a bias add moved below a reshape to heads views the bias with the heads and their width swapped",
        file="client/python/kiln/torch/passes/unfuse_addmm_epilogues.py",
        find="    return tuple(trailing) if have == want and trailing else None",
        replace="    return tuple(reversed(trailing)) if have == want and trailing else None",
        tests=_daemon("tests/python/test_torch_backend.py -k test_dynamic_attention_head_copies_run_in_kiln"),
    ),
    Mutant(
        name="machine-answer-private-file-not-required",
        what="an answer read back from a file other users could write is used without verifying its signature",
        file="client/core/answers.cc",
        find="  answer.is_private = st.st_uid == geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;",
        replace="  answer.is_private = true;",
        build=("kiln_core",),
        tests=("gtest:client_session_answers_test:*Forged*",
               *_daemon("tests/python/test_trust.py -k this_machines_answers")),
    ),
    Mutant(
        name="machine-answer-age-ignored",
        what="an answer kilnd gave this machine is used again however long ago kilnd gave it",
        file="client/core/answers.cc",
        find="                    SecondsSince(st.st_mtim) <= max_age_s && ReadAll(fd, st.st_size, &data);",
        replace="                    ReadAll(fd, st.st_size, &data);",
        build=("kiln_core",),
        tests=("gtest:client_answers_test", "gtest:client_session_answers_test:*PastTheirTtl*",
               *_daemon("tests/python/test_request_keys.py -k past_their_ttl")),
    ),
    Mutant(
        name="machine-answer-integrity-unchecked",
        what="an answers file is used without comparing its response with the SHA-256 recorded in it",
        file="client/core/answers.cc",
        find="      key::Sha256Raw(view.substr(head)) != view.substr(kMagic.size(), key::kDigestBytes)) {",
        replace="      false) {",
        build=("kiln_core",),
        tests=("gtest:client_answers_test", "gtest:client_session_answers_test:*Damaged*",
               *_daemon("tests/python/test_request_keys.py -k damaged", "tests/python/test_core.py -k damaged")),
    ),
    Mutant(
        name="cuda-shared-limit-set-per-step",
        what="the CUDA loader sets a kernel's shared memory limit to what its first step asks, not the most any step asks",
        file="client/core/cuda_loader.cc",
        find="d.cuFuncSetAttribute(f, kMaxDynamicShared, static_cast<int>(most->second));",
        replace="d.cuFuncSetAttribute(f, kMaxDynamicShared, static_cast<int>(s.shared_bytes));",
        build=("kiln_core",),
        tests=("gtest:cuda_loader_test:*LargestSharedMemoryLimit*",),
    ),
    Mutant(
        name="layout-view-copy-skipped",
        what="the channels-last pass gives up on a graph with a view its new layout cannot express instead of copying the view's operand",
        file="client/python/kiln/torch/passes/channels_last.py",
        find="                    raise _ViewNeedsCopy(n) from None",
        replace="                    raise RuntimeError(n.name) from None",
        tests=_daemon("tests/python/test_torch_backend.py -k cannot_express"),
    ),
    Mutant(
        name="sealed-miss-unexplained",
        what="a precompiled model's key components are not kept in kilnd, so a sealed miss cannot say what differs",
        file="client/python/kiln/torch/precompile.py",
        find="            settings.client.put_model(_explain_key(self._model), EXPLAIN_FORMAT,",
        replace="            None and settings.client.put_model(_explain_key(self._model), EXPLAIN_FORMAT,",
        tests=_daemon("tests/python/test_torch_precompile.py -k sealed_miss_is_refused"),
    ),
    Mutant(
        name="cuda-pointwise-block-stride",
        what="generated CUDA pointwise kernels step one element short per block (the last elements of each block's range are never computed)",
        file="kernels/codegen/cuda/cuda_strategies.cc",
        find='absl::StrCat("const ", cfg_.index_type, " kv = blockIdx.x * ", B, " + threadIdx.x;"));',
        replace='absl::StrCat("const ", cfg_.index_type, " kv = blockIdx.x * ", B - 1, " + threadIdx.x;"));',
        tests=("gtest:cuda_codegen_test:CudaEmulation.Pointwise:CudaEmulation.Views",),
    ),
    Mutant(
        name="redis-moved-not-followed",
        what="the Redis cluster client learns a MOVED slot but sends the command to the old node again",
        file="server/shared/redis_client.cc",
        find="      RefreshSlots().IgnoreError();\n      node = target;\n",
        replace="      RefreshSlots().IgnoreError();\n",
        tests=("gtest:shared_tier_test:RedisClusterRoutingTest.*",),
    ),
    Mutant(
        name="redis-cluster-one-node-down-takes-all",
        what="the Redis cluster client fails every key fast while any one master is down",
        file="server/shared/redis_client.cc",
        find="  if (FailsFast(*node)) {",
        replace="  if (FailsFast(*node) || down_nodes_.load() > 0) {",
        tests=("gtest:shared_tier_test:RedisClusterRoutingTest.AMasterDownTakesOutItsSlotsOnly",),
    ),
    Mutant(
        name="request-index-answers-any-key",
        what="a lookup by request key answers the most recent request's result whatever the key",
        file="server/compile/result_cache.cc",
        find='  if (it == index_.end()) return "";',
        replace='  if (it == index_.end() || true) return lru_.empty() ? "" : lru_.front().second;',
        tests=("pytest:tests/python/test_request_keys.py -k fresh_client",),
    ),
    Mutant(
        name="redis-tls-trusts-any-certificate",
        what="TLS to Redis accepts a server certificate no trusted CA signed",
        file="server/shared/redis_connection.cc",
        find="  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);",
        replace="  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);",
        tests=("gtest:shared_tier_test:RedisTlsTest.AnUntrustedOrMisnamedServerIsRefused",),
    ),
    Mutant(
        name="redis-tls-any-server-name",
        what="TLS to Redis accepts a trusted certificate issued for another name",
        file="server/shared/redis_connection.cc",
        find="    SSL_set1_host(ssl_, name.c_str());",
        replace="",
        tests=("gtest:shared_tier_test:RedisTlsTest.AnUntrustedOrMisnamedServerIsRefused",),
    ),
    Mutant(
        name="l2-missing-mac-accepted",
        what="a replica with the cluster's secret serves shared records that carry no MAC",
        file="server/shared/l2_records.cc",
        find="    if (auth.accept_unauthenticated) return payload;",
        replace="    return payload;",
        tests=("gtest:shared_tier_test:L2RecordsTest.MacsBindRecordsToTheClusterSecret",),
    ),
    Mutant(
        name="l2-mac-not-compared",
        what="a shared record's MAC is read but never compared with the one the secret makes",
        file="server/shared/l2_records.cc",
        find="  if (!MacMatches(auth, digest, value.substr(kActionHeaderBytes, kMacBytes))) {",
        replace="  if (false) {",
        tests=("gtest:shared_tier_test:L2RecordsTest.MacsBindRecordsToTheClusterSecret",),
    ),
    Mutant(
        name="build-inputs-not-shared",
        what="a replica lacking a custom build's input never looks for it in the shared tier",
        file="server/ext/input_store.cc",
        find="  if (!shared_ || !IsHexDigest(hex)) return false;",
        replace="  return false;",
        tests=("pytest:tests/python/test_shared_cache.py -k build_inputs",),
    ),
    Mutant(
        name="cuda-few-rows-never-split",
        what="a CUDA row kernel over a few long rows with short reductions keeps one block per row",
        file="kernels/codegen/cuda/cuda_kernel.cc",
        find="    Row(RowSplitPoint(d_outer, fv));",
        replace="    Row(d_outer);",
        tests=("gtest:cuda_codegen_test:CudaEmulation.FewLongRowsSplitDeeper",),
    ),
    Mutant(
        name="disk-full-never-resumes",
        what="a store suspended by a full disk never resumes writing once space is back",
        file="server/store/rocksdb_store.cc",
        find="  if (rocksdb::Status s = db_->Resume(); !s.ok()) {",
        replace="  if (rocksdb::Status s = db_->Resume(); true) {",
        tests=("gtest:store_disk_full_test",),
    ),
    Mutant(
        name="l2-signature-unchecked",
        what="a replica that signs takes records from Redis without checking their signature",
        file="server/shared/shared_store.cc",
        find="  if (payload.ok() && options_.verify) {",
        replace="  if (false && options_.verify) {",
        tests=("gtest:shared_tier_test:SharedTierTest.ARecordThatFailsTheSignatureCheckIsACorruptionNotAHit",),
    ),
    Mutant(
        name="lowering-remainder-as-floordiv",
        what="the torch lowering table lowers aten.remainder as a floor division",
        file="client/python/kiln/torch/lowering.py",
        find='register_lowering(aten.remainder.Tensor, aten.remainder.Scalar)(_binary_arith("remainder"))',
        replace='register_lowering(aten.remainder.Tensor, aten.remainder.Scalar)(_binary_arith("floordiv"))',
        tests=_daemon("tests/python/test_torch_backend.py::test_many_ops_match_eager"),
        build=("kilnd",),
    ),
    Mutant(
        name="tracer-subtract-as-add",
        what="the NumPy tracer records np.subtract (and `-`) as an addition",
        file="client/python/kiln/tracer.py",
        find='np.subtract: _bin("sub")',
        replace='np.subtract: _bin("add")',
        tests=("pytest:tests/python/test_tracer_offline.py",),
    ),
    Mutant(
        name="partition-shared-value-not-output",
        what="the partitioner returns a part's value only when nothing inside the part reads it too",
        file="client/python/kiln/torch/partition.py",
        find="            if any(u not in members for u in n.users):\n                s.outputs.append(n)",
        replace="            if all(u not in members for u in n.users):\n                s.outputs.append(n)",
        tests=_daemon("tests/python/test_torch_backend.py::test_lltm_forward_and_backward"),
        build=("kilnd",),
    ),
    Mutant(
        name="autotune-margin-narrowed",
        what="the tuner takes a variant 1% faster than the default (the margin is 3%)",
        file="client/python/kiln/autotune.py",
        find="MIN_GAIN = 0.03",
        replace="MIN_GAIN = 0.01",
        tests=_daemon("tests/python/test_torch_backend.py::"
                      "test_tuner_keeps_the_default_unless_a_variant_is_faster_both_ways"),
        build=("kilnd",),
    ),
    Mutant(
        name="ext-one-command-at-a-time",
        what="a custom build compiles its sources one after another again",
        file="server/ext/ext.cc",
        find="  const int lanes = static_cast<int>(std::min<int64_t>(",
        replace="  const int lanes = 1 + 0 * static_cast<int>(std::min<int64_t>(",
        tests=("gtest:ext_test:ExtensionBuilderTest.CompilesTheSourcesOfOneBuildAtOnce",),
    ),
    Mutant(
        name="ext-toolkit-links-missing",
        what="the build sandbox lacks the links that name the CUDA toolkit (/usr/local/cuda -> ...)",
        file="server/ext/ext.cc",
        find="  for (const auto& link : toolkit.links) resolved.sandbox.toolchain_links.push_back(link);\n",
        replace="",
        tests=("gtest:ext_test:ExtensionBuilderTest.CudaSourcesGoToTheRealNvccWithEachTarget",),
    ),
    Mutant(
        name="cuda-arch-specific-dropped",
        what="an arch-specific target (TORCH_CUDA_ARCH_LIST=9.0a) is built as the plain one (sm_90)",
        file="server/ext/cuda_targets.cc",
        find='return absl::StrCat(t.sm, t.arch_specific ? "a" : "");',
        replace="return absl::StrCat(t.sm);",
        tests=("gtest:cuda_targets_test",),
    ),
]

# A quick sample (KILN_MUTATIONS=sample deploy/test.sh; CI runs every mutant): one compiler
# bug, one cache bug.
CI_SAMPLE = ["cpu-sin-cos-swapped", "store-blob-digest-unchecked"]
