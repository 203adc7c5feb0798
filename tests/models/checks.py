"""The sweep's modes: one model, one way of running it under ``torch.compile(backend="kiln")``,
checked against float64 eager. Runs in the sweep's worker process (tests/models/sweep.py).

Modes:

- ``infer``: float32 inference. Every floating-point output against float64 eager of the same
  weights; kiln's error must be at most ``K_F32`` times float32 eager's, or ``FLOOR_F32``.
  Eager's error here is float32 eager's distance from float64, or float64's own distance from
  itself when every weight and input moves by one float32 rounding, whichever is larger: where
  a model is that sensitive to rounding (a ReLU's kink within rounding of zero, a batch norm
  over nearly equal values), any float32 computation may land that far.
- ``train``: a training step (dropout off): the outputs, every parameter's gradient of a randomly
  weighted sum of all outputs, and the buffers it updates (batch norms' running statistics),
  against float64 eager's. Gradients are compared as one vector (the norm of the difference over
  the norm of float64's) with ``K_GRAD`` / ``FLOOR_GRAD``: an element on a ReLU's kink passes or
  stops its gradient on the last bits of the forward, and behind a narrow batch norm that one
  element moves every gradient before it, in any two float32 computations. Each parameter alone
  must stay within ``K_GRAD`` times eager's error or ``FLOOR_PARAM`` (a gradient wrong as a whole,
  however small its parameter; a norm below ``PARAM_SCALE`` of all gradients' counts as that,
  float64's zero gradients being rounding noise in float32). A parameter eager gives a gradient
  and kiln not is a mismatch. For a model with 2-D convolutions, which kiln's layout pass runs
  channels-last through torch's own convolutions, float32 eager in channels-last is a second
  eager reference (cuDNN's algorithms for that layout land further from float64 on some models).
  Gradients off (outputs and buffers right) are checked again on fresh inputs, and a mismatch
  only when they are off there too: a kink seldom falls within rounding twice.
- ``bf16``: bfloat16 inference against float64, ``K_BF16`` times bfloat16 eager's error or
  ``FLOOR_BF16``.
- ``dynamic`` (text models): the compiled model at the spec's two sequence lengths (torch's
  automatic dynamic shapes: the second compiles a symbolic graph), each checked as ``infer``;
  the kiln graphs the second length added are recorded.
- ``train-drop`` (models with ``Spec.drop``): a training step with dropout and drop-path on. The
  random draws differ from eager's, so only finite outputs and gradients are checked.
- ``reduce-overhead`` (CUDA only): ``infer`` through CUDA graphs, three calls, the last checked.

An error is a tensor's largest absolute difference over its largest absolute value (the
worst over the outputs). Every mode records kiln's fallbacks (each ``KilnFallbackWarning``, one
line), kiln.torch's other warnings (a layout pass skipped, a CUDA graph capture given up), the
nodes kiln left to torch by reason (``no lowering for aten.convolution``...), kiln's counters
and Dynamo's graph breaks. An exception is a ``crash`` unless eager raises too, or
``torch.compile`` fails the same way with ``backend="aot_eager"``: then the mode is ``skipped``
with the reason (not kiln's doing).
"""

from __future__ import annotations

import copy
import gc
import itertools
import logging
import math
import re
import statistics
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import kiln.torch as kt
import torch
import zoo
from zoo import Spec, inputs, tensors

K_F32, FLOOR_F32 = 8.0, 1e-5
K_GRAD, FLOOR_GRAD, FLOOR_PARAM, PARAM_SCALE = 8.0, 5e-5, 5e-2, 1e-5
K_BF16, FLOOR_BF16 = 4.0, 2e-2

MODES = ("infer", "train", "bf16", "dynamic", "train-drop", "reduce-overhead")


def modes_for(spec: Spec, device: str) -> list[str]:
    """The modes that apply to ``spec`` on ``device``."""
    out = ["infer", "train", "bf16"]
    if spec.is_text:
        out.append("dynamic")
    if spec.drop is not None:
        out.append("train-drop")
    if device == "cuda":
        out.append("reduce-overhead")
    return out


