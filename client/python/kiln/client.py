"""kiln.Client: compile graphs on a kilnd daemon, fetch the artifacts, run them locally.

Example::

    client = kiln.Client()                      # $KILN_SERVER or localhost:50051
    compiled = client.compile(graph, target="cpu")
    (out,) = compiled(x, y)                     # or a single array for a one-output graph

A CPU result runs on NumPy arrays; a CUDA result (``target="cuda:sm_90"``) on CUDA arrays
(PyTorch tensors, CuPy arrays), through :mod:`kiln.cuda`.

Calls retry as :mod:`kiln.retry` says (the policy the C++ client shares): UNAVAILABLE for a
few seconds, an overloaded daemon's RESOURCE_EXHAUSTED while the deadline allows. Artifacts are kept in
a local content-addressed folder (see :mod:`kiln.cache`) and verified before use; a shared
object is opened once per process.

Trust: ``tls_ca`` (``$KILN_TLS_CA``) makes the channel TLS, ``tls_cert``/``tls_key``
(``$KILN_TLS_CERT``/``$KILN_TLS_KEY``) add a client certificate (mTLS), ``token``
(``$KILN_TOKEN``) is sent as ``authorization: Bearer`` on every call. Every result is checked
against the :class:`kiln.trust.TrustPolicy` (``trusted_keys``, ``allow_unsigned``) as it
arrives, before anything of it is fetched or loaded, and the bytes of an artifact are hashed
against the signed digest again right before they are loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import grpc
import numpy as np

from . import dtypes as dt
from ._once import KeyedLocks
from .cache import ArtifactCache
from .errors import ArtifactError, CompileError, KilnError, NotFoundError, RpcError, VerificationError
from .loader import CpuKernel, aligned_empty, default_num_threads, load_cpu_kernel
from .recorder import Recorder
from .retry import RetryPolicy, call_with_retries
from .target import ISA_LEVELS, Target, host_isa
from .trust import TrustPolicy
from .v1 import graph_pb2, service_pb2, service_pb2_grpc

DEFAULT_ADDRESS = "localhost:50051"
TargetLike = Union[str, Target, Any]

# Status codes that mean "the request was wrong or the compile failed", not "try again".
_COMPILE_ERROR_CODES = frozenset({"INVALID_ARGUMENT", "INTERNAL", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED"})


def make_options(opt_level: Optional[int] = None, vector_math: bool = True, algebraic_rewrites: bool = True,
                 variant: int = 0) -> Any:
    """A kiln.v1.CompileOptions: ``opt_level`` 0-3 (default: the daemon's, 3), ``vector_math``
    allows vectorised transcendentals (a few ulp), ``algebraic_rewrites`` allows reassociating
    rewrites such as a sum of a product over disjoint axes computed as a product of sums
    (results within the op suite's tolerance), ``variant`` picks one of the compiler's kernel
    variants for tuning (0: its default choice; see :func:`kiln.autotune`)."""
    o = service_pb2.CompileOptions()
    if opt_level is not None:
        if not 0 <= opt_level <= 3:
            raise ValueError("opt_level is 0..3")
        o.opt_level = opt_level
        o.opt_level_set = True
    o.disable_vector_math = not vector_math
    o.disable_algebraic_rewrites = not algebraic_rewrites
    if variant < 0:
        raise ValueError("variant is >= 0")
    o.variant = variant
    return o


def _as_options(options: Any) -> Any:
    if options is None:
        return service_pb2.CompileOptions()
    if isinstance(options, dict):
        return make_options(**options)
    return options


class Client:
    """A connection to a kilnd daemon plus the local artifact cache.

    ``address`` defaults to ``$KILN_SERVER``, then ``localhost:50051``. ``cache_dir`` defaults
    to ``$KILN_CACHE_DIR``, then ``~/.cache/kiln``. ``timeout`` is the deadline in seconds of
    quick calls (lookup, stats, source...), ``compile_timeout`` that of compiles (which may
    wait in the daemon's queue); both include retries. ``retry`` is the retry policy
    (:class:`kiln.retry.RetryPolicy`; by default UNAVAILABLE is retried for 5 s, an overloaded
    daemon's RESOURCE_EXHAUSTED until the deadline); ``max_attempts``, when given, caps its
    attempts. ``recorder`` defaults to one for
    ``$KILN_RECORD_DIR`` when set. Thread-safe; close it (or use ``with``) to free the channel.

    ``tls_ca``, ``tls_cert``, ``tls_key``: PEM files for TLS / mTLS (defaults from
    ``$KILN_TLS_CA``, ``$KILN_TLS_CERT``, ``$KILN_TLS_KEY``). ``token``: bearer token
    (``$KILN_TOKEN``). ``trusted_keys``: PEM Ed25519 public keys whose signatures are accepted
    (``$KILN_TRUSTED_KEYS``, comma-separated); ``allow_unsigned``: accept unsigned results
    (default: only when no key is configured). See :mod:`kiln.trust`.
    """

    def __init__(
        self,
        address: Optional[str] = None,
        *,
        cache_dir: Optional[Union[str, Path]] = None,
        timeout: float = 60.0,
        compile_timeout: float = 600.0,
        max_attempts: Optional[int] = None,
        retry: Optional[RetryPolicy] = None,
        recorder: Optional[Recorder] = None,
        channel_options: Optional[Sequence[tuple[str, Any]]] = None,
        token: Optional[str] = None,
        tls_ca: Optional[Union[str, Path]] = None,
        tls_cert: Optional[Union[str, Path]] = None,
        tls_key: Optional[Union[str, Path]] = None,
        trusted_keys: Optional[Sequence[Union[str, Path]]] = None,
        allow_unsigned: Optional[bool] = None,
    ) -> None:
        self.address = address or os.environ.get("KILN_SERVER") or DEFAULT_ADDRESS
        self.timeout = timeout
        self.compile_timeout = compile_timeout
        self.retry = retry or RetryPolicy()
        if max_attempts is not None:
            self.retry = dataclasses.replace(self.retry, max_attempts=max(1, max_attempts))
        opts = [
            ("grpc.max_receive_message_length", 256 << 20),
            ("grpc.max_send_message_length", 256 << 20),
            # Reconnect quickly after the daemon restarts: gRPC's default backoff grows to
            # two minutes, during which every retry below would fail at once.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        opts.extend(channel_options or [])
        self.trust = TrustPolicy(trusted_keys, allow_unsigned)
        self._channel = _make_channel(self.address, opts, token, tls_ca, tls_cert, tls_key)
        self._stub = service_pb2_grpc.KilnStub(self._channel)
        self.cache = ArtifactCache(cache_dir)
        self.recorder = recorder if recorder is not None else Recorder.from_env()
        self._fetch_locks = KeyedLocks()  # one download per digest at a time

    def close(self) -> None:
        """Closes the channel; the client is unusable afterwards."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kiln.Client({self.address!r})"

    # ------------------------------------------------------------------ RPC plumbing

    def _call(self, method: str, request: Any, timeout: Optional[float]) -> Any:
        """A unary call retried under ``self.retry`` within its deadline; errors become
        :class:`RpcError` subclasses."""
        fn = getattr(self._stub, method)
        try:
            return call_with_retries(lambda remaining: fn(request, timeout=remaining),
                                     timeout if timeout is not None else self.timeout, self.retry)
        except grpc.RpcError as e:
            raise _translate(method, e) from None

    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """The daemon's gRPC health status for ``service``: ``"SERVING"``, ``"NOT_SERVING"``,
        ``"UNKNOWN"``...; raises RpcError when the daemon cannot be reached."""
        # grpc.health.v1 messages are encoded by hand: HealthCheckRequest{service} is field 1
        # (string), HealthCheckResponse{status} is field 1 (enum). No extra dependency needed.
        svc = service.encode()
        req = (b"\x0a" + _varint(len(svc)) + svc) if svc else b""
        call = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            resp = call(req, timeout=timeout)
        except grpc.RpcError as e:
            raise _translate("Health.Check", e) from None
        status = resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, str(status))

    # ------------------------------------------------------------------ compile

    def _request(self, graph: Any, target: TargetLike, options: Any, priority: int = 0) -> Any:
        if not isinstance(graph, graph_pb2.Graph):
            raise TypeError(f"expected a kiln.v1.Graph, got {type(graph).__name__} (use GraphBuilder.build)")
        req = service_pb2.CompileRequest()
        req.graph.CopyFrom(graph)
        req.target.CopyFrom(Target.parse(target).to_proto())
        req.options.CopyFrom(_as_options(options))
        req.priority = priority
        return req

    def compile(self, graph: Any, target: TargetLike = "cpu", options: Any = None, *, timeout: Optional[float] = None) -> "Compiled":
        """Gets or compiles ``graph`` (a kiln.v1.Graph) for ``target``.

        ``target``: ``"cpu"`` (this machine's ISA level), ``"cpu:x86-64-v3"``,
        ``"cuda:sm_90"``, a :class:`kiln.Target` or a kiln.v1.Target. ``options``: a
        kiln.v1.CompileOptions or a dict for :func:`make_options`. Raises CompileError for a
        graph the daemon rejects (the message names the node and the rule) or fails to build.
        """
        req = self._request(graph, target, options)
        resp = self._call("Compile", req, timeout if timeout is not None else self.compile_timeout)
        if self.recorder is not None:
            # Only graphs the daemon accepted: a replay of a rejected one would fail again.
            self.recorder.record(req)
        compiled = Compiled(self, resp, graph=graph)
        compiled._save_manifest()
        return compiled

    def lookup(self, graph: Any, target: TargetLike = "cpu", options: Any = None, *, timeout: Optional[float] = None) -> Optional["Compiled"]:
        """The cached result for ``graph`` on ``target``, or None when the daemon has none."""
        req = service_pb2.LookupRequest()
        full = self._request(graph, target, options)
        req.graph.CopyFrom(full.graph)
        req.target.CopyFrom(full.target)
        req.options.CopyFrom(full.options)
        try:
            resp = self._call("Lookup", req, timeout)
        except NotFoundError:
            return None
        return Compiled(self, resp, graph=graph)

    def get(self, handle: str, *, timeout: Optional[float] = None) -> "Compiled":
        """The compiled result stored under ``handle``; NotFoundError when it is not cached."""
        resp = self._call("GetResult", service_pb2.GetResultRequest(handle=handle), timeout)
        if not resp.handle:
            resp.handle = handle
        return Compiled(self, resp)

    def source(self, handle: str, *, timeout: Optional[float] = None) -> Any:
        """The kiln.v1.GetSourceResponse (source, fusion report, language) of ``handle``."""
        return self._call("GetSource", service_pb2.GetSourceRequest(handle=handle), timeout)

    def explain(self, graph: Any, target: TargetLike = "cpu", options: Any = None, *,
                max_entries: int = 0, timeout: Optional[float] = None) -> Any:
        """Why ``graph`` would miss on ``target``: a kiln.v1.ExplainResponse with the request's
        key fields, whether it is cached, and the stored entries for the same graph (fewest
        differing fields first, at most ``max_entries``; 0 is the daemon's default)."""
        full = self._request(graph, target, options)
        req = service_pb2.ExplainRequest(max_entries=max_entries)
        req.graph.CopyFrom(full.graph)
        req.target.CopyFrom(full.target)
        req.options.CopyFrom(full.options)
        return self._call("Explain", req, timeout)

    def _tuning_request(self, graph: Any, target: TargetLike, options: Any, device: str) -> Any:
        full = self._request(graph, target, options)
        req = service_pb2.TuningRequest(device=device)
        req.graph.CopyFrom(full.graph)
        req.target.CopyFrom(full.target)
        req.options.CopyFrom(full.options)
        return req

    def lookup_tuning(self, graph: Any, target: TargetLike, device: str, options: Any = None, *,
                      timeout: Optional[float] = None) -> Any:
        """The shared tuning of ``graph`` on ``device`` (a kiln.v1.TuningResponse: ``found``,
        ``variant``, ``timings``), as some client recorded it with :meth:`record_tuning`."""
        return self._call("LookupTuning", self._tuning_request(graph, target, options, device), timeout)

    def record_tuning(self, graph: Any, target: TargetLike, device: str, variant: int,
                      timings: Sequence[tuple[int, float]] = (), options: Any = None, *,
                      timeout: Optional[float] = None) -> Any:
        """Stores ``variant`` as the fastest of ``graph`` on ``device`` for every client of
        the daemon's store (``timings``: (variant, median ms) pairs, for reports)."""
        req = self._tuning_request(graph, target, options, device)
        req.variant = int(variant)
        for v, ms in timings:
            req.timings.add(variant=int(v), median_ms=float(ms))
        return self._call("RecordTuning", req, timeout)

    def stats(self, *, timeout: Optional[float] = None) -> Any:
        """The daemon's counters: a kiln.v1.GetStatsResponse."""
        return self._call("GetStats", service_pb2.GetStatsRequest(), timeout)

    # ------------------------------------------------------------------ compiled models

    def put_model(self, model_key: str, fmt: str, record: bytes, parts: Sequence[str], *,
                  timeout: Optional[float] = None) -> str:
        """Stores a front end's compiled-model ``record`` (format ``fmt``) under ``model_key``
        (a hex SHA-256 the front end computed); ``parts`` are the handles of the cached results
        it runs. Returns the record's store handle. See kiln.v1.PutModelRequest."""
        req = service_pb2.PutModelRequest(model_key=model_key, format=fmt, record=record, parts=list(parts))
        return self._call("PutModel", req, timeout).handle

    def get_model(self, model_key: str, fmt: str, *,
                  timeout: Optional[float] = None) -> Optional[tuple[bytes, list[Any]]]:
        """The record stored under ``model_key`` and the daemon's answers (kiln.v1.CompileResponse)
        for the parts it names, in one call, or None when the daemon has no complete one. The
        record's signature and digest are checked like a result's (VerificationError when they
        fail); each part's is checked when it becomes a :class:`Compiled`."""
        try:
            resp = self._call("GetModel", service_pb2.GetModelRequest(model_key=model_key, format=fmt), timeout)
        except NotFoundError:
            return None
        self.trust.check(resp.handle, resp.record_result)
        arts = [a for a in resp.record_result.artifacts if a.kind == service_pb2.MODEL_RECORD]
        if len(arts) != 1:
            raise VerificationError(f"model record {resp.handle[:12]} names {len(arts)} record artifacts")
        got = hashlib.sha256(resp.record).hexdigest()
        if got != arts[0].digest:
            raise VerificationError(f"model record {resp.handle[:12]} does not match its signed digest "
                                    f"{arts[0].digest[:12]} (it hashes to {got[:12]})", digest=arts[0].digest)
        return resp.record, list(resp.parts)

    def export_entries(self, after_key: str = "", *, timeout: Optional[float] = None) -> tuple[list[Any], str]:
        """One page of the daemon's stored entries (kiln.v1.BundleEntry: key, result, blobs) in
        key order after ``after_key``, and the key to ask after next ("" when this page was the
        last). Needs role admin. :mod:`kiln.bundle` writes the pages to a file."""
        resp = self._call("ExportEntries", service_pb2.ExportEntriesRequest(after_key=after_key), timeout)
        return list(resp.entries), resp.next_key

    def import_entries(self, entries: Sequence[Any], *, resign: bool = False,
                       timeout: Optional[float] = None) -> tuple[int, int]:
        """Stores bundle entries in the daemon (checked there: keys, blob digests, signatures;
        one bad entry refuses the call and stores none of it). Returns (stored, already
        present). Needs role admin."""
        resp = self._call("ImportEntries", service_pb2.ImportEntriesRequest(entries=list(entries), resign=resign),
                          timeout)
        return resp.stored, resp.present

    def fetch_many(self, digests: Sequence[str], *, timeout: Optional[float] = None) -> None:
        """Brings every artifact of ``digests`` the local folder lacks, in as few calls as the
        daemon's reply size allows (GetBlobs); each is verified against its digest before it
        is stored. Loads read them back from the folder (:meth:`read_verified`)."""
        missing = [d for d in dict.fromkeys(digests) if self.cache.get(d) is None]
        while missing:
            resp = self._call("GetBlobs", service_pb2.GetBlobsRequest(digests=missing), timeout)
            if not resp.blobs:
                raise ArtifactError(f"the daemon sent none of {len(missing)} artifacts", missing[0])
            for digest, blob in zip(missing, resp.blobs):
                try:
                    self.cache.put_chunks(digest, [blob], len(blob))  # verified there
                except ValueError as e:
                    raise ArtifactError(str(e), digest) from None
            missing = missing[len(resp.blobs):]

    # ------------------------------------------------------------------ artifacts

    def fetch(self, digest: str, *, size: Optional[int] = None, timeout: Optional[float] = None) -> Path:
        """The local path of artifact ``digest``, streaming it from the daemon if absent.

        The bytes are verified against the digest before the file appears; concurrent fetches
        of one digest in this process share one download.
        """
        path = self.cache.get(digest)
        if path is not None:
            return path
        with self._fetch_locks(digest):
            path = self.cache.get(digest)
            if path is not None:
                return path
            return self._download(digest, size, timeout if timeout is not None else max(self.timeout, 300.0))

    def read_verified(self, digest: str, *, size: Optional[int] = None, timeout: Optional[float] = None) -> bytes:
        """The bytes of artifact ``digest``, read from the local folder (fetched first when
        absent) and hashed right here, so what the caller loads is exactly what the digest
        names. A local file changed since it was stored is deleted and VerificationError
        raised."""
        try:
            # Present already: read and hashed once here (fetch() would hash it a first time).
            path = self.cache.path_for(digest)
            data = path.read_bytes()
        except FileNotFoundError:
            path = self.fetch(digest, size=size, timeout=timeout)
            data = path.read_bytes()
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            try:
                path.unlink()
            except OSError:
                pass
            raise VerificationError(f"local artifact {path} does not match its digest {digest[:12]} (it hashes to "
                                    f"{got[:12]}): deleted, refusing to load it", digest=digest)
        return data

    def _download(self, digest: str, size: Optional[int], timeout: float) -> Path:
        def attempt(remaining: float) -> Path:
            deadline = time.monotonic() + remaining
            expected = [size]

            def chunks() -> Iterable[bytes]:
                stream = self._stub.FetchArtifact(
                    service_pb2.FetchArtifactRequest(digest=digest),
                    timeout=max(deadline - time.monotonic(), 0.001),
                )
                offset = 0
                for chunk in stream:
                    if chunk.offset != offset:
                        raise ArtifactError(f"artifact {digest}: chunk at {chunk.offset}, expected {offset}", digest)
                    if chunk.total_size and expected[0] is None:
                        expected[0] = chunk.total_size
                    offset += len(chunk.data)
                    yield chunk.data

            try:
                return self.cache.put_chunks(digest, _Sized(chunks(), expected), None)
            except ValueError as e:  # digest or size mismatch
                raise ArtifactError(str(e), digest) from None

        try:
            return call_with_retries(attempt, timeout, self.retry)
        except grpc.RpcError as e:
            raise _translate("FetchArtifact", e) from None

    # ------------------------------------------------------------------ prewarm

    def prewarm(
        self,
        requests: Iterable[Any],
        *,
        on_event: Optional[Callable[[Any, Any], None]] = None,
        timeout: Optional[float] = None,
    ) -> list[Any]:
        """Compiles many requests at prewarm priority; returns one kiln.v1.PrewarmEvent each.

        Each item is a kiln.v1.CompileRequest with a target, or a ``(graph, target)`` or
        ``(graph, target, options)`` tuple. ``on_event(request, event)`` is called as each
        outcome arrives (for progress). Events come back in request order in the list; a
        failed compile is an event with a nonzero ``code``, not an exception. Requests left
        unanswered when the stream breaks with UNAVAILABLE are sent again.
        """
        reqs: list[Any] = []
        for item in requests:
            if isinstance(item, service_pb2.CompileRequest):
                if not item.HasField("target"):
                    raise ValueError("a prewarm CompileRequest needs a target")
                r = service_pb2.CompileRequest()
                r.CopyFrom(item)
            else:
                r = self._request(item[0], item[1], item[2] if len(item) > 2 else None)
            r.priority = service_pb2.PREWARM
            reqs.append(r)
        events: list[Any] = [None] * len(reqs)
        deadline = time.monotonic() + (timeout if timeout is not None else max(self.compile_timeout, 3600.0))

        def attempt(remaining: float) -> bool:
            """One stream over the requests still unanswered; True when it answered some
            before breaking (the caller then starts a fresh retry window)."""
            pending = [i for i, e in enumerate(events) if e is None]
            progressed = False
            try:
                stream = self._stub.Prewarm(iter([reqs[i] for i in pending]), timeout=remaining)
                for ev in stream:
                    if not 0 <= ev.index < len(pending):
                        continue
                    i = pending[ev.index]
                    e = service_pb2.PrewarmEvent()
                    e.CopyFrom(ev)
                    e.index = i
                    events[i] = e
                    progressed = True
                    if on_event is not None:
                        on_event(reqs[i], e)
            except grpc.RpcError as err:
                if progressed and err.code() == grpc.StatusCode.UNAVAILABLE:
                    return True
                raise
            return False

        while any(e is None for e in events):
            try:
                if call_with_retries(attempt, max(deadline - time.monotonic(), 0.001), self.retry):
                    continue
            except grpc.RpcError as err:
                raise _translate("Prewarm", err) from None
            missing = [i for i, e in enumerate(events) if e is None]
            if missing:
                # The daemon closed the stream without answering some: report them as failed.
                for i in missing:
                    e = service_pb2.PrewarmEvent(index=i, code=2, message="no outcome reported by the daemon")
                    events[i] = e
                    if on_event is not None:
                        on_event(reqs[i], e)
            return events


def _make_channel(address: str, opts: list[tuple[str, Any]], token: Optional[str],
                  tls_ca: Any, tls_cert: Any, tls_key: Any) -> grpc.Channel:
    """A plaintext or TLS channel to ``address``, sending ``token`` (when there is one) with
    every call."""
    env = os.environ.get
    ca, cert, key = (tls_ca or env("KILN_TLS_CA"), tls_cert or env("KILN_TLS_CERT"), tls_key or env("KILN_TLS_KEY"))
    if bool(cert) != bool(key):
        raise ValueError("a TLS client certificate needs its key (tls_cert and tls_key), and the reverse")
    if ca or cert:
        def read(p: Any) -> Optional[bytes]:
            return Path(p).expanduser().read_bytes() if p else None

        creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key), certificate_chain=read(cert))
        # gRPC bounds one connection attempt by the minimum reconnect backoff; a TLS handshake
        # with a busy daemon needs more than the 100 ms a plaintext connect gets.
        opts = [o for o in opts if o[0] != "grpc.min_reconnect_backoff_ms"] + [("grpc.min_reconnect_backoff_ms", 3000)]
        channel = grpc.secure_channel(address, creds, options=opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    token = token if token is not None else env("KILN_TOKEN")
    if token:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer TOKEN`` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, d: Any) -> Any:
        md = list(d.metadata or []) + [self._md]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _CallDetails(d, md)

    def intercept_unary_unary(self, cont: Any, d: Any, req: Any) -> Any:
        return cont(self._details(d), req)

    def intercept_unary_stream(self, cont: Any, d: Any, req: Any) -> Any:
        return cont(self._details(d), req)

    def intercept_stream_unary(self, cont: Any, d: Any, reqs: Any) -> Any:
        return cont(self._details(d), reqs)

    def intercept_stream_stream(self, cont: Any, d: Any, reqs: Any) -> Any:
        return cont(self._details(d), reqs)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, d: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


class _Sized:
    """An iterable of chunks that checks the total against a size learned while streaming."""

    def __init__(self, it: Iterable[bytes], expected: list[Optional[int]]) -> None:
        self._it = it
        self._expected = expected

    def __iter__(self) -> Any:
        n = 0
        for c in self._it:
            n += len(c)
            yield c
        if self._expected[0] is not None and n != self._expected[0]:
            raise ValueError(f"artifact truncated: got {n} bytes of {self._expected[0]}")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _translate(method: str, e: grpc.RpcError) -> RpcError:
    code = e.code().name if hasattr(e, "code") and e.code() is not None else "UNKNOWN"
    details = (e.details() if hasattr(e, "details") else "") or str(e)
    if code == "NOT_FOUND":
        return NotFoundError(method, code, details)
    if method in ("Compile", "Lookup", "Prewarm") and code in _COMPILE_ERROR_CODES:
        return CompileError(method, code, details)
    return RpcError(method, code, details)


def _host_runs(target: Target) -> bool:
    """Whether this machine can execute code built for ``target`` (a CPU target)."""
    if target.features:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                flags = next((set(l.split(":", 1)[1].split()) for l in f if l.startswith("flags")), set())
        except OSError:
            return True
        return set(target.features) <= flags
    if target.isa not in ISA_LEVELS:
        return True
    return ISA_LEVELS.index(target.isa) <= ISA_LEVELS.index(host_isa())


class TensorSpec:
    """The dtype, shape and (for inputs) declared strides of one kernel argument."""

    __slots__ = ("name", "dtype", "shape", "strides")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], strides: Optional[tuple[int, ...]] = None) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.strides = strides

    def __repr__(self) -> str:
        s = f", strides={list(self.strides)}" if self.strides else ""
        return f"TensorSpec({self.name!r}, {self.dtype}, {list(self.shape)}{s})"


