"""The wire of the kiln client: a connection to a kilnd daemon and the calls it answers.

:class:`Connection` holds the gRPC channel (plaintext or TLS, a bearer token on every call),
retries calls as :mod:`kiln.retry` says (the policy the C++ client shares), checks every result
against the :class:`kiln.trust.TrustPolicy` as it arrives, and fetches artifacts into the local
content-addressed folder (:mod:`kiln.cache`), verified before anything loads them. It runs no
kernel: :class:`kiln.Client` is the connection whose compiles give results that run here, and
what needs only the daemon's answers (custom builds, raw kernels, tooling) takes a connection.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import grpc

from . import core
from ._once import KeyedLocks
from .cache import ArtifactCache
from .errors import ArtifactError, CompileError, NotFoundError, RpcError, VerificationError
from .recorder import Recorder
from .retry import RetryPolicy, call_with_retries
from .target import Target
from .trust import TrustPolicy
from .v1 import graph_pb2, service_pb2, service_pb2_grpc

DEFAULT_ADDRESS = "localhost:50051"
TargetLike = Union[str, Target, Any]

# Status codes that mean "the request was wrong or the compile failed", not "try again".
_COMPILE_ERROR_CODES = frozenset({"INVALID_ARGUMENT", "INTERNAL", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED"})


def request_key(graph: Any, target: Any, options: Any) -> str:
    """The request key of a (kiln.v1.Graph, Target, CompileOptions) request, as kilnd computes
    it (wire/FORMAT.md, "Request keys"): lowercase hex SHA-256 over a domain string and each
    message's deterministic serialization, length-prefixed, hashed by the native core (the
    code kilnd runs). A :class:`kiln.Client` asks for a cached result by this key before it
    sends a whole graph."""
    return core.request_key(graph.SerializeToString(deterministic=True), target.SerializeToString(deterministic=True),
                            options.SerializeToString(deterministic=True))


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


def as_options(options: Any) -> Any:
    """``options`` as a kiln.v1.CompileOptions: None is the daemon's defaults, a dict the
    keyword arguments of :func:`make_options`."""
    if options is None:
        return service_pb2.CompileOptions()
    if isinstance(options, dict):
        return make_options(**options)
    return options


class Connection:
    """A connection to a kilnd daemon plus the local artifact cache: every call but those that
    give runnable results (:class:`kiln.Client` adds compile, lookup and get).

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
        self._channel, self._transport = _make_channel(self.address, opts, token, tls_ca, tls_cert, tls_key)
        self._stub = service_pb2_grpc.KilnStub(self._channel)
        self.cache = ArtifactCache(cache_dir)
        self.recorder = recorder if recorder is not None else Recorder.from_env()
        self._fetch_locks = KeyedLocks()  # one download per digest at a time
        #: True once :meth:`close` has run.
        self.closed = False

    def close(self) -> None:
        """Closes the channel; the client is unusable afterwards."""
        self.closed = True
        self._channel.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kiln.{type(self).__name__}({self.address!r})"

    # ------------------------------------------------------------------ RPC plumbing

    def _call(self, method: str, request: Any, timeout: Optional[float]) -> Any:
        """A unary call retried under ``self.retry`` within its deadline; errors become
        :class:`RpcError` subclasses."""
        fn = getattr(self._stub, method)
        try:
            return call_with_retries(lambda remaining: fn(request, timeout=remaining),
                                     timeout if timeout is not None else self.timeout, self.retry)
        except grpc.RpcError as e:
            raise translate(method, e, self._transport) from None

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
            raise translate("Health.Check", e, self._transport) from None
        status = resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, str(status))

    # ------------------------------------------------------------------ compile

    def _request(self, graph: Any, target: TargetLike, options: Any, priority: int = 0) -> Any:
        if not isinstance(graph, graph_pb2.Graph):
            raise TypeError(f"expected a kiln.v1.Graph, got {type(graph).__name__} (use GraphBuilder.build)")
        req = service_pb2.CompileRequest()
        req.graph.CopyFrom(graph)
        req.target.CopyFrom(Target.parse(target).to_proto())
        req.options.CopyFrom(as_options(options))
        req.priority = priority
        return req


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
            raise translate("FetchArtifact", e, self._transport) from None

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
                raise translate("Prewarm", err, self._transport) from None
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
                  tls_ca: Any, tls_cert: Any, tls_key: Any) -> tuple[grpc.Channel, str]:
    """A plaintext or TLS channel to ``address``, sending ``token`` (when there is one) with
    every call; and its transport, ``"plaintext"``, ``"tls"`` or ``"mtls"`` (a client
    certificate), for error messages."""
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
        transport = "mtls" if cert else "tls"
    else:
        channel = grpc.insecure_channel(address, options=opts)
        transport = "plaintext"
    token = token if token is not None else env("KILN_TOKEN")
    if token:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel, transport


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


def connect_hint(transport: str, details: str) -> str:
    """The likely cause of a failed connection, from what gRPC said and the client's own
    transport (``"plaintext"``, ``"tls"``, ``"mtls"``); "" when nothing points anywhere. gRPC
    reports a TLS refusal by the server only as a closed socket: the reason is in kilnd's log."""
    if "failed to connect" not in details:
        return ""
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return ("kilnd's certificate does not verify against the CA this client trusts (tls_ca or "
                "KILN_TLS_CA): it was signed by another CA, or does not name this host")
    if "WRONG_VERSION_NUMBER" in details or ("handshake failed" in details.lower() and transport != "plaintext"):
        return "the TLS handshake failed: if kilnd serves plaintext on this port, connect without tls_ca"
    if "Socket closed" in details or "Connection reset" in details:
        return {
            "plaintext": "kilnd closed the connection: if it serves TLS, pass tls_ca (or set KILN_TLS_CA)",
            "tls": ("kilnd closed the connection during the TLS handshake: it may require a client certificate "
                    "(tls_cert and tls_key, or KILN_TLS_CERT and KILN_TLS_KEY)"),
            "mtls": ("kilnd closed the connection during the TLS handshake: it may not trust this client "
                     "certificate (one not signed by its --tls-client-ca)"),
        }.get(transport, "")
    return ""


def translate(method: str, e: grpc.RpcError, transport: str = "") -> RpcError:
    code = e.code().name if hasattr(e, "code") and e.code() is not None else "UNKNOWN"
    details = (e.details() if hasattr(e, "details") else "") or str(e)
    hint = connect_hint(transport, details) if code in ("UNAVAILABLE", "UNKNOWN") and transport else ""
    if hint:
        details = f"{details} ({hint})"
    if code == "NOT_FOUND":
        return NotFoundError(method, code, details)
    if method in ("Compile", "Lookup", "Prewarm") and code in _COMPILE_ERROR_CODES:
        return CompileError(method, code, details)
    return RpcError(method, code, details)



__all__ = ["Connection", "DEFAULT_ADDRESS", "as_options", "make_options", "translate"]