@dataclass
class Outcome:
    """One (model, mode) row of the sweep."""

    model: str
    mode: str
    status: str = "ok"  # ok, crash, mismatch, skipped, timeout
    reason: str = ""
    note: str = ""  # what else the table should say (a dynamic mode's recompiles...)
    error: Optional[float] = None  # kiln's error (train: the gradients')
    eager_error: Optional[float] = None  # float32 (bf16: bfloat16) eager's
    bound: Optional[float] = None
    details: dict[str, Any] = field(default_factory=dict)
    parts: int = 0
    compiled: int = 0
    failed: int = 0
    graphs: int = 0
    kiln_nodes: int = 0
    torch_nodes: int = 0
    fallbacks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # kiln.torch's: a pass skipped, a capture given up
    torch_ops: dict[str, int] = field(default_factory=dict)
    graph_breaks: int = 0
    seconds: float = 0.0
    timing: dict[str, Any] = field(default_factory=dict)
    reason_hint: str = field(default="", repr=False)  # a mode's problems while it runs

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("reason_hint")
        return d


class Skip(Exception):
    """The mode cannot be checked here, for a reason that is not kiln's."""


class Mismatch(Exception):
    """A result outside its tolerance."""


# ------------------------------------------------------------------------------- errors

def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest absolute difference over the largest absolute value of ``want`` (1 when that
    is zero); inf for a shape mismatch or a non-finite value where ``want`` is finite."""
    if got.shape != want.shape:
        return math.inf
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    if g.numel() == 0:
        return 0.0
    finite = torch.isfinite(w)
    if not bool(torch.isfinite(g[finite]).all()) or bool((torch.isfinite(g) & ~finite).any()):
        return math.inf
    diff = (g[finite] - w[finite]).abs().max().item() if bool(finite.any()) else 0.0
    scale = w[finite].abs().max().item() if bool(finite.any()) else 0.0
    return diff / (scale if scale > 0 else 1.0)


def worst_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    if len(got) != len(want):
        raise Mismatch(f"{len(got)} floating-point outputs, eager has {len(want)}")
    return max((rel_error(g, w) for g, w in zip(got, want)), default=0.0)


def within(kiln_err: float, eager_err: float, k: float, floor: float) -> tuple[bool, float]:
    """Whether kiln's error passes: at most ``k`` times eager's, or ``floor``; and the bound."""
    bound = max(k * eager_err, floor)
    return kiln_err <= bound, bound


def grad_error(grads: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> float:
    """The norm of all gradients' difference from float64's over the norm of float64's."""
    num = sum(float(((grads[k].double().cpu() - v.cpu()) ** 2).sum()) for k, v in exact.items() if k in grads)
    den = sum(float((v.cpu() ** 2).sum()) for v in exact.values())
    return math.sqrt(num / den) if den else math.sqrt(num)


def param_error(got: torch.Tensor, exact: torch.Tensor, floor: float = 0.0) -> float:
    """One parameter's gradient error: the norm of the difference over the norm of float64's,
    or ``floor`` where that is smaller (a gradient float64 makes zero, such as the bias of a
    layer a batch norm follows, is rounding noise in float32)."""
    den = max(float(exact.double().norm()), floor)
    num = float((got.double().cpu() - exact.double().cpu()).norm())
    return num / den if den else num


# ---------------------------------------------------------------------------- recording

_STAY = "kiln.torch: %d node(s) stay in torch: %s"


class _TorchOps(logging.Handler):
    """Collects partition.py's reasons for nodes left in torch, and kiln.torch's warnings."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, int] = {}
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == _STAY and len(args) == 2:
            count, why = args
            self.reasons[str(why)] = self.reasons.get(str(why), 0) + int(str(count))
        elif record.levelno >= logging.WARNING:
            line = one_line(record.getMessage().removeprefix("kiln.torch: "))
            if line not in self.warnings:
                self.warnings.append(line)


def one_line(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def fallback_reason(message: str) -> str:
    """A KilnFallbackWarning's message as one line: which part (its first ops) and why."""
    m = re.match(r"kiln: part \S+ \((.*?)\) failed to (\w+); running it in torch: (.*)", message, re.S)
    if m:
        ops = [op for op in m.group(1).split(", ") if "getitem" not in op]
        return one_line(f"part ({', '.join(ops[:3])}{', ...' if len(ops) > 3 else ''}) failed to {m.group(2)}: "
                        f"{m.group(3)}")
    return one_line(message.removeprefix("kiln: "))