class Compiled:
    """A compiled graph: its handle, the daemon's result, and a callable kernel.

    ``handle``: the action key (hex). ``cache_hit``: whether the daemon answered from its cache.
    ``result``: the kiln.v1.ActionResult; ``plan`` its launch plan; ``stats`` its compile stats;
    ``target``: the :class:`kiln.Target`. ``inputs``/``outputs``: :class:`TensorSpec` lists.
    Calling it runs the kernel: on NumPy arrays for a CPU target, on CUDA arrays (PyTorch
    tensors, CuPy arrays...) for a CUDA target.
    """

    def __init__(self, client: Client, response: Any, graph: Any = None) -> None:
        # Before anything of the result is used: a refused result raises VerificationError.
        client.trust.check(response.handle, response.result)
        self.client = client
        self.response = response
        self.handle: str = response.handle
        self.cache_hit: bool = response.cache_hit
        self.server_ms: float = response.server_ms
        self.result = response.result
        self.plan = response.result.plan
        self.stats = response.result.stats
        self.target = Target.from_proto(response.result.target) if response.result.HasField("target") else None
        self._kernel: Optional[CpuKernel] = None
        self._kernel_lock = threading.Lock()
        self._source: Optional[Any] = None
        self.inputs, self.outputs = self._specs(graph)
        # Symbolic plans (ABI 2): the symbols' names and where each is read, and every input's
        # and output's shape as polynomials of them (kernels/codegen/ABI.md).
        self.symbols: list[str] = [sym.name for sym in self.plan.symbols]
        self._in_exprs: list[list[Any]] = []
        self._out_exprs: list[list[Any]] = []
        if self.symbols:
            by_role: dict[tuple[int, int], Any] = {(b.role, b.index): b for b in self.plan.buffers}
            self._in_exprs = [list(by_role[(service_pb2.INPUT, i)].shape_exprs) for i in range(len(self.inputs))]
            self._out_exprs = [list(by_role[(service_pb2.OUTPUT, i)].shape_exprs) for i in range(len(self.outputs))]

    def __repr__(self) -> str:
        return (f"<kiln.Compiled {self.handle[:12]} target={self.target} kernels={self.stats.num_kernels} "
                f"cache_hit={self.cache_hit}>")

    def _specs(self, graph: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
        ins: dict[int, TensorSpec] = {}
        outs: dict[int, TensorSpec] = {}
        for b in self.plan.buffers:
            if b.role == service_pb2.INPUT:
                ins[b.index] = TensorSpec(f"input{b.index}", dt.from_wire(b.dtype), tuple(b.shape))
            elif b.role == service_pb2.OUTPUT:
                outs[b.index] = TensorSpec(f"output{b.index}", dt.from_wire(b.dtype), tuple(b.shape))
        names: list[dict[str, Any]] = []
        if graph is not None:
            names = [{"name": i.name, "dtype": dt.from_wire(i.type.dtype), "shape": list(i.type.shape),
                      "strides": list(i.type.strides) or None} for i in graph.inputs]
        elif self.handle:
            m = self.client.cache.load_manifest(self.handle) if _is_hex64(self.handle) else None
            names = (m or {}).get("inputs", [])
        if not ins and names:  # a plan without input buffers: take the graph's word
            ins = {i: TensorSpec(n["name"], n["dtype"], tuple(n["shape"])) for i, n in enumerate(names)}
        for i, n in enumerate(names):
            if i in ins:
                ins[i].name = n.get("name") or ins[i].name
                st = n.get("strides")
                ins[i].strides = tuple(st) if st else None
        return [ins[i] for i in sorted(ins)], [outs[i] for i in sorted(outs)]

    def _save_manifest(self) -> None:
        if _is_hex64(self.handle):
            self.client.cache.save_manifest(self.handle, {
                "inputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape),
                            "strides": list(s.strides) if s.strides else None} for s in self.inputs],
                "outputs": [{"dtype": s.dtype, "shape": list(s.shape)} for s in self.outputs],
                "target": str(self.target) if self.target else "",
            })

    def artifact(self, kind: Union[int, str]) -> Optional[Any]:
        """The first artifact of ``kind`` (a kiln.v1.ArtifactKind number or name), or None."""
        k = service_pb2.ArtifactKind.Value(kind) if isinstance(kind, str) else kind
        return next((a for a in self.result.artifacts if a.kind == k), None)

    def _get_source(self) -> Any:
        if self._source is None:
            self._source = self.client.source(self.handle)
        return self._source

    def source(self) -> str:
        """The generated translation unit (C++ or CUDA C++)."""
        return self._get_source().source

    def fusion_report(self) -> str:
        """The daemon's fusion report: kernels, their nodes, and why pairs were not fused."""
        return self._get_source().fusion_report

    @property
    def is_cuda(self) -> bool:
        """Whether this result runs on CUDA devices (its target, else its artifacts, say so)."""
        if self.target is not None:
            return self.target.is_cuda
        return self.artifact(service_pb2.CUBIN) is not None or self.artifact(service_pb2.PTX) is not None

    def load_cuda(self, device: Any = None) -> Any:
        """The :class:`kiln.cuda.CudaKernel` of a CUDA result on ``device`` (an index, a
        ``torch.device``, or None for the current device): fetched and loaded once per process
        per device. Needs the CUDA driver."""
        if not self.is_cuda:
            raise KilnError(f"{self.handle[:12]} was compiled for {self.target}, not a CUDA target")
        from . import cuda

        return cuda.load_kernel(self, device)

    def load(self) -> CpuKernel:
        """Fetches (once, verified) and opens (once per process) the CPU shared object; for a
        CUDA result see :meth:`load_cuda`."""
        if self._kernel is not None:
            return self._kernel
        with self._kernel_lock:
            if self._kernel is None:
                if self.is_cuda:
                    raise KilnError(f"{self.handle[:12]} was compiled for {self.target}: load it with load_cuda()")
                if self.target is not None and not _host_runs(self.target):
                    raise KilnError(f"{self.handle[:12]} was compiled for {self.target}, which this CPU ({host_isa()}) cannot run")
                art = self.artifact(service_pb2.SHARED_OBJECT)
                if art is None:
                    raise ArtifactError(f"{self.handle[:12]} has no shared object artifact")
                image = self.client.read_verified(art.digest, size=art.size or None)
                self._kernel = load_cpu_kernel(image, art.digest, int(self.plan.abi_version or 1))
        return self._kernel

    def __call__(self, *arrays: Any, num_threads: Optional[int] = None, out: Optional[Sequence[Any]] = None) -> Any:
        """Runs the kernel: inputs in graph order; returns the outputs (a tuple, or the array
        itself for a one-output graph), freshly allocated unless ``out`` gives C-contiguous
        arrays of the right dtypes and shapes.

        Inputs must have the graph's dtypes and shapes (TypeError/ValueError otherwise);
        non-contiguous arrays are copied unless the graph declared their strides, in which case
        they must have exactly those strides.

        CPU targets take NumPy arrays; ``num_threads`` defaults to ``$KILN_NUM_THREADS`` or the
        CPUs this process may use. CUDA targets take CUDA arrays and return arrays of the same
        kind, computed asynchronously on that framework's current stream (see
        :func:`kiln.cuda.run_compiled`); host arrays raise TypeError there.
        """
        if self.is_cuda:
            from . import cuda

            return cuda.run_compiled(self, arrays, out=out)
        kernel = self.load()
        if len(arrays) != len(self.inputs):
            raise TypeError(f"{self.handle[:12]} takes {len(self.inputs)} inputs, got {len(arrays)}")
        keep: list[np.ndarray] = []
        ptrs: list[int] = []
        sizes: Optional[list[int]] = None
        in_shapes = [spec.shape for spec in self.inputs]
        out_shapes = [spec.shape for spec in self.outputs]
        if self.symbols:
            sizes = self._bind_sizes(arrays)
            in_shapes = [tuple(_eval_size(e, sizes) for e in exprs) for exprs in self._in_exprs]
            out_shapes = [tuple(_eval_size(e, sizes) for e in exprs) for exprs in self._out_exprs]
        for spec, a, shape in zip(self.inputs, arrays, in_shapes):
            want = dt.to_numpy(spec.dtype)
            if not isinstance(a, np.ndarray):
                a = np.asarray(a, dtype=want)
            if a.dtype != want:
                raise TypeError(f"input {spec.name!r}: dtype {a.dtype}, expected {want}")
            if a.shape != shape:
                raise ValueError(f"input {spec.name!r}: shape {a.shape}, expected {self._shape_text(spec, shape)}")
            if spec.strides:
                elem = tuple(s // a.itemsize for s in a.strides)
                if elem != spec.strides or any(s % a.itemsize for s in a.strides):
                    raise ValueError(f"input {spec.name!r}: strides {elem} (elements), the graph declared {spec.strides}")
            elif not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            keep.append(a)
            ptrs.append(a.ctypes.data)
        results: list[np.ndarray] = []
        for i, (spec, shape) in enumerate(zip(self.outputs, out_shapes)):
            want = dt.to_numpy(spec.dtype)
            if out is not None:
                o = out[i]
                if o.dtype != want or o.shape != shape or not o.flags.c_contiguous or not o.flags.writeable:
                    raise ValueError(f"out[{i}] must be a writeable C-contiguous {want} array of shape {shape}")
            else:
                o = np.empty(shape, dtype=want)
            results.append(o)
            ptrs.append(o.ctypes.data)
        ws = None
        ws_ptr = None
        ws_bytes = kernel.workspace_bytes(sizes) if sizes is not None else int(self.plan.workspace_bytes)
        if ws_bytes > 0:
            ws = aligned_empty(ws_bytes)
            ws_ptr = ws.ctypes.data
        rc = kernel.run(ptrs, ws_ptr, num_threads if num_threads else default_num_threads(), sizes)
        del keep, ws
        if rc != 0:
            raise KilnError(f"kiln_run of {self.handle[:12]} returned {rc}")
        return results[0] if len(results) == 1 else tuple(results)


    def _bind_sizes(self, arrays: Sequence[Any]) -> list[int]:
        """The symbols' values, each read from the input dimension the plan names."""
        sizes: list[int] = []
        for sym in self.plan.symbols:
            a = arrays[sym.input]
            shape = np.shape(a)
            if sym.axis >= len(shape):
                spec = self.inputs[sym.input]
                raise ValueError(f"input {spec.name!r}: rank {len(shape)}, expected {len(spec.shape)}")
            sizes.append(int(shape[sym.axis]))
        return sizes

    def _shape_text(self, spec: TensorSpec, shape: tuple[int, ...]) -> str:
        """An expected shape with its symbolic dimensions named: "(N=7, 2)"."""
        if not self.symbols:
            return str(shape)
        idx = self.inputs.index(spec)
        dims = []
        for d, e in zip(shape, self._in_exprs[idx]):
            name = _size_name(e, self.symbols)
            dims.append(f"{name}={d}" if name else str(d))
        return "(" + ", ".join(dims) + ")"


def _eval_size(expr: Any, sizes: Sequence[int]) -> int:
    """A kiln.v1.SizeExpr at ``sizes``."""
    total = 0
    for t in expr.terms:
        v = int(t.coeff)
        for k, e in enumerate(t.exponents):
            v *= int(sizes[k]) ** int(e)
        total += v
    return total


def _step_runs(step: Any, sizes: Sequence[int]) -> bool:
    """Whether a launch plan step runs at ``sizes``: a step with a guard (a launch-time choice
    among kernels of a symbolic plan) only where guard_min <= guard <= guard_max (0: unbounded)."""
    if step.guard_min <= 0 and step.guard_max <= 0:
        return True
    v = _eval_size(step.guard, sizes)
    return v >= step.guard_min and (step.guard_max <= 0 or v <= step.guard_max)


def _size_name(expr: Any, names: Sequence[str]) -> str:
    """"N", "2*N*T": the expression's text, or "" when it is a constant."""
    parts = []
    for t in expr.terms:
        factors = [names[k] for k, e in enumerate(t.exponents) for _ in range(int(e))]
        if not factors:
            if len(expr.terms) == 1:
                return ""
            factors = [str(t.coeff)]
        elif t.coeff != 1:
            factors.insert(0, str(t.coeff))
        parts.append("*".join(factors))
    return " + ".join(parts)


def _is_hex64(s: str) -> bool:
    return len(s) == 64 and all(c in "0123456789abcdef" for c in s)


__all__ = ["Client", "Compiled", "TensorSpec", "make_options", "DEFAULT_ADDRESS"]
