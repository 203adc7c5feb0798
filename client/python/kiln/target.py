"""Compile targets: parsing ``"cpu"``, ``"cpu:x86-64-v3"``, ``"cpu:+avx2+fma"``, ``"cuda:sm_90"``.

``"cpu"`` alone means this machine: the best x86-64 ISA level its CPU supports, read from
``/proc/cpuinfo`` (x86-64-v4 with AVX-512 F/BW/DQ/VL, v3 with AVX2/FMA/BMI2, v2 otherwise).
``"cuda"`` alone means the first local GPU's compute capability (through ``nvidia-smi``).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .v1 import service_pb2

ISA_LEVELS: tuple[str, ...] = ("x86-64-v2", "x86-64-v3", "x86-64-v4")

_V3_FLAGS = frozenset({"avx2", "fma", "bmi2"})
_V4_FLAGS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})


def isa_level_from_flags(flags: set[str] | frozenset[str]) -> str:
    """The best ISA level a CPU with these /proc/cpuinfo flags runs."""
    if _V3_FLAGS <= flags:
        return "x86-64-v4" if _V4_FLAGS <= flags else "x86-64-v3"
    return "x86-64-v2"


@functools.lru_cache(maxsize=1)
def host_isa(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """The best ISA level of this machine; x86-64-v2 when /proc/cpuinfo cannot be read."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return isa_level_from_flags(set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return "x86-64-v2"


@functools.lru_cache(maxsize=1)
def host_cuda_sm() -> Optional[int]:
    """The compute capability of the first local GPU as an int (90 for 9.0), or None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.match(r"\s*(\d+)\.(\d+)", out)
    return int(m.group(1)) * 10 + int(m.group(2)) if m else None


@dataclass(frozen=True)
class Target:
    """What a graph is compiled for: a CPU ISA level or feature list, or a CUDA sm."""

    kind: str  # "cpu" or "cuda"
    isa: str = ""
    features: tuple[str, ...] = field(default=())
    sm: int = 0

    @staticmethod
    def cpu(isa: Optional[str] = None, features: Optional[list[str]] = None) -> "Target":
        """A CPU target; no arguments means this machine's best ISA level."""
        if features:
            return Target("cpu", "", tuple(sorted(features)))
        return Target("cpu", isa or host_isa())

    @staticmethod
    def cuda(sm: Optional[int] = None) -> "Target":
        """A CUDA target; no argument means the local GPU's compute capability."""
        if sm is None:
            sm = host_cuda_sm()
            if sm is None:
                raise ValueError("target 'cuda' needs an sm (e.g. 'cuda:sm_90'): no local GPU found")
        return Target("cuda", sm=int(sm))

    @staticmethod
    def parse(spec: Union[str, "Target", Any]) -> "Target":
        """Parses a target string; also accepts a Target or a kiln.v1.Target message.

        Forms: ``cpu``, ``cpu:x86-64-v3``, ``cpu:+avx2+fma`` (a feature list), ``cuda``,
        ``cuda:sm_90`` (or ``cuda:90``). Raises ValueError for anything else.
        """
        if isinstance(spec, Target):
            return spec
        if not isinstance(spec, str):
            return Target.from_proto(spec)
        s = spec.strip()
        kind, _, rest = s.partition(":")
        if kind == "cpu":
            if not rest:
                return Target.cpu()
            if rest.startswith("+"):
                feats = [f for f in rest.split("+") if f]
                if not feats:
                    raise ValueError(f"bad target {spec!r}: empty feature list")
                return Target.cpu(features=feats)
            if rest not in ISA_LEVELS:
                raise ValueError(f"bad target {spec!r}: the CPU ISA is one of {', '.join(ISA_LEVELS)}")
            return Target.cpu(rest)
        if kind == "cuda":
            if not rest:
                return Target.cuda()
            m = re.fullmatch(r"(?:sm_?)?(\d+)", rest)
            if not m:
                raise ValueError(f"bad target {spec!r}: expected cuda:sm_XX")
            return Target.cuda(int(m.group(1)))
        raise ValueError(f"bad target {spec!r}: expected cpu[:ISA|:+feat+...] or cuda[:sm_XX]")

    @staticmethod
    def from_proto(msg: Any) -> "Target":
        """From a kiln.v1.Target message."""
        which = msg.WhichOneof("kind")
        if which == "cpu":
            if msg.cpu.features:
                return Target("cpu", "", tuple(sorted(msg.cpu.features)))
            return Target("cpu", msg.cpu.isa)
        if which == "cuda":
            return Target("cuda", sm=msg.cuda.sm)
        raise ValueError("a kiln.v1.Target with neither cpu nor cuda set")

    def to_proto(self) -> Any:
        """A kiln.v1.Target message."""
        t = service_pb2.Target()
        if self.kind == "cpu":
            t.cpu.isa = self.isa
            t.cpu.features.extend(self.features)
        else:
            t.cuda.sm = self.sm
        return t

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def __str__(self) -> str:
        if self.kind == "cuda":
            return f"cuda:sm_{self.sm}"
        if self.features:
            return "cpu:+" + "+".join(self.features)
        return f"cpu:{self.isa}"


def host_runs(target: Target) -> bool:
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