class Recorder:
    """Around one mode: kiln's counters, fallback warnings, left-in-torch reasons, graph breaks."""

    def __enter__(self) -> "Recorder":
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        kt.reset_stats()
        self._warnings = warnings.catch_warnings(record=True)
        self.caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        self._ops = _TorchOps()
        self._log = logging.getLogger("kiln.torch")
        self._level = self._log.level
        self._log.setLevel(logging.DEBUG)
        self._log.addHandler(self._ops)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._log.removeHandler(self._ops)
        self._log.setLevel(self._level)
        self._warnings.__exit__(*exc)

    def fill(self, out: Outcome) -> None:
        s = kt.stats()
        out.parts, out.compiled, out.failed, out.graphs = s["parts"], s["compiled"], s["failed"], s["graphs"]
        out.kiln_nodes, out.torch_nodes = s["kiln_nodes"], s["torch_nodes"]
        seen: set[str] = set()
        for w in self.caught:
            if issubclass(w.category, kt.KilnFallbackWarning):
                reason = fallback_reason(str(w.message))
                if reason not in seen:
                    seen.add(reason)
                    out.fallbacks.append(reason)
            elif str(w.message).startswith("kiln: "):  # a CUDA graph capture given up...
                line = one_line(str(w.message).removeprefix("kiln: "))
                if line not in out.warnings:
                    out.warnings.append(line)
        out.warnings += [w for w in self._ops.warnings if w not in out.warnings]
        out.torch_ops = dict(sorted(self._ops.reasons.items(), key=lambda kv: -kv[1]))
        out.graph_breaks = int(sum(torch._dynamo.utils.counters["graph_break"].values()))


# -------------------------------------------------------------------------------- running

@dataclass
class Context:
    """What every mode needs: the device, kiln's client, and the sweep's options."""

    device: str
    client: Any
    timing: bool = False
    rounds: int = 7


def _to(args: list[Any], kwargs: dict[str, Any], device: str, dtype: Optional[torch.dtype] = None
        ) -> tuple[list[Any], dict[str, Any]]:
    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            return t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)
        return t

    return [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}


def compile_kiln(model: torch.nn.Module, ctx: Context, mode: Optional[str] = None) -> Callable[..., Any]:
    if mode is not None:  # torch.compile takes a mode or options, not both
        return torch.compile(model, backend=kt.backend(mode=mode, client=ctx.client))
    return torch.compile(model, backend="kiln", options={"client": ctx.client})


def build(spec: Spec, drop: bool = False) -> torch.nn.Module:
    """The spec's model (zoo.build); a Skip when this library version cannot build it (a family
    newer than the installed timm or transformers)."""
    try:
        return zoo.build(spec, drop=drop)
    except Exception as e:
        raise Skip(f"cannot build the model here: {type(e).__name__}: {one_line(str(e), 160)}") from e


