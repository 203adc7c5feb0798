"""kiln.torch's process-wide counters (:func:`kiln.torch.stats`) and its record of the most
recently compiled graphs (:func:`kiln.torch.last_graphs`).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, fields
from typing import Any


@dataclass
class Stats:
    """Counters of this process's kiln.torch activity (see :func:`kiln.torch.stats`).

    ``graphs``: ATen graphs the backend received (forward, backward and inference graphs
    count separately). ``parts``: kiln parts cut from them. ``compiled``: parts whose kernels
    were built or found and loaded; ``cache_hits``: of those, the daemon answered from its
    cache; ``memo_hits``: found in this process without asking. ``failed``: parts that fell
    back to torch. ``kiln_nodes``/``torch_nodes``: ATen nodes placed in kiln parts or left to
    torch. ``kernel_calls``/``eager_calls``: part calls that ran the kernels or torch.
    ``compile_s``: wall time spent compiling and loading parts; ``partition_s``: in cutting
    graphs into parts and lowering them; ``backend_s``: in the backend as a whole (AOTAutograd's
    tracing included); ``lookup_s``/``load_s``: the parts' lookups or compiles on the daemon and
    their kernels' loading, summed over the threads that do them; ``prepare_s``: the parts'
    first-call preparation (the native runner's module load included). Together they tell
    where a first call's time goes. ``graph_replays``: calls
    served by replaying a CUDA graph (reduce-overhead mode). ``native_calls``: of the kernel
    calls, those the native part runner served. ``tuned``: parts whose kernel variants were
    timed on their first call (``mode="max-autotune"``, or found tuned in kilnd);
    ``retuned``: of those, parts that now run a variant other than the default.
    ``layout_copies``: channels-last copies the layout pass put before convolutions (image
    inputs and weights; :mod:`.passes.channels_last`). ``random_draws``: ``rand_like`` draws (dropout masks)
    turned into kiln's counter-based numbers (:mod:`.rng`). ``constants``: values that depend
    on no input of their graph, computed once when it was compiled
    (``fold_constant_subgraphs``). ``record_hits``: graphs rebuilt from a program record
    (:mod:`.program`: no partitioning, one lookup for all their parts); ``record_misses``:
    graphs whose record kilnd did not have; ``records_stored``: records this process wrote;
    ``record_s``: time spent asking for and rebuilding records. ``sealed_misses``: graphs
    compiled while sealed (:func:`kiln.torch.seal`). ``precompile_hits``: models (one per
    input signature) that :mod:`.precompile` loaded from kilnd without tracing;
    ``precompile_misses``: those it had to trace and compile; ``precompiles_stored``: those it
    stored; ``precompile_s``: time spent asking for and loading precompiled models.
    ``direct_graphs``: inference graphs Dynamo calls without AOTAutograd's runtime wrapper
    (nothing for it to do: no input mutated, no output aliased; ``direct_inference_call`` in
    :mod:`.dynamo_backend`).
    """

    graphs: int = 0
    parts: int = 0
    compiled: int = 0
    cache_hits: int = 0
    memo_hits: int = 0
    failed: int = 0
    kiln_nodes: int = 0
    torch_nodes: int = 0
    kernel_calls: int = 0
    eager_calls: int = 0
    compile_s: float = 0.0
    partition_s: float = 0.0
    backend_s: float = 0.0
    lookup_s: float = 0.0
    load_s: float = 0.0
    prepare_s: float = 0.0
    graph_replays: int = 0
    native_calls: int = 0
    tuned: int = 0
    retuned: int = 0
    layout_copies: int = 0
    random_draws: int = 0
    constants: int = 0
    record_hits: int = 0
    record_misses: int = 0
    records_stored: int = 0
    record_s: float = 0.0
    sealed_misses: int = 0
    precompile_hits: int = 0
    precompile_misses: int = 0
    precompiles_stored: int = 0
    precompile_s: float = 0.0
    direct_graphs: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


STATS = Stats()


_lock = threading.Lock()


def bump(**deltas: Any) -> None:
    """Adds to the process-wide counters."""
    with _lock:
        for k, v in deltas.items():
            setattr(STATS, k, getattr(STATS, k) + v)


def reset_stats() -> None:
    with _lock:
        for f in fields(STATS):
            setattr(STATS, f.name, f.default)


def snapshot() -> dict[str, Any]:
    """A copy of the counters."""
    with _lock:
        return STATS.as_dict()


#: The parts of the most recently compiled graphs, for diagnostics (:func:`kiln.torch.last_graphs`).
RECENT: collections.deque[dict[str, Any]] = collections.deque(maxlen=32)


__all__ = ["RECENT", "STATS", "Stats", "bump", "reset_stats", "snapshot"]
