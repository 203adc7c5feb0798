"""The torch.compile backend (kiln.torch) on CPU tensors against eager PyTorch.

PyTorch is required: without it this module fails (helpers.import_torch). Each test compiles
with ``backend="kiln"`` against the session's daemon and checks outputs (and gradients of a
randomly weighted loss) against eager, and that kiln actually ran kernels: a test must not
pass by falling back to torch everywhere.
"""

from __future__ import annotations

import copy
import importlib
import json
import operator
import threading
import time
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytest

from helpers import import_torch

torch = import_torch()
import torch.nn.functional as F  # noqa: E402

import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402
from kiln.torch import examples as E  # noqa: E402
from kiln import plan as kplan  # noqa: E402
from kiln.torch import native  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _native_runner(client: Any) -> None:
    """The native part runner, built (or found) once: the module's tests then run their parts
    through it after each part's first call, as users see them after a warm-up."""
    native.start(client)
    native.wait(900)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    """Each test compiles from scratch and counts from zero."""
    torch._dynamo.reset()
    kt.reset_stats()
    kt.clear_memo()
    yield
    torch._dynamo.reset()


def compiled(fn: Callable[..., Any], client: Any, **kwargs: Any) -> Callable[..., Any]:
    return torch.compile(fn, backend="kiln", options={"client": client}, **kwargs)


@pytest.fixture
def rewrites(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """Every (rewritten graph module, kiln parts) kiln.torch makes during the test, in order."""
    from kiln.torch import dynamo_backend as DB

    made: list[tuple[Any, Any]] = []
    real = DB.rewrite

    def spy(gm: Any, segments: Any) -> Any:
        out = real(gm, segments)
        made.append(out)
        return out

    monkeypatch.setattr(DB, "rewrite", spy)
    return made


def clone_args(args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


def as_tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def check_fwd_bwd(fn: Callable[..., Any], args: Sequence[torch.Tensor], client: Any, *, rtol: float = 1e-5,
                  atol: float = 1e-5, backward: bool = True) -> None:
    """Compiled vs eager: every output, and with ``backward`` the gradient of every input."""
    a_kiln, a_ref = clone_args(args), clone_args(args)
    got = as_tuple(compiled(fn, client)(*a_kiln))
    want = as_tuple(fn(*a_ref))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    if backward:
        # A randomly weighted sum of the outputs, so that each element's gradient is distinct
        # and errors cannot cancel (as they can in a plain sum).
        gen = torch.Generator().manual_seed(2024)
        weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64).to(w.dtype) for w in want]
        sum((g * wt).sum() for g, wt in zip(got, weights) if g.is_floating_point()).backward()
        sum((w * wt).sum() for w, wt in zip(want, weights) if w.is_floating_point()).backward()
        for i, (ak, ar) in enumerate(zip(a_kiln, a_ref)):
            if ar.grad is None:
                continue
            assert ak.grad is not None, f"input {i} has no gradient"
            torch.testing.assert_close(ak.grad, ar.grad, rtol=rtol, atol=atol, msg=lambda m: f"grad of input {i}: {m}")


def assert_kiln_ran(min_parts: int = 1, graphs: int = 1, parts: Optional[int] = None) -> dict[str, Any]:
    """kiln compiled and ran parts for at least ``graphs`` ATen graphs, none fell back. With
    ``parts``: exactly that many parts were cut, in all (a partitioner that splits what fuses,
    or fuses nothing, fails as surely as one that compiles nothing); else at least ``min_parts``."""
    s = kt.stats()
    assert s["graphs"] >= graphs, s
    if parts is not None:
        assert s["parts"] == parts, (f"{s['parts']} kiln parts, expected {parts}", kt.last_graphs())
        min_parts = parts
    assert s["compiled"] >= min_parts, (s, kt.last_graphs())
    assert s["kernel_calls"] >= min_parts, s
    assert s["failed"] == 0, kt.last_graphs()
    return s


# ---------------------------------------------------------------------------------- registration

def test_backend_is_registered() -> None:
    assert "kiln" in torch._dynamo.list_backends()
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("kiln") is kt.kiln_backend


# ---------------------------------------------------------------------------------- workloads