def _eager(what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, a Skip naming ``what`` if it raises (eager itself cannot run the mode)."""
    try:
        return fn()
    except Exception as e:
        raise Skip(f"{what} raises: {type(e).__name__}: {one_line(str(e), 160)}") from e


def _reference(model: torch.nn.Module, args: list[Any], kwargs: dict[str, Any], ctx: Context
               ) -> tuple[torch.nn.Module, list[Any], dict[str, Any]]:
    """The float64 copy of ``model`` and the inputs for it."""
    m64 = copy.deepcopy(model).double()
    a64, k64 = _to(args, kwargs, ctx.device, torch.float64)
    return m64, a64, k64


ROUNDING = 2.0 ** -24  # float32's unit roundoff


@torch.no_grad()
def _perturbed(m64: torch.nn.Module, args: list[Any], kwargs: dict[str, Any]
               ) -> tuple[torch.nn.Module, list[Any], dict[str, Any]]:
    """A copy of the float64 model and inputs with every floating-point parameter and input
    element moved by about one float32 rounding (relative noise of ``ROUNDING``): what float64
    makes of that is how far any float32 computation may land, where the model is that sensitive
    (a ReLU's kink within rounding of zero, a batch norm over nearly equal values)."""
    gen = torch.Generator().manual_seed(5)

    def nudge(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.device, t.dtype)
            return t * (1 + ROUNDING * noise)
        return t

    mp = copy.deepcopy(m64)
    for p in mp.parameters():
        p.copy_(nudge(p))
    return mp, [nudge(a) for a in args], {k: nudge(v) for k, v in kwargs.items()}


def _outputs(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return tensors(fn(*args, **kwargs))


def _check_forward(model: torch.nn.Module, fn: Callable[..., Any], spec: Spec, ctx: Context, out: Outcome,
                   length: Optional[int] = None, calls: int = 1) -> float:
    """Runs ``fn`` (compiled ``model``) on the spec's inputs against float64 and float32 eager;
    sets ``out``'s errors (keeping the worst over calls of this function); returns kiln's."""
    args, kwargs = _to(*inputs(spec, length), ctx.device)
    with torch.no_grad():
        want32 = _eager("float32 eager", lambda: _outputs(model, args, kwargs))
        try:
            m64, a64, k64 = _reference(model, args, kwargs, ctx)
            exact = _outputs(m64, a64, k64)
            wobble = _outputs(*_perturbed(m64, a64, k64))
            del m64
        except Exception as e:  # a model that cannot run in float64: float32 eager is the reference
            out.details["reference"] = f"float32 eager (float64 raises {type(e).__name__}: {one_line(str(e), 120)})"
            out.note = "checked against float32 eager: the model cannot run in float64"
            exact = wobble = want32
        for _ in range(calls):
            got = _outputs(fn, args, kwargs)
    sensitivity = worst_error(wobble, exact)
    out.details["rounding_sensitivity"] = max(out.details.get("rounding_sensitivity", 0.0), sensitivity)
    eager_err = max(worst_error(want32, exact), sensitivity) if exact is not want32 else 0.0
    kiln_err = worst_error(got, exact)
    if not got:
        raise Skip("the model has no floating-point output")
    _, bound = within(kiln_err, eager_err, K_F32, FLOOR_F32)
    out.error = max(out.error or 0.0, kiln_err)
    out.eager_error = max(out.eager_error or 0.0, eager_err)
    out.bound = max(out.bound or 0.0, bound)
    if kiln_err > bound:
        at = f" at length {length}" if length else ""
        raise Mismatch(f"output error {kiln_err:.2e}{at} above {bound:.2e} (eager float32's {eager_err:.2e})")
    return kiln_err


def mode_infer(spec: Spec, ctx: Context, out: Outcome) -> None:
    model = build(spec).to(ctx.device)
    compiled = compile_kiln(model, ctx)
    _check_forward(model, compiled, spec, ctx, out)
    if ctx.timing:
        out.timing = time_inference(model, compiled, spec, ctx)


def mode_reduce_overhead(spec: Spec, ctx: Context, out: Outcome) -> None:
    if ctx.device != "cuda":
        raise Skip("CUDA graphs: CUDA only")
    model = build(spec).to(ctx.device)
    _check_forward(model, compile_kiln(model, ctx, "reduce-overhead"), spec, ctx, out, calls=3)


def mode_dynamic(spec: Spec, ctx: Context, out: Outcome) -> None:
    if not spec.is_text:
        raise Skip("not a text model")
    model = build(spec).to(ctx.device)
    compiled = compile_kiln(model, ctx)
    first, second = spec.lengths
    graphs: list[tuple[int, int, int]] = []
    for length in (first, second):
        try:
            _check_forward(model, compiled, spec, ctx, out, length=length)
        except (Mismatch, Skip):
            raise
        except Exception as e:
            raise RuntimeError(f"at length {length}: {type(e).__name__}: {e}") from e
        s = kt.stats()
        graphs.append((s["graphs"], s["failed"], int(torch._dynamo.utils.counters["stats"]["unique_graphs"])))
    (kiln0, failed0, dynamo0), (kiln1, failed1, dynamo1) = graphs
    out.details.update(kiln_graphs_at_first_length=kiln0, kiln_graphs_added_by_second_length=kiln1 - kiln0,
                       dynamo_graphs_added_by_second_length=dynamo1 - dynamo0,
                       fallbacks_at_second_length=failed1 - failed0)
    out.note = (f"length {second}: {dynamo1 - dynamo0} Dynamo recompile(s), {kiln1 - kiln0} kiln graph(s)"
                + (f", {failed1 - failed0} fallback(s)" if failed1 > failed0 else ""))


def _loss_weights(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]


def _step(model: torch.nn.Module, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any],
          weights: Optional[list[torch.Tensor]] = None
          ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor], list[torch.Tensor]]:
    """A training step's outputs, gradients (then cleared) and floating-point buffers after it."""
    outs = _outputs(fn, args, kwargs)
    if weights is None:
        weights = _loss_weights(outs)
    loss = sum(((o * w.to(o.device, o.dtype)).sum() for o, w in zip(outs, weights)),
               torch.zeros((), device=outs[0].device))
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    buffers = {k: b.detach().clone() for k, b in model.named_buffers() if b.is_floating_point()}
    return [o.detach() for o in outs], grads, buffers, weights


def mode_train(spec: Spec, ctx: Context, out: Outcome) -> None:
    model = build(spec).to(ctx.device).train()
    compiled = compile_kiln(model, ctx)
    gradients_only = _train_step_problems(model, compiled, spec, ctx, out, seed=1)
    if gradients_only is None:
        return
    if gradients_only:
        # A ReLU's kink: one element within rounding of zero passes or stops its gradient on the
        # last bits of the forward (tv/resnet18: 1.3e-8 in float64, its batch norm's bias then
        # 3e-2 off). A wrong gradient shows on any inputs, a kink rarely twice: fresh inputs.
        first = out.reason_hint
        if _train_step_problems(model, compiled, spec, ctx, out, seed=11) is None:
            out.details["first_inputs"] = f"{first}; fresh inputs passed (a kink, not a wrong gradient)"
            out.note = "gradients off on the first inputs only (a ReLU kink): fresh inputs passed"
            return
        out.reason_hint = f"{first}; again on fresh inputs: {out.reason_hint}"
    raise Mismatch(out.reason_hint)


def _channels_last_grads(model: torch.nn.Module, args: list[Any], kwargs: dict[str, Any],
                         weights: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """A model with 2-D convolutions runs them channels-last under kiln (its layout pass), and the
    convolutions are torch's: float32 eager in that layout is a reference as fair as the
    contiguous one. cuDNN picks other algorithms for it, and their gradients can be further from
    float64 (timm's res2net50_14w_8s on an H200: layer1.0.bn1.bias 1.7e-1 channels-last against
    4.8e-4 contiguous, torch alone). Empty when the model has no 2-D convolution."""
    if not any(isinstance(m, torch.nn.Conv2d) for m in model.modules()):
        return {}
    cl = copy.deepcopy(model)
    with torch.no_grad():  # the 4-D tensors only: Module.to(memory_format=...) refuses a Conv3d's 5-D weight
        for t in itertools.chain(cl.parameters(), cl.buffers()):
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=torch.channels_last)
    cl_args = [a.to(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4 else a
               for a in args]
    try:
        return _step(cl, cl, cl_args, kwargs, weights)[1]
    except Exception:  # a model that cannot run channels-last in eager: no second reference
        return {}


def _train_step_problems(model: torch.nn.Module, compiled: Callable[..., Any], spec: Spec, ctx: Context,
                         out: Outcome, seed: int) -> Optional[bool]:
    """One training step of ``compiled`` against float32 and float64 eager on inputs of ``seed``;
    None when it passes, else whether only gradients are off (the problems in
    ``out.reason_hint``). Every step starts from the same weights and buffers."""
    state = copy.deepcopy(model.state_dict())
    args, kwargs = _to(*inputs(spec, seed=seed, batch=spec.train_batch), ctx.device)
    kiln_out, kiln_grads, kiln_bufs, weights = _step(model, compiled, args, kwargs)
    model.load_state_dict(state)
    eager_out, eager_grads, eager_bufs, _ = _eager("float32 eager training",
                                                   lambda: _step(model, model, args, kwargs, weights))
    model.load_state_dict(state)
    layout_grads = _channels_last_grads(model, args, kwargs, weights)
    model.load_state_dict(state)
    try:
        m64, a64, k64 = _reference(model, args, kwargs, ctx)
        mp, a_p, k_p = _perturbed(m64, a64, k64)
        exact_out, exact_grads, exact_bufs, _ = _step(m64, m64, a64, k64, weights)
        wobble_out, wobble_grads, wobble_bufs, _ = _step(mp, mp, a_p, k_p, weights)
        del m64, mp
    except Exception as e:
        out.details["reference"] = f"float32 eager (float64 raises {type(e).__name__}: {one_line(str(e), 120)})"
        out.note = "checked against float32 eager: the model cannot run in float64"
        exact_out, exact_grads, exact_bufs = eager_out, eager_grads, eager_bufs
        wobble_out, wobble_grads, wobble_bufs = eager_out, eager_grads, eager_bufs
    model.load_state_dict(state)
    # How far float32 may land: eager's distance from float64, or float64's own under one
    # rounding's perturbation (_perturbed), whichever is larger.
    scale = math.sqrt(sum(float((v.double() ** 2).sum()) for v in exact_grads.values()))
    floor = PARAM_SCALE * scale
    problems, gradients = [], []
    missing = sorted(set(eager_grads) - set(kiln_grads))
    if missing:
        problems.append(f"no gradient for {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    k_out = worst_error(kiln_out, exact_out)
    e_out = max(worst_error(eager_out, exact_out), worst_error(wobble_out, exact_out))
    ok, bound = within(k_out, e_out, K_F32, FLOOR_F32)
    out.details["output_error"] = [k_out, e_out]
    if not ok:
        problems.append(f"output error {k_out:.2e} above {bound:.2e}")
    k_grad = grad_error(kiln_grads, exact_grads)
    e_grad = max(grad_error(eager_grads, exact_grads), grad_error(wobble_grads, exact_grads),
                 grad_error(layout_grads, exact_grads) if layout_grads else 0.0)
    ok, bound = within(k_grad, e_grad, K_GRAD, FLOOR_GRAD)
    out.error, out.eager_error, out.bound = k_grad, e_grad, bound
    if not ok:
        gradients.append(f"gradient error {k_grad:.2e} above {bound:.2e} (eager float32's {e_grad:.2e})")
    worst: tuple[float, str, float, float] = (0.0, "", 0.0, 0.0)
    for k, exact in exact_grads.items():
        if k not in kiln_grads or k not in eager_grads:
            continue
        kp = param_error(kiln_grads[k], exact, floor)
        ep = max(param_error(eager_grads[k], exact, floor), param_error(wobble_grads.get(k, exact), exact, floor),
                 param_error(layout_grads.get(k, exact), exact, floor))
        ratio = kp / max(K_GRAD * ep, FLOOR_PARAM)
        if ratio > worst[0]:
            worst = (ratio, k, kp, ep)
    if worst[1]:
        out.details["worst_parameter"] = {"name": worst[1], "kiln": worst[2], "eager": worst[3]}
    if worst[0] > 1:
        gradients.append(f"gradient of {worst[1]}: error {worst[2]:.2e} (eager's {worst[3]:.2e})")
    shared = [k for k in exact_bufs if k in kiln_bufs and k in eager_bufs and k in wobble_bufs]
    k_buf = max((rel_error(kiln_bufs[k], exact_bufs[k]) for k in shared), default=0.0)
    e_buf = max((max(rel_error(eager_bufs[k], exact_bufs[k]), rel_error(wobble_bufs[k], exact_bufs[k]))
                 for k in shared), default=0.0)
    ok, bound = within(k_buf, e_buf, K_F32, FLOOR_F32)
    out.details["buffer_error"] = [k_buf, e_buf]
    if not ok:
        problems.append(f"buffers after the step: error {k_buf:.2e} above {bound:.2e}")
    if not problems and not gradients:
        return None
    out.reason_hint = "; ".join(problems + gradients)
    return not problems


def mode_bf16(spec: Spec, ctx: Context, out: Outcome) -> None:
    model = build(spec).to(ctx.device)
    args, kwargs = _to(*inputs(spec), ctx.device)
    with torch.no_grad():
        exact = _eager("float64 eager", lambda: _outputs(*_reference(model, args, kwargs, ctx)))
        mb = build(spec).to(ctx.device, torch.bfloat16)
        ab, kb = _to(args, kwargs, ctx.device, torch.bfloat16)
        want = _eager("bfloat16 eager", lambda: _outputs(mb, ab, kb))
        got = _outputs(compile_kiln(mb, ctx), ab, kb)
    kiln_err, eager_err = worst_error(got, exact), worst_error(want, exact)
    ok, bound = within(kiln_err, eager_err, K_BF16, FLOOR_BF16)
    out.error, out.eager_error, out.bound = kiln_err, eager_err, bound
    if not ok:
        raise Mismatch(f"bfloat16 error {kiln_err:.2e} above {bound:.2e} (eager bfloat16's {eager_err:.2e})")


def mode_train_drop(spec: Spec, ctx: Context, out: Outcome) -> None:
    if spec.drop is None:
        raise Skip("the model has no dropout variant")
    model = build(spec, drop=True).to(ctx.device).train()
    args, kwargs = _to(*inputs(spec, batch=spec.train_batch), ctx.device)
    outs, grads, _, _ = _step(model, compile_kiln(model, ctx), args, kwargs)
    bad = [k for k, g in grads.items() if not bool(torch.isfinite(g).all())]
    if not grads or bad or not all(bool(torch.isfinite(o).all()) for o in outs):
        raise Mismatch(f"non-finite outputs or gradients ({', '.join(bad[:4])})" if grads else "no gradients")


RUNNERS: dict[str, Callable[[Spec, Context, Outcome], None]] = {
    "infer": mode_infer, "train": mode_train, "bf16": mode_bf16, "dynamic": mode_dynamic,
    "train-drop": mode_train_drop, "reduce-overhead": mode_reduce_overhead,
}


def _fails_without_kiln(spec: Spec, mode: str, ctx: Context) -> Optional[str]:
    """Whether ``torch.compile`` with ``backend="aot_eager"`` (AOTAutograd, no kiln) fails the
    same mode's first call too: the reason, else None."""
    torch._dynamo.reset()
    try:
        drop = mode == "train-drop"
        model = build(spec, drop=drop).to(ctx.device, torch.bfloat16 if mode == "bf16" else None)
        args, kwargs = _to(*inputs(spec), ctx.device, torch.bfloat16 if mode == "bf16" else None)
        fn = torch.compile(model, backend="aot_eager")
        if mode in ("train", "train-drop"):
            model.train()
            _step(model, fn, args, kwargs)
        else:
            with torch.no_grad():
                _outputs(fn, args, kwargs)
        if mode == "dynamic":
            with torch.no_grad():
                _outputs(fn, *_to(*inputs(spec, spec.lengths[1]), ctx.device))
        return None
    except Exception as e:
        return f"{type(e).__name__}: {one_line(str(e), 200)}"
    finally:
        torch._dynamo.reset()


def run_mode(spec: Spec, mode: str, ctx: Context) -> Outcome:
    """One mode of one model; never raises."""
    out = Outcome(spec.name, mode)
    t0 = time.perf_counter()
    try:
        if spec.plant is not None:
            spec.plant(mode)
        with Recorder() as rec:
            try:
                RUNNERS[mode](spec, ctx, out)
            finally:
                rec.fill(out)
    except Skip as e:
        out.status, out.reason = "skipped", one_line(str(e))
    except Mismatch as e:
        out.status, out.reason = "mismatch", one_line(str(e), 400)
    except Exception as e:
        out.details["traceback"] = traceback.format_exc()[-4000:]
        also = _fails_without_kiln(spec, mode, ctx)
        if also is not None:
            out.status, out.reason = "skipped", one_line(f"torch.compile fails without kiln too (aot_eager): {also}")
        else:
            out.status, out.reason = "crash", one_line(f"{type(e).__name__}: {e}", 400)
    finally:
        torch._dynamo.reset()
        gc.collect()
    out.seconds = round(time.perf_counter() - t0, 1)
    return out


# --------------------------------------------------------------------------------- timing

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_inference(model: torch.nn.Module, compiled: Callable[..., Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    """Milliseconds per inference call of eager, Inductor and kiln: interleaved rounds, the
    median of each; Inductor's first call (its compile) apart."""
    args, kwargs = _to(*inputs(spec), ctx.device)
    fns: dict[str, Callable[..., Any]] = {"eager": model, "kiln": compiled}
    out: dict[str, Any] = {}
    with torch.no_grad():
        try:
            t0 = time.perf_counter()
            inductor = torch.compile(model)
            inductor(*args, **kwargs)
            _sync(ctx.device)
            out["inductor_first_s"] = round(time.perf_counter() - t0, 1)
            fns["inductor"] = inductor
        except Exception as e:
            out["inductor_error"] = one_line(f"{type(e).__name__}: {e}", 200)
        kt.wait()
        for f in fns.values():
            for _ in range(3):
                f(*args, **kwargs)
        _sync(ctx.device)
        t0 = time.perf_counter()
        model(*args, **kwargs)
        _sync(ctx.device)
        iters = max(1, min(50, int(0.05 / max(time.perf_counter() - t0, 1e-6))))
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(ctx.rounds):
            for label, f in fns.items():
                _sync(ctx.device)
                t0 = time.perf_counter()
                for _ in range(iters):
                    f(*args, **kwargs)
                _sync(ctx.device)
                times[label].append((time.perf_counter() - t0) * 1e3 / iters)
    for label, ts in times.items():
        out[f"{label}_ms"] = round(statistics.median(ts), 4)
    return out