def test_sin_cos_forward_and_backward(client: Any) -> None:
    before = client.stats()
    (x,) = E.make_sin(10000)
    check_fwd_bwd(E.sin_cos_mix, [x], client)
    s = assert_kiln_ran(parts=2, graphs=2)  # elementwise ops only: one forward and one backward part
    assert s["kiln_nodes"] > 0
    after = client.stats()
    assert after.requests > before.requests  # the daemon saw the parts


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad_on"])
def test_inference_graphs_skip_the_aot_wrapper_only_where_it_has_nothing_to_do(client: Any, grad: bool) -> None:
    """An inference graph that mutates no input and returns no alias is called directly (one
    wrapper layer less per call); one that mutates an input, or returns a view of one, keeps
    AOTAutograd's wrapper, which applies the mutation and rebuilds the view. Either way the
    results, the inputs afterwards and grad mode are eager's."""
    def pure(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * w + torch.cos(x)

    def mutates(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return torch.sin(x) * w

    def view_of_input(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cos(x) + w, x.view(-1)[:5]

    gen = torch.Generator().manual_seed(5)
    x0, w = torch.randn(4, 33, generator=gen), torch.randn(33, generator=gen)
    for fn, direct in ((pure, 1), (mutates, 0), (view_of_input, 0)):
        torch._dynamo.reset()
        kt.reset_stats()
        x_kiln, x_ref = x0.clone(), x0.clone()
        with torch.set_grad_enabled(grad):
            f = compiled(fn, client)
            for _ in range(3):  # compile, then run through the native runner
                got, want = as_tuple(f(x_kiln, w)), as_tuple(fn(x_ref, w))
                assert torch.is_grad_enabled() == grad
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r)
            assert not g.requires_grad
        torch.testing.assert_close(x_kiln, x_ref)  # the mutation applied, as often as in eager
        if fn is view_of_input:
            assert got[1]._base is x_kiln  # still a view of the caller's tensor
        s = assert_kiln_ran()
        assert s["direct_graphs"] == direct, (fn.__name__, s)


def test_a_graph_that_fused_whole_is_run_by_its_part(client: Any, rewrites: Any) -> None:
    """A graph that is one kiln part over its arguments, returning the part's results in order,
    is called through the part itself; a graph that returns them in another order or runs
    torch ops keeps the stitched graph's forward. Results are eager's."""
    from kiln.torch.runtime import graph_call

    def whole(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sin(x) * 2, torch.cos(x) + x

    def reordered(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.sin(x) * 2
        return torch.cos(x) + y, y

    def passthrough(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sin(x) * 2, x

    def with_torch_op(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) @ torch.cos(x).reshape(8, 8)

    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    # Dynamo returns a returned argument itself: the ATen graph of ``passthrough`` is one part.
    for fn, by_part in ((whole, True), (passthrough, True), (reordered, False), (with_torch_op, False)):
        torch._dynamo.reset()
        rewrites.clear()
        f = compiled(fn, client)
        with torch.no_grad():
            for _ in range(2):
                got, want = as_tuple(f(x)), as_tuple(fn(x))
                assert len(got) == len(want), fn.__name__
                for g, w in zip(got, want):
                    torch.testing.assert_close(g, w)
        (outer, parts), = rewrites
        assert (graph_call(outer) == parts[0].forward) == by_part, (fn.__name__, outer.code)


def test_sin_cos_float64(client: Any) -> None:
    (x,) = E.make_sin(777, dtype=torch.float64)
    check_fwd_bwd(E.sin_cos_mix, [x], client, rtol=1e-12, atol=1e-12)
    assert_kiln_ran(parts=2)  # one part per graph, as in float32


def test_lltm_forward_and_backward(client: Any) -> None:
    check_fwd_bwd(E.lltm_cell, E.make_lltm(batch=8, features=16, state=32), client)
    s = assert_kiln_ran(parts=3, graphs=2)  # forward: one part before the matmul, one after it; backward: one
    # linear stays in torch, the gates' arithmetic goes to kiln.
    assert s["torch_nodes"] > 0
    ops = {op for g in kt.last_graphs() for p in g["parts"] for op in p["ops"]}
    assert any("sigmoid" in op for op in ops) and any("elu" in op for op in ops), ops


def test_encoder_block_forward_and_backward(client: Any) -> None:
    check_fwd_bwd(E.encoder_block, E.make_encoder(batch=2, seq=8, dim=32), client, rtol=1e-4, atol=1e-4)
    assert_kiln_ran(parts=11, graphs=2)  # the parts between the matmuls: 5 forward, 6 backward
    ops = {op for g in kt.last_graphs() for p in g["parts"] for op in p["ops"] if p["kiln"]}
    assert any("softmax" in op for op in ops) and any("layer_norm" in op for op in ops), ops


def test_encoder_block_inference(client: Any) -> None:
    args = [a.detach() for a in E.make_encoder(batch=2, seq=8, dim=32, seed=3)]
    with torch.no_grad():
        got = compiled(E.encoder_block, client)(*args)
        want = E.encoder_block(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert kt.last_graphs()[-1]["kind"] == "inference"
    assert_kiln_ran(parts=5)  # the parts between the matmuls


def test_kmeans_step(client: Any) -> None:
    X, means = E.make_kmeans(points=5000, k=7)
    labels = compiled(E.kmeans_step, client)(X, means)
    want = E.kmeans_step(X, means)
    assert labels.dtype == torch.int64 and labels.shape == want.shape
    assert E.kmeans_labels_agree(labels, X, means, want)
    assert_kiln_ran(parts=1)  # no op torch keeps: one part


def test_conv_net_inference(client: Any) -> None:
    """convolution and pooling stay in torch; batch norm (inference), relu and the average
    pool's mean go to kiln."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d((1, 1)), torch.nn.Flatten(), torch.nn.Linear(8, 10),
    ).eval()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # non-trivial statistics
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        got = compiled(net, client)(x)
        want = net(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_kiln_ran(parts=3)  # one per gap between the convolutions and the linear


def _resnet_like(stem_stride: int = 2) -> torch.nn.Module:
    """A stem (convolution, batch norm, ReLU, max pool), two basic blocks (the second with a
    strided downsampling shortcut) and the head: resnet18 in miniature."""

    class Block(torch.nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = torch.nn.BatchNorm2d(cout)
            self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = torch.nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 5, stem_stride, 2, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1), Block(8, 8, 1), Block(8, 12, 2),
        torch.nn.AdaptiveAvgPool2d((1, 1)), torch.nn.Flatten(), torch.nn.Linear(12, 10))
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # non-trivial statistics
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return net


@pytest.fixture
def part_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Any], list[Any]]]:
    """(argument strides, result strides) of every kiln part call during the test."""
    from kiln.torch import runtime as R

    calls: list[tuple[list[Any], list[Any]]] = []
    real = R.KilnPart.__call__

    def spy(self: Any, *args: Any) -> Any:
        out = real(self, *args)
        calls.append(([a.stride() for a in args if isinstance(a, torch.Tensor)],
                      [o.stride() for o in out if isinstance(o, torch.Tensor)]))
        return out

    monkeypatch.setattr(R.KilnPart, "__call__", spy)
    return calls


def _channels_last(stride: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return torch.empty_strided(shape, stride).is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("layout", ["channels_last", "keep"])
def test_convolutions_run_channels_last(client: Any, rewrites: Any, part_calls: Any, layout: str) -> None:
    """The layout pass: the image and the weights are copied channels-last before the
    convolutions, and every kiln part between two convolutions (batch norm, ReLU, the residual
    add) reads and writes channels-last, so no convolution converts its input; results match
    eager (odd sizes: 29x29, a strided shortcut). ``layout="keep"`` leaves the traced layouts."""
    net = _resnet_like().eval()
    x = torch.randn(3, 3, 29, 29)
    f = torch.compile(net, backend="kiln", options={"client": client, "layout": layout})
    with torch.no_grad():
        want = net(x)
        for _ in range(2):  # the second call: through the native runner
            torch.testing.assert_close(f(x), want, rtol=1e-4, atol=1e-4)
    s = assert_kiln_ran(parts=6 if layout == "channels_last" else 5)  # between the convolutions (+ the weights' copy)
    outer, parts = rewrites[-1]
    convs = [n for n in outer.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert len(convs) == 6
    # What the parts between the convolutions read and write (the copies' part aside).
    laid = [(spec.shape, spec.strides) for p in parts if p.ops != ["clone.default"]
            for spec in p.part.inputs + p.part.outputs if len(spec.shape) == 4 and spec.shape[2] > 1]
    assert laid, [p.part.inputs for p in parts]
    if layout == "keep":
        assert s["layout_copies"] == 0 and all(st is None for _, st in laid)
        return
    # The image and 5 weights (the 1x1 shortcut's weight is channels-last as it is), copied in
    # one part; every 4-D activation the other parts read or write is channels-last.
    assert s["layout_copies"] == 6, s
    copies = [p for p in parts if p.ops == ["clone.default"]]
    assert len(copies) == 1 and len(copies[0].part.outputs) == 6, [p.ops for p in parts]
    assert all(st is not None and _channels_last(st, shape) for shape, st in laid), laid
    feature_maps = [st for args, outs in part_calls for st in outs if len(st) == 4]
    assert len(feature_maps) > 6 and all(st[1] == 1 for st in feature_maps), part_calls
    assert kt.stats()["native_calls"] > 0


def test_channels_last_training_and_visible_layouts(client: Any, rewrites: Any) -> None:
    """Forward and backward through the layout pass: gradients of the input and of every
    weight match eager, and a feature map the function returns keeps the layout eager gives
    it (contiguous), while the convolutions inside ran channels-last. The forward saves its
    channels-last copies of the weights and reports the saved layouts, so the backward
    (compiled for them) makes no channels-last copy of its own."""
    net = _resnet_like(stem_stride=1).train()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = net[:4](x)
        return net[4:](feats), feats

    x = torch.randn(2, 3, 17, 17, requires_grad=True)
    got = compiled(fn, client)(x)
    want = fn(x)
    assert got[1].is_contiguous() and got[1].stride() == want[1].stride()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    gen = torch.Generator().manual_seed(5)
    weights = [torch.randn(w.shape, generator=gen) for w in want]
    grads = []
    for outs in (got, want):
        params = [x] + list(net.parameters())
        grads.append(torch.autograd.grad(sum((o * wt).sum() for o, wt in zip(outs, weights)), params))
    for i, (a, b) in enumerate(zip(*grads)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=lambda m: f"gradient {i}: {m}")
    s = assert_kiln_ran(parts=12, graphs=2)
    assert s["layout_copies"] > 0, s
    assert len(rewrites) == 2
    backward = rewrites[1][0]
    relayouts = [n for n in backward.graph.nodes if n.kwargs.get("memory_format") == torch.channels_last]
    assert not relayouts, [n.format_node() for n in relayouts]


def test_training_batch_norm_runs_in_kiln_with_running_statistics(client: Any, rewrites: Any) -> None:
    """Training batch norms (batch statistics, running statistics updated) are decomposed into
    their arithmetic and run in kiln parts: no batch-norm op is left on the torch side. Over
    three steps the outputs, the input's and every parameter's gradients, and each batch norm's
    running mean, running variance and step count match eager's on an identical copy of the
    network; so does the network in eval mode afterwards (it reads the running statistics)."""
    import copy

    net = _resnet_like().train()
    ref = copy.deepcopy(net)
    run = compiled(net, client)
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        x = torch.randn(3, 3, 19, 19, generator=gen)
        weight = torch.randn(3, 10, generator=gen)
        outs = []
        for model, f in ((net, run), (ref, ref)):
            xi = x.clone().requires_grad_(True)
            y = f(xi)
            grads = torch.autograd.grad((y * weight).sum(), [xi] + list(model.parameters()))
            outs.append((y, grads))
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-4)
        for i, (a, b) in enumerate(zip(outs[0][1], outs[1][1])):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=lambda m: f"step {step}, gradient {i}: {m}")
    for (name, a), (_, b) in zip(net.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert int(dict(net.named_buffers())["1.num_batches_tracked"]) == 3
    torch_side = {str(n.target) for gm, _ in rewrites for n in gm.graph.nodes if n.op == "call_function"}
    assert not [t for t in torch_side if "batch_norm" in t], sorted(torch_side)
    net.eval()
    ref.eval()
    x = torch.randn(2, 3, 19, 19, generator=gen)
    torch.testing.assert_close(net(x), ref(x), rtol=1e-4, atol=1e-4)


class _PoolFormerBlock(torch.nn.Module):
    """PoolFormer's block (timm's poolformer): GroupNorm straight after a convolution, average
    pooling minus its input, a 1x1-convolution MLP."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1)
        self.norm1 = torch.nn.GroupNorm(1, c)
        self.pool = torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm2 = torch.nn.GroupNorm(4, c)
        self.fc = torch.nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.norm1(x)
        x = x + (self.pool(y) - y)
        return x + self.fc(torch.nn.functional.gelu(self.norm2(x)))


class _ContiguousPoolFormerBlock(_PoolFormerBlock):
    """The block as torch traces it on CUDA, where ``group_norm`` copies its operand contiguous
    itself: the trace holds that copy, and the layout pass finds the group norm's operand
    contiguous already."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.norm1(torch.clone(x, memory_format=torch.contiguous_format))
        x = x + (self.pool(y) - y)
        return x + self.fc(torch.nn.functional.gelu(self.norm2(torch.clone(x, memory_format=torch.contiguous_format))))


@pytest.mark.parametrize("block", [_PoolFormerBlock, _ContiguousPoolFormerBlock])
def test_group_norm_after_convolutions(client: Any, monkeypatch: pytest.MonkeyPatch, block: type) -> None:
    """GroupNorm on a convolution's channels-last output: torch's CUDA kernel refuses any
    operand but a contiguous one, so the layout pass gives it a contiguous copy (in every graph
    it rewrites, forward and backward); kiln lowers the group norm itself, and the copy fuses
    away. The group norm's result goes back to channels-last, so the pooling and the residual
    add after it stay in the convolution's layout. Inference and a training step's gradients
    match float64 eager."""
    from kiln.torch import passes

    seen: list[Any] = []
    real = passes.channels_last_convolutions

    def spy(gm: Any, *a: Any) -> int:
        n = real(gm, *a)
        seen.append(n)
        for node in gm.graph.nodes:
            if node.target in (torch.ops.aten.native_group_norm.default,
                               torch.ops.aten.native_group_norm_backward.default):
                operand = node.args[0].meta["val"]
                assert operand.is_contiguous(), (node, operand.stride())
            if node.target is torch.ops.aten.avg_pool2d.default:
                operand = node.args[0].meta["val"]
                assert operand.is_contiguous(memory_format=torch.channels_last), (node, operand.stride())
        return n

    monkeypatch.setattr(passes, "channels_last_convolutions", spy)
    exact = block().double()
    net = block()
    net.load_state_dict(exact.state_dict())
    # 16 channels of 48x80: one group of 61440 elements, reduced in chunks.
    x = torch.randn(2, 3, 48, 80, dtype=torch.float64)
    f = torch.compile(net, backend="kiln", options={"client": client})
    with torch.no_grad():
        want = exact(x)
        err = (f(x.float()).double() - want).abs().max().item()
        eager = (net(x.float()).double() - want).abs().max().item()
    # Eager subtracts one rounded ``y`` from its own pooling, so their rounding cancels; kiln's
    # part computes ``y`` for the taps and for the subtraction apart, which cancel less. The
    # floor is 16 f32 ulps of the largest output (a wrong divisor or tap is off by far more).
    assert err <= 4 * eager + 16 * torch.finfo(torch.float32).eps * want.abs().max().item(), (err, eager)
    assert seen and seen[0] > 0, seen  # the pass ran and put its copies in
    s = assert_kiln_ran(graphs=1)
    assert not [p for g in kt.last_graphs() for p in g["parts"] if not p["kiln"]]
    # Both group norms, the pooling between them and the MLP's gelu fuse into one part.
    groups = [p for g in kt.last_graphs() for p in g["parts"] if "native_group_norm.default" in p["ops"]]
    assert len(groups) == 1 and groups[0]["handle"], groups
    assert {"avg_pool2d.default", "gelu.default"} <= set(groups[0]["ops"]), groups
    # Gradients: kiln's distance from float64 within a few times eager f32's, or 64 f32 ulps
    # of the largest gradient. norm1's gradients come through ``pool(y) - y``, which cancels
    # most of them (its bias has none to speak of: both are rounding noise), and its weight's
    # are sums over 7680 positions of those differences; eager subtracts one rounded ``y``
    # from its own pooling, kiln computes ``y`` twice, so its rounding cancels less (measured:
    # 2e-6 to 3e-6 of the largest gradient; a wrong tap or divisor is off by 1e-3 or more).
    ref = block()
    ref.load_state_dict(exact.state_dict())
    grads = []
    for model, dtype in ((net, torch.float32), (ref, torch.float32), (exact, torch.float64)):
        xi = x.to(dtype).requires_grad_()
        fn = f if model is net else model
        fn(xi).square().sum().backward()
        grads.append([xi.grad.double()] + [p.grad.double() for p in model.parameters()])
    names = ["input"] + [n for n, _ in net.named_parameters()]
    for name, got, eager, want in zip(names, *grads):
        floor = 64 * torch.finfo(torch.float32).eps * want.abs().max().item() + 1e-6
        assert (got - want).abs().max().item() <= 4 * (eager - want).abs().max().item() + floor, name
    assert kt.stats()["failed"] == 0, kt.last_graphs()


@pytest.mark.parametrize("groups,shape", [(1, (2, 32, 40, 40)), (1, (2, 4, 96, 128)), (8, (3, 32, 9, 7)),
                                          (4, (2, 8, 20000)), (2, (2, 4, 6, 40, 40))])
def test_group_norm_alone(client: Any, groups: int, shape: tuple[int, ...]) -> None:
    """GroupNorm on contiguous operands (no convolution, so no layout pass): long groups in
    chunks (a channel each, or runs of a channel's rows: 96 rows in 3 runs, a 1-D signal's
    20000 samples in 4, a volume's 6 planes in 2), short ones whole; against float64 eager."""
    exact = torch.nn.GroupNorm(groups, shape[1]).double()
    with torch.no_grad():
        exact.weight.uniform_(0.5, 1.5)
        exact.bias.uniform_(-1, 1)
    net = torch.nn.GroupNorm(groups, shape[1])
    net.load_state_dict(exact.state_dict())
    x = torch.randn(*shape, dtype=torch.float64) * 3 + 1
    with torch.no_grad():
        want = exact(x)
        got = torch.compile(net, backend="kiln", options={"client": client})(x.float()).double()
        eager = (net(x.float()).double() - want).abs().max().item()
    assert (got - want).abs().max().item() <= 4 * eager + 1e-7 * want.abs().max().item()
    assert_kiln_ran(parts=1)


def test_inference_batch_norm_runs_in_kiln(client: Any, rewrites: Any) -> None:
    """An eval-mode batch norm (running statistics) between a convolution and a ReLU runs in a
    kiln part. Its ATen op also returns two statistics tensors that are empty on the CPU and
    read by no one; they must not send the batch norm to torch as a zero-size tensor."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    with torch.no_grad():
        for m in net:
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
        x = torch.randn(2, 3, 12, 12)
        got, want = compiled(net, client)(x), net(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_kiln_ran(min_parts=2)
    torch_side = {str(n.target) for gm, _ in rewrites for n in gm.graph.nodes if n.op == "call_function"}
    assert not [t for t in torch_side if "batch_norm" in t], sorted(torch_side)


@pytest.mark.parametrize("device,dtype,tf32,want", [
    ("cpu", torch.float32, False, True),        # oneDNN: NHWC whatever the type
    ("cuda", torch.float32, True, True),        # TF32 (cuDNN's default): NHWC
    ("cuda", torch.bfloat16, False, True),
    ("cuda", torch.float32, False, False),      # full float32: cuDNN's NCHW kernels are faster
])
def test_layout_pass_applies_where_nhwc_convolutions_are_faster(monkeypatch: pytest.MonkeyPatch, device: str,
                                                               dtype: torch.dtype, tf32: bool, want: bool) -> None:
    """The layout pass is chosen per graph from its convolutions' device, type and cuDNN's TF32
    setting (measured: tests/bench/gpu/conv_layouts.py); checked on FakeTensor graphs, which
    need no GPU."""
    from torch._subclasses import FakeTensorMode

    from kiln.torch.passes.channels_last import wants_channels_last

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(torch.ops.aten.convolution.default, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
    g.output(y)
    with FakeTensorMode():
        x.meta["val"] = torch.empty(2, 3, 8, 8, device=device, dtype=dtype)
        w.meta["val"] = torch.empty(4, 3, 3, 3, device=device, dtype=dtype)
        y.meta["val"] = torch.ops.aten.convolution.default(x.meta["val"], w.meta["val"], None, [1, 1], [0, 0],
                                                           [1, 1], False, [0, 0], 1)
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert wants_channels_last(gm, "auto") is want
    assert wants_channels_last(gm, "channels_last") is True  # forced
    assert wants_channels_last(gm, "keep") is False


def test_failed_layout_pass_leaves_the_graph_as_traced(client: Any, rewrites: Any,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A layout pass that fails half way (here: once it has put its copies before the
    convolutions and the copies that restore a returned feature map's layout) takes every
    node it added back out: the graph compiles and runs with its traced layouts. It says so in
    one line per graph, whatever the error's message carries after its first line."""
    from kiln.torch.passes import channels_last as layout

    real = layout._restore_output_layouts

    def restore_then_fail(*a: Any) -> None:
        real(*a)
        raise RuntimeError("injected\n\nWhile executing %view ...\nOriginal traceback:\n  File ...")

    monkeypatch.setattr(layout, "_restore_output_layouts", restore_then_fail)
    net = _resnet_like().eval()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = net[:4](x)
        return net[4:](feats), feats

    x = torch.randn(2, 3, 21, 21)
    with torch.no_grad():
        for g, w in zip(compiled(fn, client)(x), fn(x)):
            assert g.stride() == w.stride()
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    s = assert_kiln_ran(parts=5)
    assert s["layout_copies"] == 0, s
    outer, parts = rewrites[-1]
    assert not [n for n in outer.graph.nodes if n.kwargs.get("memory_format") is not None]
    assert all(spec.strides is None for p in parts for spec in p.part.inputs + p.part.outputs)
    said = [r.getMessage() for r in caplog.records if "layout pass skipped" in r.getMessage()]
    assert said and all(m.endswith("RuntimeError: injected") for m in said), said


def test_views_the_new_layout_cannot_express_get_contiguous_copies(client: Any, rewrites: Any,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Views traced on a contiguous feature map that its channels-last layout cannot express
    (N and C merged; MobileViT's patch unfolding) read a contiguous copy of it: the pass still
    applies to the rest of the graph, the values are eager's."""
    from kiln.torch.passes import channels_last as layout

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(8, 8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv(x))
            z = y.view(16, 4, 4).sum(-1)
            patches = y.reshape(2, 8, 2, 2, 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(2, 8, 4, 4)
            return self.conv2(patches) + z.view(2, 8, 4, 1)

    net = Net().eval()
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        got, want = compiled(net, client)(x), net(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()
    s = assert_kiln_ran()
    assert s["layout_copies"] > 0, s
    assert not [r for r in caplog.records if "layout pass skipped" in r.getMessage()]
    outer, _ = rewrites[-1]
    convs = [n for n in outer.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert all(layout.is_channels_last(n.args[0].meta["val"]) for n in convs), convs


def test_results_in_a_traced_layout_are_stored_in_it(client: Any, rewrites: Any) -> None:
    """A result torch's caller sees channels-last is stored by the kernel in that layout: the
    part's output is the permuted tensor, with no copy after it (a transposed result is the
    torch side's view of a contiguous one, as before)."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.sin(x) * 2).t(), torch.relu(y.contiguous(memory_format=torch.channels_last) + 1)

    x, y = torch.randn(5, 7), torch.randn(2, 3, 4, 6)
    got, want = compiled(fn, client)(x, y), fn(x, y)
    for g, w in zip(got, want):
        assert g.stride() == w.stride()
        torch.testing.assert_close(g, w)
    assert_kiln_ran(parts=1)
    _, parts = rewrites[-1]
    specs = [spec for p in parts for spec in p.part.outputs]
    assert any(spec.shape == (2, 3, 4, 6) and spec.strides == (72, 1, 18, 3) for spec in specs), specs


def test_argument_returned_in_another_layout_is_copied_into_it(client: Any) -> None:
    """A part whose result is its argument in another layout (a channels-last tensor made
    contiguous, the other way round) copies it in its kernel: the result has the traced
    layout, not the argument's."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(x) + 1  # channels-last, as x is
        return y.contiguous(), y.transpose(0, 1).contiguous(memory_format=torch.channels_last), x.contiguous()

    # Large enough (64Ki elements) for the argument's own copy to be a kiln part.
    x = torch.randn(4, 16, 32, 32).contiguous(memory_format=torch.channels_last)
    got, want = compiled(fn, client)(x), fn(x)
    for g, w in zip(got, want):
        assert g.stride() == w.stride(), (g.stride(), w.stride())
        torch.testing.assert_close(g, w)
    assert_kiln_ran(parts=1)


def test_result_that_a_torch_side_view_relies_on_keeps_its_traced_layout(client: Any) -> None:
    """A kiln result whose traced layout is head-transposed (a pointwise op keeps its operand's
    layout in eager), read by the torch side through a slice and a permute into ``view``: the
    view is only valid in that layout, so the kernel stores the result in it (a Mistral-style
    rotary embedding's key gradient failed the backward with "view size is not compatible")."""
    b, t, h, d = 2, 24, 4, 16

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x.view(b, t, h, d).transpose(1, 2)
        z = torch.sin(y) * 2 + 1
        return z[:, :, :t].transpose(1, 2).view(b * t, h * d) @ w

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, t, h * d, generator=gen, requires_grad=True)
    w = torch.randn(h * d, 8, generator=gen, requires_grad=True)
    check_fwd_bwd(fn, [x, w], client)
    assert_kiln_ran(parts=2, graphs=2)


def test_a_slice_a_part_stores_contiguous_is_read_contiguous_by_the_next_part(client: Any) -> None:
    """gMLP's spatial gating unit: ``u, v = gelu(x @ w1).chunk(2, -1)``, ``v`` normalised and
    mixed along the sequence (a product in torch), then ``u * v``. torch traced ``u`` as a
    slice of the wider gelu result; the first part stores it contiguous (no reader needs the
    slice's layout), so the part after the product must read it contiguous: declared with the
    traced strides, every call copied ``u`` into a slice-shaped buffer first."""
    gen = torch.Generator().manual_seed(0)
    b, t, c = 2, 12, 32
    w1, ws = torch.randn(c, 4 * c, generator=gen) / c**0.5, torch.randn(t, t, generator=gen) / t**0.5

    def fn(x: torch.Tensor) -> torch.Tensor:
        u, v = torch.nn.functional.gelu(x @ w1).chunk(2, dim=-1)
        v = torch.nn.functional.layer_norm(v, (2 * c,))
        v = (ws @ v.transpose(1, 2).reshape(b, t, -1).transpose(1, 2).reshape(-1, t).T).T
        return u * v.reshape(b, 2 * c, t).transpose(1, 2) + 1

    x = torch.randn(b, t, c, generator=gen)
    f = compiled(fn, client)
    torch.testing.assert_close(f(x), fn(x), rtol=1e-4, atol=1e-5)
    assert_kiln_ran(parts=2)
    assert _torch_copies(f, x)["copy_"] == 0


def test_a_head_of_a_fused_qkv_that_torch_views_is_returned_as_its_base(client: Any) -> None:
    """CoaT's factorised attention: the heads of a fused q/k/v projection
    (``qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)[i]``) are in no dense layout, and the
    matrix products' ``view``s rely on their strides; ``q`` is also read by kiln. A kernel
    cannot store such a result: the part returns the contiguous projection and torch takes the
    head views of it (the part was refused before, every call ran in torch)."""
    gen = torch.Generator().manual_seed(0)
    bsz, n, h, d = 2, 10, 4, 8
    c = h * d
    w, bias = torch.randn(c, 3 * c, generator=gen) / c**0.5, torch.randn(3 * c, generator=gen)

    wconv = torch.randn(c, 1, 3, generator=gen)

    def fn(x: torch.Tensor) -> torch.Tensor:
        qkv = torch.tanh(x @ w + bias).reshape(bsz, n, 3, h, d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.einsum("bhnk,bhnv->bhkv", k.softmax(dim=2), v)
        # The positional term: v without its first token as [B, C, N - 1] (a view valid in
        # the projection's layout only), a depthwise convolution, times q.
        pos = torch.nn.functional.conv1d(v[:, :, 1:].transpose(-1, -2).reshape(bsz, c, n - 1), wconv,
                                         padding=1, groups=c)
        pos = q[:, :, 1:] * pos.reshape(bsz, h, d, n - 1).transpose(-1, -2)
        out = torch.einsum("bhnk,bhkv->bhnv", q, att)
        return torch.cat([out[:, :, :1], out[:, :, 1:] + pos], dim=2).transpose(1, 2).reshape(bsz, n, c)

    x = torch.randn(bsz, n, c, generator=gen, requires_grad=True)
    check_fwd_bwd(fn, [x], client)
    assert kt.stats()["failed"] == 0 and kt.stats()["eager_calls"] == 0, kt.stats()


def test_rotary_attention_with_an_empty_key_cache_runs_in_kiln(client: Any) -> None:
    """A decoder layer's rotary embedding whose keys are concatenated to an empty cache (a
    zero-size tensor): the concatenation with the empty tensor runs in torch, the rotary math
    around it in kiln (a zero-size argument used to send the whole part to torch). The query
    kiln hands attention is contiguous where the trace's was head-transposed, so attention's
    output has another layout than traced and the view after it becomes a reshape."""
    b, t, h, d = 2, 24, 4, 16

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)

    def fn(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor,
           cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = (x @ wq).view(b, t, h, d).transpose(1, 2)
        k = (x @ wk).view(b, t, h, d).transpose(1, 2)
        v = (x @ wv).view(b, t, h, d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        empty = torch.tensor([]).view(b, h, 0, d)  # the cache before the first step
        k, v = torch.cat([empty, k], dim=-2), torch.cat([empty, v], dim=-2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(b, t, h * d) @ wo

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, t, h * d, generator=gen)
    ws = [torch.randn(h * d, h * d, generator=gen) / 8 for _ in range(4)]
    angles = torch.arange(t)[:, None] / (100 ** (torch.arange(0, d, 2) / d))[None]
    emb = torch.cat((angles, angles), -1)
    with torch.no_grad():
        got, want = compiled(fn, client)(x, *ws, emb.cos(), emb.sin()), fn(x, *ws, emb.cos(), emb.sin())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_kiln_ran(parts=1)
    kiln_ops = {op for g in kt.last_graphs() for p in g["parts"] if p["kiln"] for op in p["ops"]}
    assert {"neg.default", "cat.default", "mul.Tensor"} <= kiln_ops, kiln_ops


def test_memory_order() -> None:
    from kiln.torch.partition import memory_order

    assert memory_order((2, 3, 4, 5), (60, 1, 15, 3)) == (0, 2, 3, 1)
    assert memory_order((2, 3), (3, 1)) == (0, 1)
    assert memory_order((2, 3), (1, 2)) == (1, 0)
    assert memory_order((2, 1, 3), (3, 99, 1)) is not None  # a size-1 dimension's stride is free
    assert memory_order((2, 3), (4, 1)) is None  # gaps: a slice of a wider tensor
    assert memory_order((2, 3), (0, 1)) is None  # broadcast
    for shape, order in [((2, 3, 4, 5), (0, 2, 3, 1)), ((4, 1, 6), (2, 0, 1)), ((3, 5, 2), (1, 2, 0))]:
        t = torch.empty([shape[d] for d in order]).permute([order.index(d) for d in range(len(shape))])
        assert t.shape == shape and memory_order(shape, t.stride()) is not None


# ---------------------------------------------------------------------------------- op coverage

def many_ops(x: torch.Tensor, y: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        x.var(1, keepdim=True) + x.std(0).sum(),
        x.amax(0) - x.amin(1).mean(),
        torch.where(x > 0, x, 0.5 * y).clamp(-1.0, 2.0),
        F.softplus(x) + F.silu(y) - F.leaky_relu(x, 0.2) + F.hardtanh(y),
        torch.log_softmax(x, dim=1),
        torch.cat([x.flip(0), y[:, ::2].repeat(1, 2)], dim=1),
        x.argmax(1) + y.argmin(0).sum(),
        (n // 3) * 2 + n % 5 - torch.div(n, 4, rounding_mode="trunc"),
        n.float() / 7 + x.to(torch.float64).sum(),
        torch.rsqrt(x.abs() + 1) * torch.exp(-y * y) + torch.erf(x) + torch.log1p(x.abs()),
        (x[1:, None, :] * y[None, :-1, :]).sum(-1),
        x.max(dim=1).values * y.min(dim=0).values.sum(),
        (x >= y) | (x < 0.3),
        torch.ops.aten.linalg_vector_norm(x, 2, [1]) + torch.ops.aten.linalg_vector_norm(y, 3.0, [0], True).sum(),
    )


def test_many_ops_match_eager(client: Any) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 8, generator=g)
    y = torch.randn(6, 8, generator=g)
    n = torch.randint(-50, 50, (6, 8), generator=g)
    got = compiled(many_ops, client)(x, y, n)
    want = many_ops(x, y, n)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype, f"output {i}: {a.dtype} vs {b.dtype}"
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"output {i}: {m}")
    assert_kiln_ran(parts=1)  # every op fuses: one part of all of them


def test_non_contiguous_input(client: Any) -> None:
    base = torch.randn(16, 24)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 2 + x.sum(0)

    xt = base.t()
    got = compiled(fn, client)(xt)
    torch.testing.assert_close(got, fn(xt))
    assert_kiln_ran(parts=1)


# ---------------------------------------------------------------------------------- fallbacks

def test_unsupported_op_runs_in_torch_silently(client: Any) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(torch.sin(x) * 2, dim=0).exp()

    x = torch.randn(50)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kt.KilnFallbackWarning)
        got = compiled(fn, client)(x)
    torch.testing.assert_close(got, fn(x))
    s = assert_kiln_ran(parts=2)  # sin*2 before cumsum, exp after
    assert s["torch_nodes"] >= 1


def test_part_that_fails_to_compile_warns_once_and_matches(client: Any) -> None:
    """A lowering that emits an op the daemon lacks: the part falls back to torch with one
    warning, however often it runs, and the other parts still run in kiln."""
    aten = torch.ops.aten

    @kt.register_lowering(aten.cumsum.default)
    def _cumsum(ctx: Any, x: Any, dim: int, dtype: Any = None) -> Any:
        return ctx.b.node("cumsum", [x], {"axis": ("i", dim % x.ndim)}, x.dtype, x.shape)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        c = torch.cumsum(torch.relu(x @ w), dim=1) + 1  # one kiln part, which fails to compile
        return torch.sigmoid(c @ w.t())  # another kiln part, which compiles

    try:
        x, w = torch.randn(8, 5), torch.randn(5, 5)
        f = compiled(fn, client)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [f(x, w) for _ in range(3)]
        fallbacks = [w_ for w_ in caught if issubclass(w_.category, kt.KilnFallbackWarning)]
        assert len(fallbacks) == 1, [str(w_.message) for w_ in caught]
        assert "cumsum" in str(fallbacks[0].message)
        for o in outs:
            torch.testing.assert_close(o, fn(x, w))
        s = kt.stats()
        assert s["failed"] == 1 and s["compiled"] == 1 and s["eager_calls"] == 3 and s["kernel_calls"] == 3, s
    finally:
        kt.unregister_lowering(aten.cumsum.default)


def test_unreachable_daemon_falls_back(kilnd: Any) -> None:
    dead = kiln.Client("127.0.0.1:1", max_attempts=1, timeout=2, compile_timeout=2)
    try:
        f = torch.compile(E.sin_cos_mix, backend="kiln", options={"client": dead})
        (x,) = E.make_sin(100, requires_grad=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = f(x)
        torch.testing.assert_close(y, E.sin_cos_mix(x))
        assert any(issubclass(w.category, kt.KilnFallbackWarning) for w in caught)
        assert kt.stats()["compiled"] == 0
    finally:
        dead.close()


def test_a_limit_the_daemon_reports_is_not_an_unreachable_daemon() -> None:
    # A host compiler past its time limit comes back as DEADLINE_EXCEEDED with kilnd's message:
    # that part falls back, the graph's other parts are still asked for. A call that got no
    # answer in time (gRPC's own message) or no connection marks the daemon for a while.
    from kiln.errors import RpcError

    assert not RpcError("Compile", "DEADLINE_EXCEEDED", "g++ ran past its 60 s limit").unreachable
    assert not RpcError("Compile", "RESOURCE_EXHAUSTED", "queue full").unreachable
    assert RpcError("Compile", "DEADLINE_EXCEEDED", "Deadline Exceeded").unreachable
    assert RpcError("Compile", "UNAVAILABLE", "failed to connect to all addresses").unreachable


# ---------------------------------------------------------------------------------- caching and modes

def test_recompile_hits_caches(client: Any) -> None:
    (x,) = E.make_sin(300, requires_grad=False)
    compiled(E.sin_cos_mix, client)(x)
    assert kt.stats()["compiled"] == 1
    torch._dynamo.reset()
    compiled(E.sin_cos_mix, client)(x)  # same graph again: remembered in this process
    assert kt.stats()["memo_hits"] == 1
    kt.clear_memo()
    torch._dynamo.reset()
    y = compiled(E.sin_cos_mix, client)(x)  # asked again: the daemon has it cached
    torch.testing.assert_close(y, E.sin_cos_mix(x))
    assert kt.stats()["cache_hits"] >= 1


def test_reduce_overhead_on_cpu_runs(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA graphs apply to GPU graphs only: on CPU the mode changes nothing."""
    monkeypatch.setenv("KILN_SERVER", server)  # torch.compile takes mode or options, not both
    (x,) = E.make_sin(256)
    f = torch.compile(E.sin_cos_mix, backend="kiln", mode="reduce-overhead")
    xk, xe = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    y = f(xk)
    (y * w).sum().backward()
    want = E.sin_cos_mix(xe)
    (want * w).sum().backward()
    torch.testing.assert_close(y, want)
    assert xk.grad is not None
    torch.testing.assert_close(xk.grad, xe.grad)
    assert_kiln_ran(parts=2)  # one forward, one backward part


class GatedClient:
    """The session's client with every compile held until ``gate`` is set: a compile that
    cannot finish, to see what async mode does meanwhile."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.address = inner.address
        self.gate = threading.Event()
        self.calls = 0

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        assert self.gate.wait(120), "the test never released the compile"
        return self.inner.compile(*args, **kwargs)


def test_async_compile_answers_in_torch_then_switches_to_kiln(client: Any) -> None:
    """With async, a call never waits for kilnd: while the parts compile the graph runs in
    torch (right results, no kernel calls); once they are loaded the kernels run."""
    gated = GatedClient(client)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * w + torch.exp(-x * x).sum(dim=-1, keepdim=True)

    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, 48, generator=gen, requires_grad=True)
    w = torch.randn(64, 48, generator=gen)
    f = torch.compile(fn, backend="kiln", options={"client": gated, "async": True})

    got = f(x, w)  # returns although no compile can finish yet
    torch.testing.assert_close(got, fn(x, w))
    deadline = time.monotonic() + 60
    while gated.calls == 0 and time.monotonic() < deadline:  # the background job reaches kilnd
        time.sleep(0.01)
    assert gated.calls >= 1, "no compile was started in the background"
    torch.testing.assert_close(f(x, w), fn(x, w))  # still compiling: torch again
    s = kt.stats()
    assert s["compiled"] == 0 and s["kernel_calls"] == 0, s

    gated.gate.set()
    got.backward(torch.ones_like(got))  # the backward graph compiles (asynchronously) here
    assert kt.wait(120), "async compiles did not finish"
    before = kt.stats()["kernel_calls"]
    x2 = x.detach().clone().requires_grad_(True)
    weights = torch.randn(64, 48, generator=gen)
    got = f(x2, w)
    (got * weights).sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    want = fn(x_ref, w)
    (want * weights).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x2.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    s = kt.stats()
    assert s["failed"] == 0 and s["compiled"] >= 2, (s, kt.last_graphs())
    assert s["kernel_calls"] >= before + 2, s  # forward and backward parts ran as kernels


@pytest.mark.parametrize("dynamic", [False, True])
def test_async_partitions_static_graphs_in_the_background(client: Any, monkeypatch: pytest.MonkeyPatch,
                                                         dynamic: bool) -> None:
    """With async, a graph of static shapes is partitioned and lowered off the caller's thread
    (its first calls run the traced ATen graph meanwhile); one with symbolic sizes is
    partitioned on it, where a guard its lowering adds still reaches Dynamo. Both end in kiln's
    kernels with eager's results."""
    from kiln.torch import dynamo_backend as DB

    threads: list[threading.Thread] = []
    real = DB.partition

    def spy(gm: Any) -> Any:
        threads.append(threading.current_thread())
        return real(gm)

    monkeypatch.setattr(DB, "partition", spy)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 2 + torch.exp(-x * x).sum(dim=-1, keepdim=True)

    f = torch.compile(fn, backend="kiln", options={"client": client, "async": True}, dynamic=dynamic)
    x = torch.randn(32, 48)
    torch.testing.assert_close(f(x), fn(x))
    assert kt.wait(120), "async compiles did not finish"
    torch.testing.assert_close(f(x), fn(x), rtol=1e-5, atol=1e-5)
    s = kt.stats()
    assert s["failed"] == 0 and s["kernel_calls"] >= 1, (s, kt.last_graphs())
    assert threads, "nothing was partitioned"
    main = threading.main_thread()
    assert all((t is main) == dynamic for t in threads), threads


def test_async_compile_failure_falls_back_like_a_blocking_one(kilnd: Any) -> None:
    """A daemon that cannot be reached, in async mode: the program goes on in torch."""
    dead = kiln.Client("127.0.0.1:1", max_attempts=1, timeout=2, compile_timeout=2)
    try:
        f = torch.compile(E.sin_cos_mix, backend="kiln", options={"client": dead, "async": True})
        (x,) = E.make_sin(100, requires_grad=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kt.KilnFallbackWarning)
            torch.testing.assert_close(f(x), E.sin_cos_mix(x))
            assert kt.wait(60)
            torch.testing.assert_close(f(x), E.sin_cos_mix(x))
        s = kt.stats()
        assert s["failed"] >= 1 and s["kernel_calls"] == 0, s
    finally:
        dead.close()


class TracingThreads:
    """A kiln backend that records the thread Dynamo called it on (where the model was traced)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.threads: list[threading.Thread] = []

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread())
        options = dict(kwargs.pop("options", None) or {}, client=self.client)
        return kt.kiln_backend(gm, example_inputs, options=options, **kwargs)


class Block(torch.nn.Module):
    def __init__(self, norm: torch.nn.Module, drop: float = 0.0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(24, 24)
        self.norm = norm
        self.drop = torch.nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.nn.functional.gelu(self.norm(self.lin(x)))) * 2 + x


def test_kiln_compile_async_first_call_is_eager_and_the_trace_runs_in_the_background(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """kiln.torch.compile with async: the first call returns eager's result without Dynamo
    tracing on the caller's thread; a background thread traces once the model is called again;
    later calls run kiln's kernels."""
    from kiln.torch import first_call

    monkeypatch.setattr(first_call, "QUIET_S", 600.0)
    torch.manual_seed(3)
    model = Block(torch.nn.LayerNorm(24)).eval()
    tracer = TracingThreads(client)
    f = kt.compile(model, backend=tracer, options={"async": True})
    x = torch.randn(16, 24)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(f(x), want)
        time.sleep(0.5)
        assert tracer.threads == [] and not f.traced, "traced before the model was called again"
        torch.testing.assert_close(f(x), want)  # eager again; the trace starts now
        deadline = time.monotonic() + 120
        while not f.traced and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f.wait(120), "the background trace did not finish"
        assert f.traced and f.error is None and f.traced_here is None
        assert tracer.threads and all(t is not threading.main_thread() for t in tracer.threads), tracer.threads
        before = kt.stats()["kernel_calls"]
        torch.testing.assert_close(f(x), want, rtol=1e-5, atol=1e-5)
    assert len(tracer.threads) == 1, "the caller's call after the trace recompiled"
    s = kt.stats()
    assert s["failed"] == 0 and s["kernel_calls"] > before, (s, kt.last_graphs())
    assert f.training is False  # attributes reach the model


@pytest.mark.parametrize("what", ["buffers", "random"])
def test_kiln_compile_async_does_not_repeat_a_call_with_effects(client: Any, what: str) -> None:
    """A first call that wrote the model's state (a training batch norm's running statistics) or
    drew random numbers (dropout) is not run again in the background: the second call traces on
    the caller's thread, and the running statistics are eager's after two calls."""
    torch.manual_seed(4)
    norm = torch.nn.BatchNorm1d(24) if what == "buffers" else torch.nn.LayerNorm(24)
    model = Block(norm, drop=0.5 if what == "random" else 0.0).train()
    ref = copy.deepcopy(model)
    tracer = TracingThreads(client)
    f = kt.compile(model, backend=tracer, options={"async": True})
    x = torch.randn(16, 24)
    f(x)
    ref(x)
    assert f.traced_here is not None and f.wait(120)
    assert tracer.threads == [], "the model was run again in the background"
    got = f(x)
    ref_out = ref(x)
    assert tracer.threads == [threading.main_thread()]
    if what == "buffers":
        torch.testing.assert_close(got, ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.norm.running_mean, ref.norm.running_mean)
        torch.testing.assert_close(model.norm.running_var, ref.norm.running_var)
        assert int(model.norm.num_batches_tracked) == 2


def test_kiln_compile_async_writes_the_callers_arguments_once(client: Any) -> None:
    """The background trace runs on copies: an argument the function writes is written once."""
    def bump_and_mix(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return torch.tanh(x) * 3

    tracer = TracingThreads(client)
    f = kt.compile(bump_and_mix, backend=tracer, options={"async": True})
    x0 = torch.randn(8, 32)
    x = x0.clone()
    torch.testing.assert_close(f(x), torch.tanh(x0 + 1) * 3)
    assert f.wait(120)
    torch.testing.assert_close(x, x0 + 1)
    assert tracer.threads and tracer.threads[0] is not threading.main_thread()
    torch.testing.assert_close(f(x), torch.tanh(x0 + 2) * 3, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x, x0 + 2)


def test_kiln_compile_without_async_is_torch_compile(client: Any) -> None:
    tracer = TracingThreads(client)
    f = kt.compile(E.sin_cos_mix, backend=tracer)
    (x,) = E.make_sin(64, requires_grad=False)
    torch.testing.assert_close(f(x), E.sin_cos_mix(x))
    assert tracer.threads == [threading.main_thread()]
    assert not isinstance(f, kt.EagerFirst)


def test_backend_factory_with_options(client: Any) -> None:
    be = kt.backend(client=client, opt_level=1, mode="reduce-overhead")
    (x,) = E.make_sin(64, requires_grad=False)
    y = torch.compile(E.sin_cos_mix, backend=be)(x)
    torch.testing.assert_close(y, E.sin_cos_mix(x))
    assert_kiln_ran(parts=1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(client: Any, dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2 + y, dim=-1) + torch.tanh(y).sum(0)

    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 16, generator=g).to(dtype)
    y = torch.randn(8, 16, generator=g).to(dtype)
    got = compiled(fn, client)(x, y)
    want = fn(x.double(), y.double())  # the exact result for these half inputs
    assert got.dtype == dtype
    # kiln computes in float32 and rounds the stored result to the half type once: within half
    # an ulp of it (2^-11 of |want| for float16, 2^-8 for bfloat16) plus float32's own error.
    # Twice that allows one more rounding of an intermediate (the column sums of tanh, up to ~8
    # in magnitude, kept in the half type); the atol is the same bound for results near 0.
    # (kiln stays within 0.66 of it here.) Eager torch in the half type is no reference: it
    # rounds after every op, and its bfloat16 result exceeds this bound.
    ulp = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=2 * ulp, atol=ulp)
    assert_kiln_ran(parts=1)  # softmax, tanh and the sum fuse into one part


# ---------------------------------------------------------------------------------- the GPU check

def test_gpu_check_judges_each_element_on_its_own_scale() -> None:
    """tests/gpu/torch_backend_gpu.py's comparison: an element far off on its own scale fails
    even when the tensor holds much larger values; rounding-sized errors pass."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "gpu" / "torch_backend_gpu.py"
    spec = importlib.util.spec_from_file_location("torch_backend_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    exact = torch.tensor([1000.0, 0.5, -2.0, 1e-3], dtype=torch.float64)
    eager = exact.float()
    tol = (1e-5, 1e-5)
    assert mod.elements_beyond_tolerance(eager, eager, exact, tol)[0] == 0
    rounded = (exact * (1 + 3e-7)).float()
    assert mod.elements_beyond_tolerance(rounded, eager, exact, tol)[0] == 0
    small_wrong = eager.clone()
    small_wrong[3] = 2e-3  # 100% off, yet within rtol * max|exact| = 0.01 of the whole tensor
    n, why = mod.elements_beyond_tolerance(small_wrong, eager, exact, tol)
    assert n == 1 and "worst at 3" in why, why
    nan = eager.clone()
    nan[1] = float("nan")
    assert mod.elements_beyond_tolerance(nan, eager, exact, tol)[0] == 1


# ---------------------------------------------------------------------- dynamic shapes

def _ln_gelu_linear() -> Callable[..., Any]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, (64,)) * w
        return F.gelu(lin(y)).softmax(-1), y.view(-1, 64).sum(0)

    return f


def check_ln_gelu_linear_step(f: Callable[..., Any], cf: Callable[..., Any], bs: int, t: int) -> None:
    """One forward and backward of ``_ln_gelu_linear`` at [bs, t, 64], compiled against eager:
    outputs, and the gradients of a randomly weighted loss."""
    x = torch.randn(bs, t, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    got, want = cf(x, w), f(xr, wr)
    gen = torch.Generator().manual_seed(bs * 100 + t)
    weights = [torch.randn(o.shape, generator=gen) for o in want]
    sum((g * k).sum() for g, k in zip(got, weights)).backward()
    sum((o * k).sum() for o, k in zip(want, weights)).backward()
    for g, o in zip(got, want):
        torch.testing.assert_close(g, o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dynamic", [True, None])
def test_dynamic_shapes_compile_once_for_every_size(client, dynamic) -> None:
    """torch's symbolic sizes become kiln symbols: forward and backward parts compiled once
    serve every batch and sequence length, with no part falling back to torch."""
    f = _ln_gelu_linear()
    cf = compiled(f, client, dynamic=dynamic)
    parts_after: list[int] = []
    eager_after_first = 0
    for bs, t in [(3, 5), (2, 7), (4, 9), (6, 11)]:
        check_ln_gelu_linear_step(f, cf, bs, t)
        parts_after.append(kt.stats()["compiled"])
        if len(parts_after) == 1:
            eager_after_first = kt.stats()["eager_calls"]
    s = kt.stats()
    # Every call of a symbolic part runs kiln's kernels (the first, static graph of automatic
    # mode is the static path's business).
    assert s["failed"] == 0 and s["eager_calls"] == (0 if dynamic else eager_after_first), kt.last_graphs()
    # dynamic=True: symbolic from the first call; automatic: exact shapes, then symbolic.
    settled = 0 if dynamic else 1
    assert parts_after[settled:] == [parts_after[settled]] * (len(parts_after) - settled), parts_after
    assert any(p["kiln"] for g in kt.last_graphs() for p in g["parts"])


def test_dynamic_fill_ops_keep_the_graph_symbolic(client) -> None:
    """ones_like / zeros_like / full_like / fill of a tensor with symbolic sizes (an attention
    mask built from the input, say) lower without reading the sizes: reading one would make
    torch guard on its value, and every new length would recompile the whole graph."""

    def f(x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(x[..., 0])
        bias = torch.full_like(x, 0.5) + torch.zeros_like(x)
        y = x.clone().fill_(2.0)
        return (x * mask[..., None] + bias).softmax(-1) * y

    cf = compiled(f, client)
    graphs0 = kt.stats()["graphs"]
    for bs, t in [(3, 5), (2, 7), (4, 9), (6, 11), (5, 13)]:  # no 1: torch specialises it
        x = torch.randn(bs, t, 16)
        torch.testing.assert_close(cf(x), f(x), rtol=1e-5, atol=1e-6)
    s = kt.stats()
    # Automatic dynamic: a static graph, then one symbolic graph for every later size.
    assert s["graphs"] - graphs0 == 2, kt.last_graphs()
    assert s["failed"] == 0
    assert any(p["kiln"] for g in kt.last_graphs() for p in g["parts"])


def test_slices_along_a_symbolic_length_run_beside_the_part(client) -> None:
    """A slice, select or split that cuts a symbolic dimension (a decoder's shift-right
    ``x[:, :-1]``, the last position ``x[:, -1]``) cannot be a kiln op (the result's length is
    an expression no argument carries; a negative position read at the example size is wrong
    at another): the node runs in torch beside the kiln parts rather than failing the part's
    compile on kilnd, which sent BART's whole embedding part to torch at every length."""

    def f(x: torch.Tensor) -> torch.Tensor:
        shifted = torch.zeros_like(x)
        shifted[:, 1:] = torch.tanh(x[:, :-1]) * 2
        last = torch.sigmoid(x[:, -1:]) + x.select(1, -1).unsqueeze(1)
        head, rest = x.split([1, x.shape[1] - 1], dim=1)
        return (shifted * 3 + last).softmax(-1) + torch.cat([rest.exp(), head], 1)

    cf = compiled(f, client)
    for bs, t in [(3, 5), (2, 7), (4, 9), (5, 13)]:
        x = torch.randn(bs, t, 16)
        torch.testing.assert_close(cf(x), f(x), rtol=1e-5, atol=1e-6)
    s = kt.stats()
    assert s["failed"] == 0, kt.last_graphs()
    assert s["graphs"] == 2, s  # automatic dynamic: static, then symbolic for every later length
    symbolic = kt.last_graphs()[-1]
    assert any(p["kiln"] for p in symbolic["parts"]), symbolic


def test_linear_bias_joins_the_kiln_part_that_reads_it(client) -> None:
    """addmm's bias epilogue moves into the kiln part after it (gelu; residual + layer_norm):
    torch runs a plain mm, kiln adds the bias inside its fused kernel; forward and gradients
    match eager. A linear layer whose result only torch reads keeps its addmm, and so does one
    whose result a training forward saves (gelu's input: the epilogue writes it for free)."""
    torch.manual_seed(3)
    lin1, lin2, lin3 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)
    ln = torch.nn.LayerNorm(32)

    def f(x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(lin1(x))
        y = ln(lin2(h) + x)
        return lin3(lin3(y).tanh() @ lin3.weight)  # the last addmm feeds only the graph output

    gm_seen: list[torch.fx.GraphModule] = []
    from kiln.torch import partition as P

    orig = P.partition

    def spy(gm: torch.fx.GraphModule) -> Any:
        out = orig(gm)
        gm_seen.append(gm)
        return out

    P.partition = spy
    try:
        import kiln.torch.dynamo_backend as DB

        DB.partition = spy
        cf = compiled(f, client)
        x = torch.randn(4, 10, 32, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        got, want = cf(x), f(xr)
        torch._dynamo.reset()
        with torch.no_grad():
            torch.testing.assert_close(compiled(f, client)(x), want, rtol=1e-5, atol=1e-5)
    finally:
        P.partition = orig
        DB.partition = orig
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    aten = torch.ops.aten
    fwd, inference = ([n.target for n in gm.graph.nodes if n.op == "call_function"] for gm in (gm_seen[0], gm_seen[-1]))
    # Training: lin2 and the inner lin3 lose their bias to kiln (lin1's result is saved for
    # gelu's backward); the matmul is an mm anyway. Inference: lin1 too.
    assert fwd.count(aten.mm.default) == 3 and fwd.count(aten.addmm.default) == 2, fwd
    assert inference.count(aten.mm.default) == 4 and inference.count(aten.addmm.default) == 1, inference
    forward_parts = [p for p in kt.last_graphs()[0]["parts"]]
    assert all(p["kiln"] for p in forward_parts)
    inference_parts = [p for g in kt.last_graphs() if g["kind"] == "inference" for p in g["parts"]]
    assert any("gelu.default" in p["ops"] and "add.Tensor" in p["ops"] for p in inference_parts), inference_parts


@pytest.mark.parametrize("masked", [True, False])
def test_attention_gradients_match_eager(client, masked) -> None:
    """scaled_dot_product_attention between kiln parts (projections' bias adds, the residual and
    layer_norm after it): outputs and the gradients of q, k, v and the weights match eager.
    (torch's CPU flash-attention decomposition gives wrong gradients: it stays one torch op.)"""
    torch.manual_seed(5)
    proj, out_proj = torch.nn.Linear(64, 3 * 64), torch.nn.Linear(64, 64)

    def f(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = proj(x).view(2, 16, 3, 2, 32).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if masked else None)
        return F.layer_norm(out_proj(a.transpose(1, 2).reshape(2, 16, 64)) + x, (64,))

    x = torch.randn(2, 16, 64, requires_grad=True)
    mask = torch.randn(2, 1, 16, 16)
    params = [x, *proj.parameters(), *out_proj.parameters()]
    want = f(x, mask)
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    g_want = torch.autograd.grad((want * w).sum(), params)
    got = compiled(f, client)(x, mask)
    g_got = torch.autograd.grad((got * w).sum(), params)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert kt.stats()["failed"] == 0


def test_embedding_backward_stays_one_torch_op(client) -> None:
    """Token and position embeddings with repeated ids, summed and normalised: outputs and
    the gradients of the tables match eager, and the backward runs torch's embedding backward
    as one op (decomposed, it is an index_put with accumulation: a sort and a serial scatter
    on CUDA, ~15x slower for BERT-base's word embeddings)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(6)
    words, pos = torch.nn.Embedding(50, 32), torch.nn.Embedding(16, 32)

    def f(ids: torch.Tensor) -> torch.Tensor:
        p = torch.arange(ids.shape[1]).expand_as(ids)
        return F.layer_norm(words(ids) + pos(p), (32,))

    ids = torch.randint(0, 50, (4, 16))
    ids[:, :4] = 7  # repeated ids: their gradients accumulate
    params = [words.weight, pos.weight]
    want = f(ids)
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(3))
    g_want = torch.autograd.grad((want * w).sum(), params)

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.seen.add(func.__name__)
            return func(*args, **(kwargs or {}))

    got = compiled(f, client)(ids)
    with Ops() as ops:
        g_got = torch.autograd.grad((got * w).sum(), params)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert "embedding_dense_backward.default" in ops.seen, sorted(ops.seen)
    assert not any(n.startswith("index_put") for n in ops.seen), sorted(ops.seen)
    assert kt.stats()["failed"] == 0


def test_dynamic_linear_bias_and_views_stay_in_kiln(client) -> None:
    """With symbolic sizes the reshape around a linear layer takes a run-time size: a reshape
    kiln can infer (flattening) runs inside the part, and the bias add of the linear layer moves
    below a reshape kiln cannot take so that it still fuses with the gelu; one compile serves
    every size, nothing runs in torch, results match eager."""
    torch.manual_seed(4)
    lin = torch.nn.Linear(32, 48)

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.gelu(lin(x))
        return h, (h * 2).view(-1, 48).sum(0)

    cf = compiled(f, client, dynamic=True)
    for bs, t in [(3, 5), (2, 7), (4, 9)]:
        x = torch.randn(bs, t, 32)
        with torch.no_grad():  # inference: the product is not also saved for a backward
            got = cf(x)
        for g, w in zip(got, f(x)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    s = kt.stats()
    assert s["failed"] == 0 and s["eager_calls"] == 0, kt.last_graphs()
    parts = [p for g in kt.last_graphs() for p in g["parts"]]
    assert any("gelu.default" in p["ops"] and "add.Tensor" in p["ops"] for p in parts), parts
    assert any("view.default" in p["ops"] for p in parts), parts


def test_dynamic_attention_head_copies_run_in_kiln(client) -> None:
    """Attention written out, as torch decomposes it on CUDA at a symbolic length: the values
    split into heads (a permuted view made contiguous before their product) and the heads
    merged back (the product's permute made contiguous before the output projection). Those
    copies are kiln parts with symbolic sizes, as at a static length, and not torch's strided
    copies; one compile serves every length, results match eager. The value projection's bias
    joins the copy's part (the product is a plain matrix product: cuBLAS's bias epilogue picks
    slower kernels for these shapes), added after the reshape to heads that kiln cannot take at
    a symbolic length, as a bias viewed [heads, head width]."""
    torch.manual_seed(7)
    heads, width = 4, 128  # copies of 64k elements and more are worth a part (REAL_COPY_ELEMENTS)
    head = width // heads
    proj = torch.nn.Linear(width, width)

    def f(x: torch.Tensor, p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[0], x.shape[1]
        # -1 as in Hugging Face's attention: a reshape kiln cannot take at a symbolic length
        vh = proj(x).view(b, t, -1, head).permute(0, 2, 1, 3).expand(b, heads, t, head)
        vh = vh.contiguous().view(b * heads, t, head)
        o = torch.bmm(p, vh).view(b, heads, t, head).permute(0, 2, 1, 3).contiguous()
        return o.view(b * t, width) @ w

    cf = compiled(f, client)  # automatic dynamic: static, then symbolic in the length alone
    for t in (80, 67, 96):
        x, p, w = torch.randn(8, t, width), torch.randn(8 * heads, t, t), torch.randn(width, 16)
        with torch.no_grad():
            torch.testing.assert_close(cf(x, p, w), f(x, p, w), rtol=1e-4, atol=1e-4)
    s = kt.stats()
    assert s["failed"] == 0 and s["eager_calls"] == 0, kt.last_graphs()
    static, symbolic = kt.last_graphs()
    for graph in (static, symbolic):
        copies = [p for p in graph["parts"] if p["kiln"] and "clone.default" in p["ops"]]
        assert len(copies) == 2, graph["parts"]
        assert any({"expand.default", "add.Tensor"} <= set(p["ops"]) for p in copies), graph["parts"]


def test_dynamic_part_reads_a_transposed_static_argument(client) -> None:
    """A part with symbolic sizes whose argument of static shape is not contiguous (a transposed
    tensor: the cross-attention bias gradients of an encoder-decoder model, whose encoder length
    stays static where the decoder's is symbolic). Such a part's arguments are passed
    contiguous (a copy of this one), so its graph must not declare the traced strides: read with
    them, the copy gave the sum over the other axis."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sum(0) * 2 + y.sum(0), (y * 3).sum(1)

    cf = compiled(f, client)
    base = torch.randn(8, 5)
    for n in (6, 9, 11):
        x = torch.randn(n, 8)
        torch._dynamo.mark_dynamic(x, 0)
        y = base.t()  # [5, 8], strides (1, 5)
        for g, w in zip(cf(x, y), f(x, y)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    s = kt.stats()
    assert s["failed"] == 0 and s["eager_calls"] == 0, kt.last_graphs()
    assert any(p["kiln"] for g in kt.last_graphs() for p in g["parts"]), kt.last_graphs()
    # The copies show, per part, where the native runner (or the Python path) made them.
    copies = [p["input_copies"] for g in kt.last_graphs() for p in g["parts"] if p["kiln"]]
    assert sum(copies) >= 1, kt.last_graphs()


@pytest.mark.parametrize("native_runner", [True, False], ids=["native", "python"])
def test_dynamic_part_keeps_a_static_result_layout(client, native_runner: bool) -> None:
    """A result of static shape in another layout than contiguous, which torch relies on (a graph
    output), computed in a part with symbolic sizes (which reads its arguments contiguous): the
    kernel stores the result's dimensions in memory order and the result is that tensor viewed
    back, with torch's strides and values, through the native runner and the Python path."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sum(0) * 2 + y.sum(0), y * 3 + 1

    cf = torch.compile(f, backend="kiln", options={"client": client, "native": native_runner})
    base = torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kt.KilnFallbackWarning)
        for n in (6, 9):
            x = torch.randn(n, 8)
            torch._dynamo.mark_dynamic(x, 0)
            y = base.t()
            for g, w in zip(cf(x, y), f(x, y)):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
                assert g.stride() == w.stride()
    s = kt.stats()
    assert s["failed"] == 0 and s["eager_calls"] == 0 and s["kernel_calls"] == 2, s
    assert (s["native_calls"] > 0) == native_runner, s


def test_a_symbolic_layout_is_dense_only_where_the_expressions_say_so() -> None:
    """symbolic_memory_order reads a layout's order from the example strides and proves it on
    the size expressions: strides that are dense at the example sizes only (a number where the
    expression has a size) are no dense layout."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.torch import lowering as L

    def g(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x.shape[2]
        return x.permute(0, 2, 3, 1) * 2, x * 2, torch.empty_strided((2, h, 7, 5), (35 * h, 7, 1, 42))

    gm = make_fx(g, tracing_mode="symbolic")(torch.randn(2, 5, 6, 7))
    nhwc, plain, dense_at_6 = (o.meta["val"] for o in next(n for n in gm.graph.nodes if n.op == "output").args[0])
    assert L.symbolic_memory_order(nhwc) == (0, 3, 1, 2) and not L.is_contiguous_symbolic(nhwc)
    assert L.symbolic_memory_order(plain) == (0, 1, 2, 3) and L.is_contiguous_symbolic(plain)
    assert L.symbolic_memory_order(dense_at_6) is None


@pytest.mark.parametrize("native_runner", [True, False], ids=["native", "python"])
def test_dynamic_part_stores_a_permuted_result_in_its_layout(client, native_runner: bool) -> None:
    """A result with symbolic sizes in a dense layout other than contiguous, which torch relies
    on (a graph output): an NHWC-shaped tensor stored in NCHW order, as a sequence model's block
    over image rows returns its residual sum. The layout is proven on the size expressions, the
    kernel stores the permuted tensor and the result is viewed back: torch's strides and values
    at each size, no fallback. The same value is returned contiguous as well (two outputs)."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = (x.permute(0, 2, 3, 1) * 2 + y).sin() * y
        return r, r.contiguous() + 1

    cf = torch.compile(f, backend="kiln", options={"client": client, "native": native_runner})
    with warnings.catch_warnings():
        warnings.simplefilter("error", kt.KilnFallbackWarning)
        for h in (6, 9, 11):
            x, y = torch.randn(2, 5, h, 7), torch.randn(5)
            torch._dynamo.mark_dynamic(x, 2)
            got, want = cf(x, y), f(x, y)
            assert got[0].stride() == want[0].stride() == (35 * h, 7, 1, 7 * h)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
                assert g.stride() == w.stride()
    s = kt.stats()
    assert s["failed"] == 0 and s["eager_calls"] == 0 and s["kernel_calls"] == 3, s
    assert (s["native_calls"] > 0) == native_runner, s


def test_attention_backward_reads_its_dropout_seed_on_the_host_outside_a_capture() -> None:
    """reduce-overhead captures graphs that draw random numbers (torch's generator advances at
    every replay); attention's backward, which reads its Philox seed and offset on the host when
    it runs outside a capture, is called through a wrapper that copies device ones to the host
    there (philox_state_on_host). Only ops taking a Philox seed are wrapped; the wrapper passes
    host tensors through and computes what the op does."""
    from kiln.torch.nodes import draws_random
    from kiln.torch.passes import philox_state_on_host

    aten = torch.ops.aten
    bwd = aten._scaled_dot_product_efficient_attention_backward.default
    g = torch.fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(8)]
    node = g.call_function(bwd, tuple(xs) + (0.1, [True, True, True, False]))
    other = g.call_function(aten.native_dropout.default, (xs[0], 0.1, True))
    g.output((node, other))
    assert draws_random(other)
    assert philox_state_on_host(g) == 1
    assert node.target is not bwd and other.target is aten.native_dropout.default
    assert philox_state_on_host(g) == 0  # wrapped once
    # The wrapper of a plain op with the same argument names computes the op: a CPU check.
    lib = torch.library.Library("kiln_test", "FRAGMENT")
    lib.define("seeded(Tensor x, Tensor philox_seed, Tensor philox_offset) -> Tensor")
    lib.impl("seeded", lambda x, s, o: x + s + o, "CPU")
    from kiln.torch.passes.philox_on_host import philox_on_host

    wrapped = philox_on_host(torch.ops.kiln_test.seeded.default)
    got = wrapped(torch.ones(3), torch.tensor(2.0), philox_offset=torch.tensor(3.0))
    torch.testing.assert_close(got, torch.full((3,), 6.0))


def test_dropout_draws_its_mask_inside_kiln_parts(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """A training dropout between a linear layer and a residual layer_norm: the mask is kiln's
    counter-based draw (one seed from torch's generator per call), fused into the parts around
    it (no dropout, rand or uniform left to torch). Output and gradients equal the eager
    computation with that mask; the same torch seed repeats a step, another seed does not; with
    ``options={"random": "torch"}``, and by default on the CPU, the masks are eager's own."""
    from kiln.torch.rng import philox_uniform

    torch.manual_seed(11)
    lin = torch.nn.Linear(48, 48)
    p = 0.3

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(F.dropout(lin(x), p, True) + x, (48,))

    x = torch.randn(40, 48, requires_grad=True)
    cf = torch.compile(f, backend="kiln", options={"client": client, "random": "kiln"})
    torch.manual_seed(5)
    got = cf(x)
    w = torch.randn_like(got)
    gx, gw = torch.autograd.grad((got * w).sum(), [x, lin.weight])
    torch.manual_seed(5)
    seed = torch.randint(2**63 - 1, (), dtype=torch.int64)  # the draw the compiled step made
    keep = philox_uniform(seed, (40, 48), 0, torch.float32) > p
    assert 0.6 < keep.float().mean() < 0.8
    x_ref = x.detach().clone().requires_grad_(True)
    want = F.layer_norm(torch.where(keep, lin(x_ref) / (1 - p), 0.0) + x_ref, (48,))
    wx, ww = torch.autograd.grad((want * w).sum(), [x_ref, lin.weight])
    for g_, w_ in [(got, want), (gx, wx), (gw, ww)]:
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)
    s = assert_kiln_ran(parts=3, graphs=2)
    assert s["random_draws"] == 1, s
    torch_code = "".join(gm.code for gm, _ in rewrites)
    for op in ("native_dropout", "rand_like", "kiln.uniform"):
        assert op not in torch_code, torch_code
    torch.manual_seed(8)
    a = cf(x)
    torch.manual_seed(8)
    assert torch.equal(cf(x), a) and not torch.equal(cf(x), a)
    # Torch's own dropout on request, and by default on the CPU: eager's masks under the same seed.
    for options in ({"random": "torch"}, {}):
        torch._dynamo.reset()
        kt.reset_stats()
        eager_rng = torch.compile(f, backend="kiln", options={"client": client, **options})
        torch.manual_seed(3)
        got = eager_rng(x)
        torch.manual_seed(3)
        torch.testing.assert_close(got, f(x), rtol=1e-5, atol=1e-5)
        assert kt.stats()["random_draws"] == 0


def test_uniform_op_in_torch_draws_what_kiln_draws(client: Any) -> None:
    """torch.ops.kiln.uniform computed by torch (where a draw runs outside kiln) equals the kiln
    kernel's numbers, for each float dtype, a permuted ``like`` keeping its strides."""
    from kiln.torch import rng

    seed = torch.tensor(2**40 + 17)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        like = torch.empty(6, 35).t()
        in_torch = torch.ops.kiln.uniform(seed, like, 7, dtype)
        assert in_torch.stride() == like.stride() and in_torch.dtype == dtype
        in_kiln = compiled(lambda s, x: torch.ops.kiln.uniform(s, x, 7, dtype) * 1, client)(seed, like)
        assert torch.equal(in_kiln, in_torch), dtype
        assert 0 <= float(in_torch.min()) and float(in_torch.max()) < 1
        torch._dynamo.reset()
    s = kt.stats()
    assert s["failed"] == 0 and s["eager_calls"] == 0 and s["kernel_calls"] >= 4, s
    assert not torch.equal(rng.philox_uniform(seed, (64,), 0, torch.float32),
                           rng.philox_uniform(seed, (64,), 1, torch.float32))


# ---------------------------------------------------------------------------------- native runner

def test_native_runner_serves_parts_after_their_first_call(client: Any) -> None:
    """Parts of forward, backward and symbolic graphs run in the native runner (kilnd built it
    from runner.cc and the C++ loader) from their first call, and still match eager."""
    assert native.RUNNER is not None, native.ERROR
    f = _ln_gelu_linear()
    cf = compiled(f, client, dynamic=True)
    for bs, t in [(3, 5), (3, 5), (2, 7), (4, 9)]:
        check_ln_gelu_linear_step(f, cf, bs, t)
    s = kt.stats()
    parts = [p for g in kt.last_graphs() for p in g["parts"] if p["kiln"]]
    assert parts and all(p["native"] for p in parts), parts
    # The runner was loaded before the parts compiled: each part's first call hands it over
    # and runs there too, so every kernel call is a native one.
    assert s["native_calls"] == s["kernel_calls"] > 0, s
    assert s["failed"] == 0 and s["eager_calls"] == 0, s


def test_native_runner_is_found_through_its_memo_then_kilnd(client: Any, monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path, subprocess_env: dict) -> None:
    """A process that built (or fetched) the runner once finds it again through the memo in
    the local artifact folder, without a build request (which digests PyTorch's headers); a
    memo naming a missing artifact falls back to kilnd's record of the runner built for this
    PyTorch, and is rewritten; a process with an empty local folder (another machine) gets it
    from that record too. Only a process that finds neither prepares a build request. The
    keys follow the runner's sources."""
    from kiln.torch import extension

    assert native.RUNNER is not None, native.ERROR
    memos = list((client.cache.root / "runner").glob("*.json"))
    assert len(memos) == 1, memos
    requests: list[str] = []
    real_prepare = extension.prepare

    def counted(name: str, *a: Any, **k: Any) -> Any:
        requests.append(name)
        return real_prepare(name, *a, **k)

    monkeypatch.setattr(extension, "prepare", counted)
    assert native.build(client) is native.RUNNER and requests == [] and native.FOUND == "memo"
    good = memos[0].read_text()
    memos[0].write_text(json.dumps({"digest": "0" * 64}))
    assert native.build(client) is native.RUNNER and requests == [] and native.FOUND == "cluster"
    assert memos[0].read_text() == good

    # Another machine: an empty local folder, the same kilnd.
    script = (
        "import json, kiln\n"
        "from kiln.torch import extension, native\n"
        "calls = []\n"
        "real = extension.prepare\n"
        "extension.prepare = lambda *a, **k: calls.append(1) or real(*a, **k)\n"
        "with kiln.Client() as c:\n"
        "    m = native.build(c)\n"
        "    print(json.dumps({'found': native.FOUND, 'prepared': len(calls), 'module': m.__name__}))\n")
    env = dict(subprocess_env, KILN_CACHE_DIR=str(tmp_path / "elsewhere"))
    out = _python(script, env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"found": "cluster", "prepared": 0,
                                                               "module": native.NAME}

    staged = native._stage(tmp_path / "a")
    keys = native._memo_key(staged), native._cluster_key(staged)
    staged[0].write_text(staged[0].read_text() + "\n// changed\n")
    assert native._memo_key(staged) != keys[0] and native._cluster_key(staged) != keys[1]


def test_native_runner_is_off_when_asked(client: Any) -> None:
    cf = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="kiln", options={"client": client, "native": False})
    x = torch.randn(8, 16)
    for _ in range(3):
        torch.testing.assert_close(cf(x), torch.sin(x) * 2 + 1)
    s = kt.stats()
    assert s["kernel_calls"] == 3 and s["native_calls"] == 0, s
    assert not any(p["native"] for g in kt.last_graphs() for p in g["parts"])


def _cpu_part(client: Any, symbolic: bool) -> tuple[Any, Any]:
    """A two-output graph compiled for the CPU (x * w + 1 and its row sums over [N, 8] with w
    [8]), and a native Part made for it the way kiln.torch makes one."""
    b = kiln.GraphBuilder()
    x = b.input("x", "f32", (6, 8), dims=("N", None) if symbolic else None)
    w = b.input("w", "f32", (8,))
    y = x * w + 1.0
    c = client.compile(b.build([y, b.sum(y, axes=[1])]), "cpu")
    k = c.load()
    names = [s.name for s in c.plan.symbols]
    if symbolic:
        ins = [[kplan.expr_text(e, names) for e in exprs] for exprs in c._in_exprs]
        outs = [[kplan.expr_text(e, names) for e in exprs] for exprs in c._out_exprs]
        syms = [v for s in c.plan.symbols for v in (s.input, s.axis)]
    else:
        ins, outs, syms = [["6", "8"], ["8"]], [["6", "8"], ["6"]], []
    part = native.RUNNER.make_part(-1, (k.run_address, k.workspace_address), None, syms, names,
                                   [(torch.float32, d, None) for d in ins], [(torch.float32, d) for d in outs],
                                   [1, 0, 1], int(c.plan.workspace_bytes))
    return c, part


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_native_part_contract(client: Any, symbolic: bool) -> None:
    """What runtime.py relies on: results in the configured order (a repeated output is the
    same tensor), computed right, for inputs in any layout (a transposed view, a broadcast) and
    with trailing size arguments; None, with nothing run, for arguments of another dtype or
    shape, too few of them, or strides other than a declared layout; an error for a
    configuration that names no input or output."""
    assert native.RUNNER is not None, native.ERROR
    c, part = _cpu_part(client, symbolic)
    for n in ([6] if not symbolic else [6, 1, 0, 13]):
        x, w = torch.randn(n, 8), torch.randn(8)
        got = part(x, w)
        assert isinstance(got, tuple) and len(got) == 3 and got[0] is got[2]
        torch.testing.assert_close(got[1], x * w + 1)
        torch.testing.assert_close(got[0], (x * w + 1).sum(1))
    x, w = torch.randn(6, 8), torch.randn(8)
    for xv, wv in [(torch.randn(8, 6).t(), w), (x, torch.randn(1).expand(8)), (x[:, None, :].expand(6, 2, 8)[:, 1], w)]:
        got = part(xv, wv, 6)
        torch.testing.assert_close(got[1], xv * wv + 1)
    assert part(x.double(), w) is None
    assert part(x, torch.randn(9)) is None
    assert part(x) is None and part(x, "w") is None
    if not symbolic:
        assert part(torch.randn(7, 8), w) is None
        # A declared layout: other strides go back to the caller, until it accepts them.
        k = c.load()
        strided = native.RUNNER.make_part(-1, (k.run_address, 0), None, [], [],
                                          [(torch.float32, ["6", "8"], (8, 1)), (torch.float32, ["8"], None)],
                                          [(torch.float32, ["6", "8"]), (torch.float32, ["6"])], [0], 0)
        torch.testing.assert_close(strided(x, w)[0], x * w + 1)
        xt = torch.randn(8, 6).t()
        assert strided(xt, w) is None
        strided.accept_strides(0, xt.stride())
        assert strided(xt, w) is not None
        # An output with strides: allocated in that layout, the kernel's contiguous store
        # read back as the torch shape (here the kernel's [6, 8] is a [8, 6] tensor transposed).
        laid = native.RUNNER.make_part(-1, (k.run_address, 0), None, [], [],
                                       [(torch.float32, ["6", "8"], None), (torch.float32, ["8"], None)],
                                       [(torch.float32, ["8", "6"], (1, 8)), (torch.float32, ["6"])], [0], 0)
        got = laid(x, w)[0]
        assert got.shape == (8, 6) and got.stride() == (1, 8)
        torch.testing.assert_close(got, (x * w + 1).t())
        with pytest.raises(ValueError, match="output strides"):
            native.RUNNER.make_part(-1, (k.run_address, 0), None, [], [], [(torch.float32, ["6", "8"], None)],
                                    [(torch.float32, ["8", "6"], (1,))], [0], 0)
    with pytest.raises(ValueError, match="symbol"):
        native.RUNNER.make_part(-1, (1, 1), None, [5, 0], ["N"], [(torch.float32, ["N"], None)],
                                [(torch.float32, ["N"])], [0], 0)
    with pytest.raises(ValueError, match="result"):
        native.RUNNER.make_part(-1, (1, 0), None, [], [], [(torch.float32, ["4"], None)],
                                [(torch.float32, ["4"])], [3], 0)


def test_native_cuda_plan_json_reads_back_in_the_cpp_loader() -> None:
    """plan_json writes what the C++ loader's parser reads (checked without a GPU: loading
    fails at the driver, after the plan was parsed)."""
    from kiln.v1 import service_pb2

    assert native.RUNNER is not None, native.ERROR
    plan = service_pb2.LaunchPlan(abi_version=2, workspace_bytes=0)
    plan.symbols.add(name="N", input=0, axis=0)
    b = plan.buffers.add(role=service_pb2.INPUT, index=0, dtype=3)
    b.shape_exprs.add().terms.add(coeff=1, exponents=[1])
    b.shape_exprs.add().terms.add(coeff=8)
    plan.buffers.add(role=service_pb2.OUTPUT, index=0, dtype=3).shape_exprs.add().terms.add(coeff=3, exponents=[1])
    s = plan.steps.add(kernel="k0", grid=[1, 1, 1], block=[256, 1, 1], args=[0, 1], grid_per_block=256)
    s.grid_work.terms.add(coeff=8, exponents=[1])
    plan.index_bound.terms.add(coeff=8, exponents=[1])
    text = kplan.plan_json(plan)
    assert '"grid_work": "8*N"' in text and '"index_bound": "8*N"' in text
    with pytest.raises(RuntimeError) as e:  # parsed; then the driver (or the image) refuses
        native.RUNNER.cuda_load(b"", b"", text)
    assert "plan" not in str(e.value).split(":")[0]
    with pytest.raises(ValueError, match="plan"):
        native.RUNNER.cuda_load(b"", b"", text.replace('"steps"', '"stepz"'))


def test_replay_only_where_it_wins(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """reduce-overhead replays a CUDA graph only for graphs of two launches or more: the seed's
    ``sin(x) + cos(x)`` is one kiln kernel, which a replay would only slow (a launch of its
    own plus an input copy). Counted on the compiled graphs (a CPU shows the count; the GPU
    check times it)."""
    from kiln.torch.cudagraphs import launches_per_call, replay_wins

    x = torch.randn(1)
    with torch.no_grad():
        compiled(lambda t: torch.sin(t) + torch.cos(t), client)(x)
        compiled(lambda t: torch.softmax(t @ t.T, -1).sum(0) + torch.cumsum(t, 0), client)(torch.randn(4, 4))
    (one, one_parts), (many, many_parts) = rewrites
    assert launches_per_call(one, one_parts) == 1 and not replay_wins(one, one_parts)
    n = launches_per_call(many, many_parts)
    assert n is not None and n >= 3 and replay_wins(many, many_parts), many.graph  # mm, kiln, cumsum
    broken = types.SimpleNamespace(compiled=None, kernel=None)  # a part that fell back to torch
    assert launches_per_call(one, [broken]) is None and replay_wins(one, [broken])


def test_native_graph_replay_helpers() -> None:
    """The C++ helpers of reduce-overhead replays (kiln/torch/cudagraphs.py), on what a CPU can
    show: storage use counts follow views; detach_all hands out new tensors over the same
    memory without history; graph_key takes CUDA tensors only."""
    assert native.RUNNER is not None, native.ERROR
    rt = native.RUNNER
    a, b = torch.randn(4, 4, requires_grad=True), torch.randn(3)
    base = rt.storage_uses([a, b])
    view = a[1:]
    assert rt.storage_uses([a, b]) == [base[0] + 1, base[1]]
    del view
    assert rt.storage_uses([a, b]) == base
    out = rt.detach_all([a, 5, b])
    assert out[1] == 5 and out[0] is not a and not out[0].requires_grad
    assert out[0].data_ptr() == a.data_ptr() and out[2].data_ptr() == b.data_ptr()
    assert rt.graph_key([b]) is None and rt.graph_key([1]) is None


def test_identical_torch_side_ops_run_once(client: Any, rewrites: list[tuple[Any, Any]],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An inference graph with the same torch-side op on the same arguments several times (BERT
    at a symbolic length pads its attention mask once per layer) runs it once; results match."""
    from kiln.torch import dynamo_backend as DB

    partitioned: list[Any] = []
    real = DB.partition
    monkeypatch.setattr(DB, "partition", lambda gm: partitioned.append(gm) or real(gm))

    def fn(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        out = x
        for _ in range(4):  # the same pad of the same mask in each "layer"
            out = torch.tanh(out + F.pad(m, (0, 3))[..., :-3].cumsum(-1))
        return out

    x, m = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        got = compiled(fn, client)(x, m)
        want = fn(x, m)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    graph = rewrites[0][0].graph
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    pads = [n for n in partitioned[0].graph.nodes if n.target is torch.ops.aten.constant_pad_nd.default]
    assert len(pads) == 1, partitioned[0].graph  # (run by a kiln part)
    assert targets.count(torch.ops.aten.cumsum.default) == 1, graph
    assert_kiln_ran(parts=2)


def _window_scores(s: torch.Tensor) -> torch.Tensor:
    """Swin's shifted-window attention mask, built in every call from zeros by slice
    assignments (its values depend on the shapes only), added to scores ``s`` [4, 16, 16]."""
    mask = s.new_zeros((8, 8))
    count = 0
    for h in ((0, -4), (-4, -2), (-2, None)):
        for w in ((0, -4), (-4, -2), (-2, None)):
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    m = mask.view(2, 4, 2, 4).permute(0, 2, 1, 3).reshape(4, 16)
    m = m.unsqueeze(1) - m.unsqueeze(2)
    m = m.masked_fill(m != 0, -100.0).masked_fill(m == 0, 0.0)
    return torch.softmax(s + m, -1)


def test_values_of_no_input_are_computed_once(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    # The mask becomes a constant of the graph: its slice_scatters, clones and copies run
    # once, not in every call; the scores' gradients flow as before.
    f = compiled(_window_scores, client)
    for seed in (0, 1):
        s = torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        s2 = s.detach().clone().requires_grad_()
        y, want = f(s), _window_scores(s2)
        torch.testing.assert_close(y, want)
        w = torch.randn(4, 16, 16)
        (y * w).sum().backward()
        (want * w).sum().backward()
        torch.testing.assert_close(s.grad, s2.grad)
    assert kt.stats()["constants"] >= 1
    outer, _ = rewrites[0]
    left = [n.target for n in outer.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.slice_scatter.default not in left and torch.ops.aten.full.default not in left


def _window_scores_of_tensors(s: torch.Tensor) -> torch.Tensor:
    """:func:`_window_scores` with each window's number assigned as a 0-d tensor, as the trace
    of a CUDA tensor's slice assignment has it (a tensor constant, copied in every call)."""
    mask = s.new_zeros((8, 8))
    count = 0
    for h in ((0, -4), (-4, -2), (-2, None)):
        for w in ((0, -4), (-4, -2), (-2, None)):
            mask[h[0]:h[1], w[0]:w[1]] = torch.tensor(count)
            count += 1
    m = mask.view(2, 4, 2, 4).permute(0, 2, 1, 3).reshape(4, 16)
    m = m.unsqueeze(1) - m.unsqueeze(2)
    return torch.softmax(s + m.masked_fill(m != 0, -100.0), -1)


def test_values_made_of_tensor_constants_are_computed_once(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    f = compiled(_window_scores_of_tensors, client)
    s = torch.randn(4, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(f(s), _window_scores_of_tensors(s))
        copies = _torch_copies(f, s)
    assert kt.stats()["constants"] >= 1
    outer, _ = rewrites[0]
    left = {n.target for n in outer.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    assert not left & {aten.slice_scatter.default, aten.lift_fresh_copy.default, aten.copy.default}, outer.graph
    assert copies["clone"] == copies["copy_"] == 0, copies


def _returns_fresh_zeros(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.zeros(3)
    return x * 2, z + 1


def test_a_returned_value_of_no_input_is_made_per_call(client: Any) -> None:
    # A result the caller owns: folding it would hand every call the same tensor.
    f = compiled(_returns_fresh_zeros, client)
    _, ones = f(torch.randn(5))
    ones.add_(10.0)
    _, again = f(torch.randn(5))
    torch.testing.assert_close(again, torch.ones(3))
    assert again.data_ptr() != ones.data_ptr()


def _plus_a_fill(x: torch.Tensor) -> torch.Tensor:
    return x + torch.full((5,), 3.0).expand(4, 5)


def test_a_plain_fill_is_left_to_the_part(client: Any) -> None:
    # A fill (seen through views) costs a kiln part nothing; as a buffer it would be read.
    x = torch.randn(4, 5)
    torch.testing.assert_close(compiled(_plus_a_fill, client)(x), _plus_a_fill(x))
    assert kt.stats()["constants"] == 0 and kt.stats()["compiled"] == 1


def _torch_copies(f: Callable[..., Any], *args: Any) -> dict[str, int]:
    """How many pads, clones and copies torch runs in one call of ``f``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        f(*args)
    names = [e.name for e in prof.events()]
    return {k: names.count(f"aten::{k}") for k in ("constant_pad_nd", "clone", "copy_")}


class _Windows(torch.nn.Module):
    """Swin's block around its attention, on [B, H, W, C]: layer norm, a pad up to a multiple
    of the window (zero widths when H and W are multiples already), the window partition
    (view, permute, reshape) before a linear layer and its reverse after it; then, on the
    whole map, a layer norm and another zero-width pad before a linear layer (Swin's last
    stage, where one window covers the map)."""

    def __init__(self, c: int = 16, win: int = 4) -> None:
        super().__init__()
        self.win = win
        self.proj = torch.nn.Linear(c, c, bias=False)
        self.head = torch.nn.Linear(c, c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        k = self.win
        y = F.pad(F.layer_norm(x, (c,)), (0, 0, 0, (k - w % k) % k, 0, (k - h % k) % k))
        y = y.view(b, h // k, k, w // k, k, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, k * k, c)
        y = self.proj(y).view(b, h // k, w // k, k, k, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        x = x + y
        return self.head(F.pad(F.layer_norm(x, (c,)), (0, 0, 0, 0, 0, 0)).view(b, h * w, c))


def test_zero_width_pads_cost_no_copy(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """A pad of zero widths copies nothing: between kiln's parts it joins them (a part reads
    its argument as it is), before a torch op it goes (nothing can tell it from its argument);
    the window partition is written by the part in the order the linear layer reads it."""
    torch.manual_seed(5)
    model = _Windows().eval()
    x = torch.randn(2, 8, 8, 16)
    f = compiled(model, client)
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-5)
        copies = _torch_copies(f, x)
        eager = _torch_copies(model, x)
    assert eager["constant_pad_nd"] == 2 and eager["clone"] >= 2, eager  # what the kiln step no longer runs
    assert copies == {"constant_pad_nd": 0, "clone": 0, "copy_": 0}, copies
    outer, _ = rewrites[0]
    left = [n.target for n in outer.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.constant_pad_nd.default not in left, outer.graph
    assert_kiln_ran(parts=2)


def _pad_twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y = x * 2
    return y, F.pad(y, (0, 0)), F.pad(x, (0, 0, 0, 0)) + 1


def _pad_then_write(x: torch.Tensor) -> torch.Tensor:
    p = F.pad(x, (0, 0))
    x.add_(1)
    return p * 2


def test_a_zero_width_pad_stays_a_tensor_of_its_own_where_that_shows(client: Any) -> None:
    # Returned beside its argument: two tensors, as in eager; an argument written in place
    # after the pad: the pad keeps the value from before the write.
    x = torch.randn(4, 8)
    with torch.no_grad():
        y, p, q = compiled(_pad_twice, client)(x)
    torch.testing.assert_close((y, p, q), _pad_twice(x))
    assert p.data_ptr() != y.data_ptr()
    p.add_(1)
    torch.testing.assert_close(y, x * 2)
    x1, x2 = torch.randn(4, 8), None
    x2 = x1.clone()
    with torch.no_grad():
        got = compiled(_pad_then_write, client)(x1)
    torch.testing.assert_close(got, _pad_then_write(x2))
    torch.testing.assert_close(x1, x2)


@pytest.mark.parametrize("pad, value", [((1, 2), 0.0), ((2, 0, 0, 3), 1.5), ((-1, 2, 1, -2), -3.0),
                                        ((0, 0, 1, 1, 0, 0), 0.0)])
def test_pads_run_in_kiln(client: Any, pad: tuple[int, ...], value: float) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.pad(x * 2, pad, value=value)) + 1

    x = torch.randn(2, 5, 6, 7)
    with torch.no_grad():
        torch.testing.assert_close(compiled(fn, client)(x), fn(x))
    assert_kiln_ran(parts=1)
    (part,) = kt.last_graphs()[-1]["parts"]
    assert "constant_pad_nd.default" in part["ops"], part


def test_common_subexpressions_merge_only_where_it_is_safe() -> None:
    """kiln's CSE pass merges equal pure nodes and keeps apart: a fresh tensor later written in
    place and its twin, random draws, numbers that differ only in type or sign (2 and 2.0,
    0.0 and -0.0), outputs that must stay separate tensors (also when they are items of a
    tuple-valued node), and equal nodes on either side of an in-place write."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.torch.passes import eliminate_common_subexpressions

    def f(x: torch.Tensor, m: torch.Tensor) -> Any:
        pads = F.pad(m, (0, 3)) + F.pad(m, (0, 3))  # one pad
        c, d = x.clone(), x.clone()
        c.add_(1)  # c is written: d stays its own tensor
        r = torch.rand_like(x) + torch.rand_like(x)  # two draws
        nums = (x * 2.0).sum() + (x * 2).sum() + (x * 0.0).sum() + (x * -0.0).sum()
        before = m.exp()
        m.mul_(3)  # an input written in place: exp after it is another value
        after = m.exp()
        return pads, c, d + 0, r, nums, before + after, x.sin(), x.sin(), torch.var_mean(x, 1)[0], torch.var_mean(x, 1)[0].view(3, 1)

    x, m = torch.randn(3, 4), torch.randn(3, 4)
    gm = make_fx(f)(x.clone(), m.clone())
    want = gm(x.clone(), m.clone())
    count = lambda op: sum(1 for n in gm.graph.nodes if n.target == op)  # noqa: E731
    aten = torch.ops.aten
    before = {op: count(op) for op in (aten.constant_pad_nd.default, aten.clone.default, aten.rand_like.default,
                                       aten.mul.Tensor, aten.exp.default, aten.sin.default,
                                       aten.var_mean.correction)}
    removed = eliminate_common_subexpressions(gm)
    after = {op: count(op) for op in before}
    assert removed == 1, gm.code
    assert after[aten.constant_pad_nd.default] == before[aten.constant_pad_nd.default] - 1 == 1
    assert after[aten.clone.default] == before[aten.clone.default] == 2
    assert after[aten.rand_like.default] == 2 and after[aten.exp.default] == 2
    assert after[aten.mul.Tensor] == before[aten.mul.Tensor]  # 2.0, 2, 0.0 and -0.0 stay apart
    assert after[aten.sin.default] == 2  # two outputs: two tensors
    assert after[aten.var_mean.correction] == before[aten.var_mean.correction] == 2  # outputs through a tuple
    got = gm(x.clone(), m.clone())
    for i in (0, 1, 2, 4, 5, 6, 8, 9):
        torch.testing.assert_close(got[i], want[i])


def test_kiln_compiles_without_importing_inductor(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """An inference graph compiles and runs without importing Inductor (torch's own CSE pass
    imports its pattern matcher, which costs a warm start over a second)."""
    code = (
        "import sys, torch, kiln.torch\n"
        "f = torch.compile(lambda x, m: torch.tanh(x + torch.nn.functional.pad(m, (0, 3))) * 2\n"
        "                  + torch.nn.functional.pad(m, (0, 3)), backend='kiln')\n"
        "x, m = torch.randn(4, 11), torch.randn(4, 8)\n"
        "with torch.no_grad():\n"
        "    got = f(x, m)\n"
        "p = torch.nn.functional.pad(m, (0, 3))\n"
        "torch.testing.assert_close(got, torch.tanh(x + p) * 2 + p)\n"
        "s = kiln.torch.stats()\n"
        "assert s['compiled'] >= 1 and s['failed'] == 0, s\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._inductor.') and 'config' not in m))\n"
    )
    out = _python(code, dict(subprocess_env, KILN_CACHE_DIR=str(tmp_path)))
    loaded = out.stdout.strip().splitlines()[-1]
    assert "torch._inductor.pattern_matcher" not in loaded and "torch._inductor.lowering" not in loaded, loaded


def test_weight_standardisation_is_fused_not_left_to_torch(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """A convolution with a standardised weight (NF-Nets, BiT: ``F.batch_norm`` over the weight
    with no running statistics, every forward): the mean and variance per output channel are
    kiln's, no batch norm op is left to torch; outputs and gradients (weight, gain, input) match
    eager."""
    torch.manual_seed(11)

    def conv(x: torch.Tensor, w: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        flat = torch.nn.functional.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                                              momentum=0.0, eps=1e-6)
        std_w = flat.reshape_as(w) * (gain * w[0].numel() ** -0.5)
        return torch.relu(torch.nn.functional.conv2d(x, std_w, padding=1))

    x = torch.randn(2, 5, 9, 9, requires_grad=True)
    w = torch.randn(8, 5, 3, 3, requires_grad=True)
    gain = torch.rand(8, 1, 1, 1).add_(0.5).requires_grad_()
    check_fwd_bwd(conv, [x, w, gain], client, rtol=1e-4, atol=1e-4)
    assert_kiln_ran()
    in_torch = {str(n.target) for outer, _ in rewrites for n in outer.graph.nodes if n.op == "call_function"}
    assert not [t for t in in_torch if "batch_norm" in t], sorted(in_torch)


def test_linear_layers_become_single_linear_calls(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """The torch side's view + transpose + mm/addmm + view of a linear layer becomes one
    ``F.linear`` call (fold_linear), transposes of transposes cancel (fold_views); forward and
    gradients still match eager."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8, bias=False))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8, bias=False))
    ref.load_state_dict(net.state_dict())
    x = torch.randn(2, 5, 16, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    cf = compiled(net, client)
    got, want = cf(x), ref(xr)
    weight = torch.randn(want.shape)
    (got * weight).sum().backward()
    (want * weight).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    forward, backward = rewrites[0][0].graph, rewrites[1][0].graph
    targets = [n.target for n in forward.nodes if n.op == "call_function"]
    assert targets.count(torch.nn.functional.linear) == 2, forward
    assert torch.mm not in targets and torch.addmm not in targets, forward
    # The last layer takes its 3-D input itself: no view to 2-D and back around it (the first
    # one's product feeds the kiln part that adds its bias, in 2-D).
    dims = [n.meta["val"].dim() for n in forward.nodes if n.target is torch.nn.functional.linear]
    assert dims == [2, 3], forward
    # The backward's transposes of transposes (weight gradients) cancel (fold_views).
    permutes = [n for n in backward.nodes if n.op == "call_method" and n.target == "permute"]
    assert not any(p.args[0] in permutes for p in permutes), backward
    assert len(permutes) <= 2, backward
    assert_kiln_ran(parts=2)  # one forward, one backward


def test_linear_layers_on_a_run_time_length_take_their_n_d_input(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """At a symbolic sequence length, a linear layer whose result a kiln part reads in 3-D
    still takes its 3-D input itself: the views to 2-D and back go, as at a static length
    (their sizes are compared as expressions, with no guard: a third length reuses the
    graph), and the results match eager."""
    torch.manual_seed(4)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8, bias=False),
                              torch.nn.LayerNorm(8))
    cf = compiled(net, client)
    with torch.no_grad():
        for t in (5, 7, 9):
            x = torch.randn(2, t, 16)
            torch.testing.assert_close(cf(x), net(x), rtol=1e-5, atol=1e-5)
    assert len(rewrites) == 2, "the third length recompiled: a guard was added"
    graph = rewrites[1][0].graph
    linears = [n for n in graph.nodes if n.target is torch.nn.functional.linear]
    assert len(linears) == 2, graph
    # The second layer (no bias, read by the layer norm's part) runs on the 3-D value.
    last = linears[-1]
    assert last.meta["val"].dim() == 3, graph
    assert not (last.args[0].op == "call_method" and last.args[0].target in ("view", "reshape")), graph
    (user,) = last.users
    assert user.op == "call_module", graph  # the kiln part, with no reshape between
    assert_kiln_ran()


def test_a_negative_run_time_size_leaves_its_node_to_torch_not_the_graph(client: Any) -> None:
    """XLNet's relative positions, ``arange(t, -t, -1)``: at a symbolic length the graph holds the
    run-time size -t, which no tensor dimension can carry. The arange stays in torch and the
    rest of the graph compiles (it used to fail whole: "negative dimension")."""

    def rel(x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        pos = torch.arange(t, -t, -1.0)
        return torch.tanh(x.sum(-1, keepdim=True) * pos[None, :t]) + 1

    cf = compiled(rel, client)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kt.KilnFallbackWarning)
        for t in (6, 9, 11):
            x = torch.randn(2, t, 4)
            torch.testing.assert_close(cf(x), rel(x), rtol=1e-5, atol=1e-5)
    assert_kiln_ran(graphs=2)


def test_more_run_time_sizes_than_a_part_takes_cut_the_part_not_fail_it(client: Any) -> None:
    """Four tensors of four run-time lengths (Sequencer's reshapes after Dynamo made each stage's
    sizes dynamic): a kiln graph takes at most three distinct symbolic sizes. The four scalings
    are cut into two parts (three lengths, one) rather than one part the daemon refuses, and the
    concatenation of all four stays in torch; nothing falls back."""

    def four(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.tanh(a) * 2, torch.tanh(b) * 3, torch.tanh(c) * 4, torch.tanh(d) * 5])

    cf = compiled(four, client, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kt.KilnFallbackWarning)
        for n in (5, 9):
            args = [torch.randn(n + k) for k in range(4)]
            torch.testing.assert_close(cf(*args), four(*args), rtol=1e-6, atol=1e-6)
    assert_kiln_ran(parts=2)


def _python(code: str, env: dict[str, str]) -> "subprocess.CompletedProcess[str]":
    """Runs ``code`` in a fresh interpreter (kiln.torch's module state starts empty); asserts it exits 0."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_native_runner_build_failure_leaves_the_python_path(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """A daemon that cannot build the runner (here: none listening) leaves it unloaded, with the
    reason, and the build is not retried without end (parts then keep their Python path). An
    empty local artifact folder: one holding the runner would serve it without the daemon."""
    code = (
        "import kiln, torch\n"
        "from kiln.torch import native\n"
        "native.RETRY_AFTER_S = 0.0\n"
        "c = kiln.Client('127.0.0.1:1', max_attempts=1, timeout=1)\n"
        "for _ in range(5):\n"
        "    native.start(c)\n"
        "    native.wait(120)\n"
        "print(native.RUNNER is None, native.ERROR is not None, native._failures)\n"
    )
    out = _python(code, dict(subprocess_env, KILN_CACHE_DIR=str(tmp_path)))
    assert out.stdout.split()[-3:] == ["True", "True", str(native.MAX_ATTEMPTS)], out.stdout + out.stderr[-2000:]


def test_native_runner_build_retries_at_once_through_another_client(subprocess_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """A build that failed through one client (closed while it ran, say: a ``with`` block of
    kiln.jit calls) does not hold back the build another client starts next; the same client
    waits out RETRY_AFTER_S."""
    code = (
        "import kiln, torch\n"
        "from kiln.torch import native\n"
        "a = kiln.Client('127.0.0.1:1', max_attempts=1, timeout=1)\n"
        "b = kiln.Client('127.0.0.1:1', max_attempts=1, timeout=1)\n"
        "for c in (a, b, b, a):\n"
        "    native.start(c)\n"
        "    native.wait(120)\n"
        "print(native._failures)\n"
    )
    out = _python(code, dict(subprocess_env, KILN_CACHE_DIR=str(tmp_path)))
    assert out.stdout.split()[-1] == "3", out.stdout + out.stderr[-2000:]


def test_native_runner_build_through_a_closed_client_is_no_failure(subprocess_env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    """A build whose client its caller closed (the end of a ``with kiln.Client(...)`` block
    while the build ran) says nothing of the daemon: it counts as no failure and warns of
    nothing, and the next start() builds again."""
    code = (
        "import kiln, torch\n"
        "from kiln.torch import native\n"
        "a = kiln.Client('127.0.0.1:1', max_attempts=1, timeout=1)\n"
        "a.close()\n"
        "for _ in range(2):\n"
        "    native.start(a)\n"
        "    native.wait(120)\n"
        "print(native._failures, native.ERROR is not None)\n"
    )
    out = _python(code, dict(subprocess_env, KILN_CACHE_DIR=str(tmp_path)))
    assert out.stdout.split()[-2:] == ["0", "True"], out.stdout + out.stderr[-2000:]
    assert "runner is unavailable" not in out.stderr, out.stderr[-2000:]


def _softmax_scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * w + 1.0, dim=-1) * 3.0


def test_max_autotune_times_each_part_once_and_a_second_compile_times_nothing(client: Any, monkeypatch: Any) -> None:
    """mode="max-autotune": each part's first call times its variants (kiln.autotune) and the
    results match eager; a fresh compile of the same model finds the tuning in kilnd and
    times nothing."""
    A = importlib.import_module("kiln.autotune")  # the package exports a function of that name

    x, w = torch.randn(96, 53), torch.randn(53)
    cf = torch.compile(_softmax_scale, backend=kt.backend(client=client, mode="max-autotune"))
    for _ in range(3):
        torch.testing.assert_close(cf(x, w), _softmax_scale(x, w), rtol=1e-5, atol=1e-6)
    s = kt.stats()
    parts = [p for g in kt.last_graphs() for p in g["parts"] if p["kiln"]]
    assert parts and s["tuned"] == len(parts), (s, parts)
    assert s["failed"] == 0 and s["eager_calls"] == 0, s

    torch._dynamo.reset()
    kt.reset_stats()
    kt.clear_memo()

    def no_timing(*a: Any, **k: Any) -> Any:
        raise AssertionError("timed again")

    monkeypatch.setattr(A, "_tune", no_timing)
    cf = torch.compile(_softmax_scale, backend=kt.backend(client=client, mode="max-autotune"))
    torch.testing.assert_close(cf(x, w), _softmax_scale(x, w), rtol=1e-5, atol=1e-6)
    s = kt.stats()
    assert s["tuned"] == len(parts) and s["eager_calls"] == 0, s


def test_max_autotune_leaves_parts_with_symbolic_sizes_on_the_default(client: Any) -> None:
    """A part compiled for symbolic sizes serves every size with one kernel: a variant timed
    at one size could be far slower at another, so such parts are not tuned."""
    cf = torch.compile(_softmax_scale, backend="kiln", dynamic=True, options={"client": client, "autotune": True})
    for rows, cols in [(96, 53), (40, 131), (7, 9)]:
        x, w = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(cf(x, w), _softmax_scale(x, w), rtol=1e-5, atol=1e-6)
    s = kt.stats()
    assert s["tuned"] == 0 and s["kernel_calls"] >= 3 and s["eager_calls"] == 0, s


def test_max_autotune_runs_the_winning_variant(client: Any, monkeypatch: Any) -> None:
    """When another variant wins, the part swaps its kernels for the winner's: later calls
    (through the native runner too) run that variant and still match eager."""
    A = importlib.import_module("kiln.autotune")  # the package exports a function of that name

    chosen: list[Any] = []

    def last(timings: list[Any]) -> Any:  # the last distinct variant wins, whatever its time
        chosen.append(timings)
        return timings[-1]

    monkeypatch.setattr(A, "_pick", last)

    def col_norm(x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(0)) * torch.rsqrt(x.var(0, unbiased=False) + 1e-5)

    x = torch.randn(64, 600)  # column statistics: every CPU knob (tile width, unroll, split) applies
    cf = torch.compile(col_norm, backend="kiln", options={"client": client, "autotune": True})
    for _ in range(4):
        torch.testing.assert_close(cf(x), col_norm(x), rtol=1e-4, atol=1e-5)
    s = kt.stats()
    assert chosen and len(chosen[0]) > 1, chosen
    assert s["tuned"] >= 1 and s["retuned"] >= 1, s
    handles = {p["handle"] for g in kt.last_graphs() for p in g["parts"] if p["kiln"]}
    assert chosen[0][-1].handle in handles and chosen[0][0].handle not in handles, (handles, chosen)
    assert s["native_calls"] >= 1 and s["eager_calls"] == 0, s


def test_tuner_keeps_the_default_unless_a_variant_is_faster_both_ways() -> None:
    """A variant that queues faster in a loop but keeps the device busier per call (or the
    reverse) does not replace the default; one faster both ways by the 3% margin does. The
    margin is written out here, not read from kiln.autotune."""
    from kiln.autotune import VariantTiming, _pick

    d = VariantTiming(0, "a", 1.0, 1.0)
    loop_only = VariantTiming(1, "b", 0.5, 1.2)
    call_only = VariantTiming(2, "c", 1.1, 0.5)
    assert _pick([d, loop_only, call_only]) is d
    both = VariantTiming(3, "d", 0.8, 0.94)  # 6% faster per call, 20% in a loop
    assert _pick([d, loop_only, both, call_only]) is both
    assert _pick([d, VariantTiming(4, "e", 0.985, 0.5)]) is d  # 1.5% faster in a loop: within the margin
    assert _pick([d, VariantTiming(5, "f", 0.975, 0.5)]) is d  # 2.5%: within the margin too
    assert _pick([d, VariantTiming(6, "g", 0.96, 0.5)]).variant == 6  # 4% both ways: past it
    host = [VariantTiming(0, "a", 1.0), VariantTiming(1, "b", 0.9)]  # CPU: no latencies
    assert _pick(host) is host[1]
    assert _pick([host[0], VariantTiming(1, "b", 0.98)]) is host[0]  # 2% on the CPU: the default stays


def test_max_autotune_tunes_parts_whose_inputs_come_in_another_layout(client: Any) -> None:
    """The LLTM cell's parts read slices of the gate matrix (declared strides); tuning passes
    each argument in the layout the part was compiled for, as its calls do, and every part
    of the forward and backward graphs is tuned without a warning."""
    args = [a.requires_grad_() for a in E.make_lltm(batch=8, features=16, state=32)]
    ref = clone_args(args)
    cf = torch.compile(E.lltm_cell, backend="kiln", options={"client": client, "autotune": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = cf(*args)
        sum(g.sum() * (i + 1) for i, g in enumerate(as_tuple(got))).backward()
    want = E.lltm_cell(*ref)
    sum(w.sum() * (i + 1) for i, w in enumerate(as_tuple(want))).backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, r in zip(args, ref):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-4, atol=1e-5)
    s = kt.stats()
    parts = [p for g in kt.last_graphs() for p in g["parts"] if p["kiln"]]
    assert parts and s["tuned"] == len(parts), (s, parts)


def test_views_of_static_graphs_are_made_from_their_traced_layout(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """The torch side's views (the attention heads' reshapes and permutes around the linear
    layers) become reinterpreted_view calls; the encoder's forward and gradients match eager,
    and a view whose input arrives in a layout the trace did not foresee runs the view op."""
    from kiln.torch import passes

    check_fwd_bwd(E.encoder_block, E.make_encoder(), client, rtol=1e-4, atol=1e-4)
    graphs = [gm for gm, _ in rewrites]
    made = [n for g in graphs for n in g.graph.nodes if n.target is passes.reinterpreted_view]
    left = [n for g in graphs for n in g.graph.nodes if n.op == "call_method" and n.target in ("view", "permute")]
    assert made, [g.code for g in graphs]
    assert len(made) > len(left), (len(made), len(left))
    # The guard: strides other than the traced ones take the op itself.
    x = torch.arange(24.0).reshape(2, 3, 4)
    got = passes.reinterpreted_view(x, (2, 4, 3), (12, 1, 4), 0, (12, 4, 1), "permute", ([0, 2, 1],))
    torch.testing.assert_close(got, x.permute(0, 2, 1))
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, other strides
    got = passes.reinterpreted_view(xt, (2, 4, 3), (12, 1, 4), 0, (12, 4, 1), "permute", ([0, 2, 1],))
    torch.testing.assert_close(got, x.permute(0, 2, 1))
    tail = torch.arange(30.0)[6:].view(2, 3, 4)  # a nonzero storage offset: the delta is relative
    got = passes.reinterpreted_view(tail, (3, 4), (4, 1), 12, (12, 4, 1), "select", (0, 1))
    torch.testing.assert_close(got, tail.select(0, 1))


def test_chained_views_fold_into_one_reinterpreted_view() -> None:
    """A reinterpreted view of a reinterpreted view read by nothing else becomes one call (the
    offsets add up); with other strides than traced, the chain's ops run one by one."""
    from kiln.torch import passes

    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(30)
    tail = g.call_method("__getitem__", (x, slice(6, None)))  # not a view method: stays
    tail.meta["val"] = torch.empty(30)[6:]
    v = g.call_method("view", (tail, 2, 3, 4))
    v.meta["val"] = torch.empty(30)[6:].view(2, 3, 4)
    p = g.call_method("permute", (v, [0, 2, 1]))
    p.meta["val"] = v.meta["val"].permute(0, 2, 1)
    s = g.call_method("select", (p, 0, 1))
    s.meta["val"] = p.meta["val"].select(0, 1)
    g.output((g.call_method("add", (s, 1.0)),))  # (a view that is a graph output keeps its op)
    assert passes.fold_reinterpret(g) == 3 + 2  # three views rewritten, two links folded
    made = [n for n in g.nodes if n.target is passes.reinterpreted_view]
    assert len(made) == 1 and made[0].args[0] is tail, g
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    xs = torch.arange(30.0)
    (got,) = gm(xs)
    torch.testing.assert_close(got, xs[6:].view(2, 3, 4).permute(0, 2, 1).select(0, 1) + 1)
    # The fallback: a tensor in other strides takes the view ops themselves.
    other = torch.arange(24.0).view(2, 3, 4)
    got = passes.reinterpreted_view(other.transpose(0, 1).contiguous().transpose(0, 1), *made[0].args[1:])
    torch.testing.assert_close(got, other.permute(0, 2, 1).select(0, 1))


def test_long_kernels_are_launched_before_side_work() -> None:
    """launch_long_kernels_first: a matrix product moves ahead of work that only a later node
    reads (a mask's preparation), with its own inputs before it; nodes that draw random
    numbers keep their order and place; the results are the same."""
    from kiln.torch import passes

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = torch.gt(x, 0.5) * 2.0  # side work nothing long reads
        h = torch.relu(x) + 1.0  # the product's input
        y = torch.mm(h, w)
        d1 = torch.ops.aten.native_dropout.default(y, 0.5, True)[0]
        side = torch.sum(d1) * 3.0
        z = torch.mm(d1, w)
        d2 = torch.ops.aten.native_dropout.default(z, 0.5, True)[0]
        return y + mask, side, d2

    gm = torch.fx.symbolic_trace(f)
    before = [n.name for n in gm.graph.nodes]
    moved = passes.launch_long_kernels_first(gm.graph)
    gm.recompile()
    order = [n.name for n in gm.graph.nodes]
    assert moved > 0 and sorted(order) == sorted(before)
    assert order.index("mm") < order.index("gt") < order.index("native_dropout_default"), order
    assert order.index("relu") < order.index("mm")
    # Between the two dropouts: the second product goes before the side sum.
    assert order.index("mm_1") < order.index("sum_1") < order.index("native_dropout_default_1"), order
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    torch.manual_seed(3)
    want = f(x, w)
    torch.manual_seed(3)
    got = gm(x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_long_reductions_over_small_outputs_add_their_bias_apart(monkeypatch: Any) -> None:
    """An f32 CUDA addmm read only by torch (a linear layer before dropout) keeps its bias
    epilogue, except a long reduction over an output that does not fill the GPU with 128x128
    tiles: that one becomes mm plus an add (cuBLAS splits the reduction of a plain GEMM only)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.torch.passes import unfuse_addmm_epilogues

    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: Props())

    def graph(m: int, k: int, n: int) -> torch.fx.Graph:
        g = torch.fx.Graph()
        with FakeTensorMode(allow_non_fake_inputs=True):
            vals = [torch.empty(n, device="cuda"), torch.empty(m, k, device="cuda"), torch.empty(k, n, device="cuda")]
            out = torch.empty(m, n, device="cuda")
        args = []
        for name, v in zip(("bias", "a", "b"), vals):
            p = g.placeholder(name)
            p.meta["val"] = v
            args.append(p)
        mm = g.call_function(torch.ops.aten.addmm.default, tuple(args))
        mm.meta["val"] = out
        drop = g.call_function(torch.ops.aten.native_dropout.default, (mm, 0.1, True))
        g.output((drop,))
        return g

    long_k = graph(2048, 3072, 768)  # BERT-base's 3072->768 product: 96 tiles, K = 4N
    assert unfuse_addmm_epilogues(long_k) == 1
    assert [n.target for n in long_k.nodes if n.op == "call_function"][:2] == [torch.ops.aten.mm.default,
                                                                               torch.ops.aten.add.Tensor]
    for shape in ((2048, 768, 768), (2048, 768, 3072), (8192, 3072, 768)):  # short K; tiles fill the GPU
        assert unfuse_addmm_epilogues(graph(*shape)) == 0, shape


def test_convolution_bias_moves_into_the_part_that_reads_it(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """A convolution's bias joins the kiln part that reads the convolution next (torch would
    add it in a kernel of its own): the convolutions torch runs take no bias, the results
    match eager. One whose output the graph returns keeps its bias."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.torch.passes import unfuse_convolution_bias

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GELU(),
                              torch.nn.Conv2d(8, 8, 1), torch.nn.LayerNorm([8, 6, 6])).eval()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        want = net(x)
        got = compiled(net, client)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    convs = [n for gm, _ in rewrites for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert len(convs) == 2 and all(n.args[2] is None for n in convs), [n.args[2] for n in convs]

    def graph(returned: bool) -> torch.fx.Graph:
        g = torch.fx.Graph()
        with FakeTensorMode(allow_non_fake_inputs=True):
            vals = [torch.empty(4, 3, 8, 8, device="cuda"), torch.empty(5, 3, 3, 3, device="cuda"),
                    torch.empty(5, device="cuda")]
            out = torch.empty(4, 5, 6, 6, device="cuda")
        args = []
        for name, v in zip(("x", "w", "b"), vals):
            p = g.placeholder(name)
            p.meta["val"] = v
            args.append(p)
        conv = g.call_function(torch.ops.aten.convolution.default,
                               (*args, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
        conv.meta["val"] = out
        act = g.call_function(torch.ops.aten.relu.default, (conv,))
        act.meta["val"] = out
        g.output((act, conv) if returned else (act,))
        return g

    g = graph(returned=False)
    assert unfuse_convolution_bias(g) == 1
    targets = [n.target for n in g.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.convolution.default, torch.ops.aten.view.default,
                       torch.ops.aten.add.Tensor, torch.ops.aten.relu.default], targets
    view = next(n for n in g.nodes if n.target is torch.ops.aten.view.default)
    assert view.args[1] == [-1, 1, 1] and tuple(view.meta["val"].shape) == (5, 1, 1)
    assert unfuse_convolution_bias(graph(returned=True)) == 0


def test_contiguous_clones_on_the_torch_side_copy_only_what_is_not_contiguous() -> None:
    """fold_clones: a clone read by plain ops becomes ``contiguous()`` (no copy of a contiguous
    tensor, a copy of any other); clones that are graph outputs, that an in-place op writes,
    or of a tensor an in-place op writes keep their op."""
    from kiln.torch import passes

    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 3)

    def node(op: str, target: Any, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
        n = g.create_node(op, target, args, kwargs or {})
        n.meta["val"] = torch.empty(4, 3)
        return n

    fmt = {"memory_format": torch.contiguous_format}
    plain = node("call_method", "clone", (x,), fmt)  # read by a view only: folded
    read = node("call_method", "view", (plain, 12))
    out = node("call_method", "clone", (x,))  # a graph output
    written = node("call_method", "clone", (x,))  # an in-place op writes it
    node("call_method", "add_", (written, 1.0))
    kept = node("call_method", "clone", (x,))  # traced as a transposed layout (preserve_format)
    kept.meta["val"] = torch.empty(3, 4).t()
    read_kept = node("call_method", "reshape", (kept, 12))
    g.output((read, out, written, read_kept))
    assert passes.fold_clones(g) == 1
    assert plain.target == "contiguous" and out.target == "clone" and written.target == "clone"
    assert kept.target == "clone"
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    xs = torch.arange(12.0).view(4, 3)
    r, o, w, _ = gm(xs)
    assert r.data_ptr() == xs.data_ptr()  # contiguous already: no copy
    assert o.data_ptr() != xs.data_ptr() and w.data_ptr() != xs.data_ptr()
    torch.testing.assert_close(w, xs + 1)
    torch.testing.assert_close(xs, torch.arange(12.0).view(4, 3))  # the input untouched
    xt = torch.arange(12.0).view(3, 4).t()  # not contiguous: copied
    r, _, _, _ = gm(xt)
    assert r.data_ptr() != xt.data_ptr()
    torch.testing.assert_close(r, xt.reshape(12))


def test_channels_last_clones_on_the_torch_side_copy_only_what_is_not_channels_last() -> None:
    """fold_clones in the channels-last format: a clone traced as a channels-last tensor
    becomes ``contiguous(memory_format=channels_last)``, which hands a channels-last argument
    back uncopied and copies any other into that layout; a clone traced in no dense format
    keeps its op."""
    from kiln.torch import passes

    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
    cl = g.call_method("clone", (x,))
    cl.meta["val"] = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
    odd = g.call_method("clone", (x,))
    odd.meta["val"] = torch.empty(2, 4, 5, 3).permute(0, 3, 2, 1)  # dense, in no named format
    g.output((g.call_method("permute", (cl, 0, 2, 3, 1)), g.call_method("relu", (odd,))))
    assert passes.fold_clones(g) == 1
    assert cl.target == "contiguous" and cl.kwargs == {"memory_format": torch.channels_last}
    assert odd.target == "clone"
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    xs = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    r, _ = gm(xs)
    assert r.data_ptr() == xs.data_ptr()  # channels-last already: no copy
    torch.testing.assert_close(r, xs.permute(0, 2, 3, 1))
    plain = torch.randn(2, 3, 4, 5)  # contiguous: copied into channels-last
    r, _ = gm(plain)
    assert r.data_ptr() != plain.data_ptr() and r.is_contiguous()
    torch.testing.assert_close(r, plain.permute(0, 2, 3, 1))


def test_a_view_of_a_part_argument_is_made_on_the_torch_side(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """A view of a graph input that a kiln part reads and a torch op (a matrix product) reads
    too is made by torch from the input (free), not returned by the part (a copy kernel): the
    rewritten graph feeds the product from the input through views only, and results match
    eager."""

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.view(-1, 8)
        return torch.exp(y * 2).sum(0), y @ w

    x, w = torch.randn(4, 6, 8), torch.randn(8, 5)
    got = compiled(f, client)(x, w)
    for a, b in zip(got, f(x, w)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ((g, _),) = rewrites
    mms = [n for n in g.graph.nodes if n.target in (torch.mm, torch.ops.aten.mm.default, F.linear)]
    assert mms, g.code
    src = mms[0].args[0]
    while src.op != "placeholder":
        assert src.target is not operator.getitem, g.code  # read back from the part: a copy
        src = src.args[0]
    assert kt.stats()["failed"] == 0


def test_large_transposing_copies_run_in_kiln(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """A large contiguous copy of a transposed tensor (an attention block's heads before their
    matrix product) is a kiln part even when only torch reads it; a small one stays torch's."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous().view(-1, x.shape[1]) @ w

    for shape, in_kiln in (((4, 64, 512), True), ((2, 8, 16), False)):
        rewrites.clear()
        x, w = torch.randn(*shape), torch.randn(shape[1], 3)
        torch.testing.assert_close(compiled(f, client)(x, w), f(x, w), rtol=1e-5, atol=1e-5)
        ((gm, parts),) = rewrites
        torch_side = [n for n in gm.graph.nodes if n.op == "call_method" and n.target in ("clone", "contiguous")]
        kiln_side = [p for p in parts if "clone.default" in p.ops]
        assert (len(kiln_side), len(torch_side)) == ((1, 0) if in_kiln else (0, 1)), (shape, gm.code)
    assert kt.stats()["failed"] == 0


class _Lookup(torch.nn.Module):
    """An embedding prologue as BERT's: word, position and token-type tables read at ids,
    positions sliced from a buffer, a token-type buffer gathered at those positions, then the
    sum's layer_norm; index_select and gather as a model writes them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.word = torch.nn.Embedding(50, 16)
        self.pos = torch.nn.Embedding(32, 16)
        self.kind = torch.nn.Embedding(2, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.register_buffer("position_ids", torch.arange(32).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, 32, dtype=torch.long), persistent=False)

    def forward(self, ids: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = ids.shape[1]
        positions = self.position_ids[:, :t]
        # (as BERT spells it: a [1, t] gather grown to the batch, t symbolic from the second length)
        kinds = torch.gather(self.token_type_ids, 1, positions).expand(ids.shape[0], t)
        h = self.word(ids) + self.pos(positions) + self.kind(kinds)
        return self.norm(h), torch.index_select(x, 1, rows) * 2.0, torch.gather(x, 0, cols) + 1.0


def test_fold_stays_one_torch_op(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """Patches taken with F.unfold, weighted, and summed back with F.fold (VOLO's outlook
    attention): outputs and gradients match eager, and the fold runs as torch's col2im, not as
    the index_put with accumulation its decomposition makes (a sort and a serial scatter on
    CUDA, ~17x slower than Inductor's kernel for volo_d1)."""

    def outlook(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        u = F.unfold(x, 3, padding=1, stride=2) * w
        return torch.relu(F.fold(u, (14, 14), 3, padding=1, stride=2)) + 1

    torch.manual_seed(4)
    x, w = torch.randn(4, 8, 14, 14, requires_grad=True), torch.randn(1, 72, 1, requires_grad=True)
    check_fwd_bwd(outlook, [x, w], client, rtol=1e-4, atol=1e-5)
    assert_kiln_ran()
    forward = rewrites[0][0].code
    assert "col2im" in forward and "index_put" not in forward, forward


def test_a_compiled_optimizer_step_fuses_whole(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """``torch.compile(opt.step)`` for AdamW (foreach): torch's graph computes lerp and addcmul
    with Inductor's ``prims.fma``, which kiln lowers, so the whole update is one kiln part with
    only the write-backs into parameters and state left to torch; three steps match eager
    AdamW's parameters."""

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16), torch.nn.LayerNorm(16))
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        return m

    ref, mine = model(), model()
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(mine.parameters(), lr=1e-2)
    step = torch.compile(opt.step, backend="kiln", options={"client": client, "records": False})
    for _ in range(3):
        opt_ref.step()
        step()
    for a, b in zip(mine.parameters(), ref.parameters()):  # a few ulps: eager's lerp fuses the multiply-add
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    code = rewrites[0][0].code
    assert "fma" not in code and code.count("self.kiln_part_") == 1, code
    assert_kiln_ran(parts=1)


def test_masked_assignments_fuse_as_where(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """An index_put with one boolean mask over the leading dimensions and a single value (the
    functional form of ``x[mask] = v`` and ``x[mask] += v``) is a where in kiln's part, its
    neighbours fused with it; a value cast to x's dtype (a float64 constant into float32). An
    index_put with integer indices stays torch's op. Values match eager, gradients too."""

    def f(x: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x.sin() * 2
        a = torch.ops.aten.index_put.default(a, [a > 1.5], torch.tensor(1.5, dtype=torch.float64))
        b = torch.ops.aten.index_put.default(x.cos(), [rows], torch.tensor(-2.0), True)
        c = torch.ops.aten.index_put.default(x * 3, [idx], torch.tensor(7.0))
        return a + b, c - 1

    x = torch.randn(16, 8, requires_grad=True)
    rows = torch.rand(16) > 0.5
    idx = torch.tensor([3, 0, 9])
    check_fwd_bwd(lambda x_: f(x_, rows, idx), [x], client, rtol=1e-5, atol=1e-5)
    code = rewrites[0][0].code
    assert code.count("aten.index_put") == 1 and "aten.where" not in code, code  # the integer one
    assert_kiln_ran(parts=3)  # the forward's two, around the integer index_put, and the backward's


def test_embedding_lookups_and_gathers_run_in_kiln(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """embedding, index_select and gather lower to kiln's gather: the whole prologue (three
    lookups, the token-type gather, the adds and layer_norm) is one kiln part with no torch
    node before it; outputs and gradients (the tables', through torch's embedding backward)
    match eager, at two lengths (the second symbolic) with no fallback."""
    model = _Lookup()
    x = torch.randn(6, 9, requires_grad=True)
    rows = torch.tensor([8, 0, 3, 3])
    cols = torch.randint(0, 6, (4, 9))
    for t in (7, 5, 11):
        ids = torch.randint(0, 50, (3, t))
        check_fwd_bwd(lambda i, x_: model(i, x_, rows, cols), [ids, x], client, rtol=1e-4, atol=1e-4)
    s = assert_kiln_ran(parts=6)
    assert s["eager_calls"] == 0, s
    code = rewrites[0][0].code
    for op in ("embedding", "gather(", "index_select"):
        assert f"torch.{op}" not in code and f"aten.{op}" not in code, code
    # The tables' gradients came through: the kiln forward kept the graph differentiable.
    model.zero_grad()
    ids = torch.randint(0, 50, (3, 7))
    out = compiled(lambda i: model(i, x, rows, cols)[0], client)(ids)
    out.sum().backward()
    assert model.word.weight.grad is not None and model.word.weight.grad.abs().sum() > 0


def test_embedding_gradient_by_index_add_matches_torch() -> None:
    """The CUDA decomposition of an embedding's backward (a zero table and index_add) gives
    torch's gradient: repeated ids accumulate, the padding row stays zero, any id shape."""
    from kiln.torch import decompositions

    torch.manual_seed(4)
    ids = torch.tensor([[3, 0, 3, 7], [7, 7, 1, 0]])
    grad = torch.randn(2, 4, 5, dtype=torch.float64)
    for padding_idx in (-1, 0, 7):
        want = torch.ops.aten.embedding_dense_backward.default(grad, ids, 9, padding_idx, False)
        torch.testing.assert_close(decompositions.embedding_grad(grad, ids, 9, padding_idx), want)
    # The decomposition itself leaves CPU tensors (and frequency scaling) to torch's op.
    assert decompositions._embedding_backward_by_atomic_adds(grad, ids, 9, -1, False) is NotImplemented


def test_advanced_indexing_runs_in_kiln(client: Any, rewrites: list[tuple[Any, Any]]) -> None:
    """x[i, j] with broadcasting index tensors (negative positions too), x[:, i] and x[i]
    lower to kiln gathers; BERT's mask idiom (``mask[arange(B)[:, None, None, None], kv]``)
    included; results and gradients equal eager's; no aten.index is left to torch."""
    x = torch.randn(5, 7, 3, requires_grad=True)
    i = torch.tensor([[0], [4], [-1]])
    j = torch.tensor([6, -7, 2, 3])
    mask = torch.randint(0, 2, (4, 9)).float()

    def f(x_: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kv = torch.arange(9)[None, None, None, :]
        b = torch.arange(4)[:, None, None, None]
        return x_[i, j] * 2.0, x_[:, j] + 1.0, x_[j.abs() % 5] - 1.0, m[b, kv] * 3.0

    check_fwd_bwd(f, [x, mask], client, rtol=1e-5, atol=1e-5)
    assert_kiln_ran(parts=3)
    code = "".join(gm.code for gm, _ in rewrites)
    assert "aten.index.Tensor" not in code, code


def test_arange_and_advanced_indexing_at_run_time_sizes_run_in_kiln(client: Any,
                                                                   rewrites: list[tuple[Any, Any]]) -> None:
    """At symbolic sizes (``dynamic=True``): ``arange`` of a run-time length becomes an iota
    shaped like an argument's dimension, and advanced indexing with several index tensors one
    gather per tensor (BERT's attention-mask idiom, and a 3-D tensor indexed on its last two
    dimensions with broadcasting, negative positions included). Results equal eager's at every
    size; neither op is left to torch, and no size recompiles."""
    def f(m: torch.Tensor, x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = m.shape[1]
        kv = torch.arange(n)[None, None, None, :]
        b = torch.arange(m.shape[0])[:, None, None, None]
        return m[b, kv] * 2.0, x[:, i, j] + 1.0, (torch.arange(n) * 3 + 1).float()

    cf = torch.compile(f, backend="kiln", options={"client": client}, dynamic=True)
    for bs, t in [(4, 9), (3, 5), (6, 17)]:
        m = torch.randn(bs, t)
        x = torch.randn(bs, t, t)
        i = torch.randint(-t, t, (bs, 1))
        j = torch.randint(-t, t, (t,))
        for g_, w_ in zip(cf(m, x, i, j), f(m, x, i, j)):
            torch.testing.assert_close(g_, w_, rtol=1e-6, atol=1e-6)
    assert_kiln_ran(parts=1)
    assert kt.stats()["graphs"] == 1, kt.stats()
    code = "".join(gm.code for gm, _ in rewrites)
    assert "aten.index.Tensor" not in code and "aten.arange" not in code, code


def test_index_add_into_a_fresh_table_adds_in_place() -> None:
    """fold_fresh_index_add: index_add of a zero table nothing else reads becomes index_add_
    on it (no copy); one whose table is an input or read elsewhere keeps the functional op;
    the results are the same."""
    from kiln.torch import passes

    aten = torch.ops.aten
    g = torch.fx.Graph()
    ids, rows, other = g.placeholder("ids"), g.placeholder("rows"), g.placeholder("other")
    zeros = g.call_function(aten.zeros.default, ([6, 3],))
    added = g.call_function(aten.index_add.default, (zeros, 0, ids, rows))
    kept = g.call_function(aten.index_add.default, (other, 0, ids, rows))  # an input: not written
    shared = g.call_function(aten.zeros.default, ([6, 3],))
    read_twice = g.call_function(aten.index_add.default, (shared, 0, ids, rows))
    g.output((added, kept, read_twice, shared))
    assert passes.fold_fresh_index_add(g) == 1
    assert added.target == "index_add_" and kept.target is aten.index_add.default
    assert read_twice.target is aten.index_add.default
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    i, r, o = torch.tensor([1, 4, 1]), torch.randn(3, 3), torch.randn(6, 3)
    a, k, t, z = gm(i, r, o.clone())
    want = torch.zeros(6, 3).index_add(0, i, r)
    torch.testing.assert_close(a, want)
    torch.testing.assert_close(k, o.index_add(0, i, r))
    torch.testing.assert_close(t, want)
    assert not z.any()


@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, stride=1, padding=1, count_include_pad=False),  # PoolFormer's token mixer
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, stride=2, divisor_override=5),
])
def test_average_pooling_runs_in_kiln(client: Any, kw: dict) -> None:
    """avg_pool2d in a kiln part with the subtraction after it, as PoolFormer uses it: padding,
    strides, ceil mode's windows past the edge and each of torch's divisors, against float64
    eager on an odd-sized channels-last input."""
    x = torch.randn(2, 5, 9, 11, dtype=torch.float64).contiguous(memory_format=torch.channels_last)

    def f(t: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.avg_pool2d(t.sin(), **kw)
        return y - y.mean()

    want = f(x)
    got = torch.compile(f, backend="kiln", options={"client": client})(x.float())
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    s = assert_kiln_ran(parts=1)
    assert s["eager_calls"] == 0, kt.last_graphs()
