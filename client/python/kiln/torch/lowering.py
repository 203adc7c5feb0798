"""ATen FX nodes to kiln graph nodes: the mapping table.

AOTAutograd hands the backend graphs of core ATen ops (after decompositions). Each entry of the
table maps a torch ``OpOverload`` (or a whole ``OpOverloadPacket``) to a lowering function::

    @register_lowering(aten.add.Tensor, aten.add.Scalar)
    def _add(ctx, x, other, alpha=1): ...

A lowering receives the node's arguments with every tensor argument replaced by a kiln
:class:`~kiln.builder.Value` (Python numbers, lists, dtypes and None arrive as they are) and
returns a Value, or a tuple of Values for an op with several outputs. It emits nodes through
``ctx.b`` (a :class:`kiln.GraphBuilder`). It raises :class:`Unsupported` for a call it cannot
express (an attribute value it does not handle, a dtype kiln lacks...): the node then runs in
torch.

Torch and NumPy promote types differently (a Python float next to an int tensor gives float32
in torch, float64 in NumPy; 0-d tensors are weak in torch), so lowerings never rely on the
builder's promotion: they cast operands to the dtype torch computes in, which the node's
FakeTensor (``node.meta["val"]``) tells. :func:`lower_node` then checks the result against that
FakeTensor and reconciles dtype and shape, so a lowering that disagrees with torch is caught
when the graph is partitioned, not at run time.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.fx

from ..builder import GraphBuilder, Value
from ..dtypes import is_integer as dt_is_integer
from ..strides import memory_order
from . import rng as _rng  # noqa: F401  (defines torch.ops.kiln.uniform, lowered below)

aten = torch.ops.aten
prims = torch.ops.prims

Lowered = Union[Value, tuple[Value, ...]]
LoweringFn = Callable[..., Lowered]

#: torch dtypes kiln computes on, with their kiln names.
TORCH_TO_KILN: dict[torch.dtype, str] = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "bool",
}
KILN_TO_TORCH: dict[str, torch.dtype] = {v: k for k, v in TORCH_TO_KILN.items()}


class Unsupported(Exception):
    """A node (or one call of it) that kiln cannot take; it runs in torch instead."""


def kiln_dtype(dtype: torch.dtype) -> str:
    """The kiln name of a torch dtype; :class:`Unsupported` for complex, float8, uint16..."""
    try:
        return TORCH_TO_KILN[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype}") from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a kiln dtype name."""
    return KILN_TO_TORCH[name]


# ---------------------------------------------------------------------------------- registry

_LOWERINGS: dict[Any, LoweringFn] = {}


def register_lowering(*ops: Any) -> Callable[[LoweringFn], LoweringFn]:
    """Decorator: ``fn`` lowers each of ``ops`` (OpOverloads, packets for every overload, or an
    overload's qualified name such as ``"prims::fma"`` for an op that exists only once the
    torch module defining it is imported: Inductor's prims, which torch.compile's optimizer
    graphs use, and whose module would cost a second at every import of the lowerings).

    A later registration of the same op replaces the earlier one, which lets a program extend
    or override the table.
    """

    def deco(fn: LoweringFn) -> LoweringFn:
        for op in ops:
            _LOWERINGS[op] = fn
        return fn

    return deco


def unregister_lowering(*ops: Any) -> None:
    """Removes ``ops`` from the table (their nodes run in torch from then on)."""
    for op in ops:
        _LOWERINGS.pop(op, None)


def find_lowering(target: Any) -> Optional[LoweringFn]:
    """The lowering of an FX call_function target, or None."""
    fn = _LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = _LOWERINGS.get(target.overloadpacket) or _LOWERINGS.get(target.name())
    return fn


# ---------------------------------------------------------------------------------- context

def node_meta(node: Any) -> Any:
    """The FakeTensor (or tuple of them, or SymInt...) an FX node produces, or None."""
    if not isinstance(node, torch.fx.Node):
        return None
    meta = node.meta
    return meta.get("val", meta.get("example_value"))


def _is_static_size(d: Any) -> bool:
    """An int, or a SymInt that torch has specialised to a number (a guard fixed it: its
    expression is a constant)."""
    if isinstance(d, int):
        return True
    if isinstance(d, torch.SymInt):
        try:
            return bool(d.node.expr.is_number)
        except Exception:
            return False
    return False


def is_static_tensor(v: Any) -> bool:
    """Whether ``v`` is a strided tensor with concrete sizes and strides."""
    if not isinstance(v, torch.Tensor) or v.layout != torch.strided:
        return False
    try:
        return all(_is_static_size(d) for d in v.shape) and all(_is_static_size(s) for s in v.stride())
    except Exception:  # sparse or otherwise unusual tensors
        return False


def size_hint(d: Any) -> int:
    """A dimension's value: the number itself, or a symbolic size's example value (read
    without installing a guard, so the graph stays dynamic)."""
    if isinstance(d, torch.SymInt):
        hint = d.node.hint
        if hint is None:
            raise Unsupported(f"symbolic size {d.node.expr} has no example value")
        return int(hint)
    return int(d)


def example_shape(v: torch.Tensor) -> tuple[int, ...]:
    """The shape of ``v`` with symbolic sizes at their example values."""
    return tuple(size_hint(d) for d in v.shape)


def is_symbolic_tensor(v: Any) -> bool:
    """Whether ``v`` is a strided CPU or CUDA tensor some of whose sizes are symbolic (torch's
    dynamic shapes): kiln compiles those with symbolic dimensions."""
    if not isinstance(v, torch.Tensor) or v.layout != torch.strided or v.device.type not in ("cpu", "cuda"):
        return False
    try:
        return any(not _is_static_size(d) for d in v.shape)
    except Exception:
        return False


def size_expr(d: Any) -> Any:
    """The sympy expression of a size (an Integer for a static one)."""
    import sympy

    return d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(int(d))


def is_contiguous_symbolic(v: torch.Tensor) -> bool:
    """Row-major contiguity of a tensor with symbolic sizes, decided on the expressions (no
    guard): each stride equals the product of the sizes after it, size-1 dimensions aside."""
    return _dense_in_order(v, range(v.dim()))


def symbolic_memory_order(v: torch.Tensor) -> Optional[tuple[int, ...]]:
    """The memory order (outermost to innermost, as :func:`kiln.strides.memory_order`) of a
    tensor with symbolic sizes whose layout is dense, or None when it is not: the order is read
    from the example strides and then proven on the expressions, so it holds at every size (an
    NHWC-shaped result stored in NCHW order has strides ``(C*H*W, W, 1, H*W)``: order 0, 3, 1, 2)."""
    order = memory_order(example_shape(v), tuple(size_hint(s) for s in v.stride()))
    return order if order is not None and _dense_in_order(v, order) else None


def _dense_in_order(v: torch.Tensor, order: Any) -> bool:
    """Whether each stride of ``v``, taken innermost first in ``order``, is the product of the
    sizes inside it (size-1 dimensions aside), as expressions."""
    import sympy

    shape, strides = v.shape, v.stride()
    expect = sympy.Integer(1)
    for d in reversed(list(order)):
        de = size_expr(shape[d])
        if de != 1 and sympy.expand(size_expr(strides[d]) - expect) != 0:
            return False
        expect = expect * de
    return True


class LoweringContext:
    """What a lowering sees besides its arguments: the builder and the node's torch types."""

    def __init__(self, builder: GraphBuilder, node: torch.fx.Node,
                 symbol_dims: Optional[dict[Any, tuple[Value, int]]] = None) -> None:
        self.b = builder
        self.node = node
        self.meta = node_meta(node)
        # A symbolic size's expression -> an argument of the part with that size and its dimension.
        self.symbol_dims = symbol_dims or {}

    def extent(self, size: "SymArg") -> Value:
        """A 1-D Value whose length is the symbolic ``size`` (values not meant to be read): an
        argument of the part that has that size as a dimension, read at position 0 of each other
        dimension (a gather, which a symbolic dimension allows where a slice would not) and
        those dimensions dropped. Nothing reads it: it only carries the size."""
        try:
            v, d = self.symbol_dims[size.expr]
        except KeyError:
            raise Unsupported(f"no argument of the part has the size {size.expr}") from None
        for e in range(v.ndim):
            if e != d and v.shape[e] != 1:
                v = self.b.gather(v, self.b.full((1,) * v.ndim, 0, "i64"), e)
        others = [e for e in range(v.ndim) if e != d]
        return self.b.squeeze(v, others) if others else v

    def require_static_axis(self, d: int, what: str, arg: int = 0) -> None:
        """Refuses (Unsupported) ``what`` along dimension ``d`` of argument ``arg`` when that
        dimension has a symbolic size: kiln slices a symbolic axis only whole or reversed (a
        slice's bounds are clamped to the size, so its length is an expression of it that no
        argument carries), and a position read at the example size is wrong at another. The
        node then runs in torch beside the part instead of failing the part's compile."""
        m = node_meta(self.node.args[arg]) if len(self.node.args) > arg else None
        if isinstance(m, torch.Tensor) and 0 <= d < m.dim() and not _is_static_size(m.shape[d]):
            raise Unsupported(f"{what} along dimension {d} of symbolic size {m.shape[d]}")

    # -- the node's output as torch types it

    @property
    def out_dtype(self) -> str:
        """The kiln dtype of the node's (single) output."""
        if not isinstance(self.meta, torch.Tensor):
            raise Unsupported("the node has no single tensor output")
        return kiln_dtype(self.meta.dtype)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The output's sizes as numbers. A symbolic size is refused rather than read: reading
        it (``int()``) would make torch install a guard on its value and specialise the whole
        graph to this size (a recompile for every new one)."""
        if not isinstance(self.meta, torch.Tensor):
            raise Unsupported("the node has no single tensor output")
        if not all(_is_static_size(d) for d in self.meta.shape):
            raise Unsupported(f"the output has symbolic sizes {tuple(self.meta.shape)}")
        return tuple(int(d) for d in self.meta.shape)

    @property
    def out_symbolic(self) -> bool:
        """Whether the (single) output has a symbolic size."""
        return isinstance(self.meta, torch.Tensor) and not all(_is_static_size(d) for d in self.meta.shape)

    def out_meta(self, i: int) -> torch.Tensor:
        """The FakeTensor of output ``i`` of a multi-output node."""
        if not isinstance(self.meta, (tuple, list)) or not isinstance(self.meta[i], torch.Tensor):
            raise Unsupported(f"the node has no tensor output {i}")
        return self.meta[i]

    def output_used(self, i: int) -> bool:
        """Whether some getitem user of this multi-output node reads output ``i``."""
        return any(u.target is operator.getitem and u.args[1] == i for u in self.node.users)

    # -- operands

    def value(self, x: Any, dtype: str) -> Value:
        """``x`` (a Value or a Python number) as a Value of kiln dtype ``dtype``."""
        if isinstance(x, Value):
            return x if x.dtype == dtype else self.b.cast(x, dtype)
        if isinstance(x, (bool, int, float)):
            try:
                return self.b.constant(x, dtype)
            except (OverflowError, ValueError, TypeError) as e:
                raise Unsupported(f"scalar {x!r} as {dtype}: {e}") from None
        raise Unsupported(f"operand of type {type(x).__name__}")

    def cast(self, v: Value, dtype: str) -> Value:
        return v if v.dtype == dtype else self.b.cast(v, dtype)

    def result_type(self, x: Any, other: Any) -> str:
        """The dtype torch promotes two operands (Values or Python numbers) to.

        Torch's rules depend on each operand's dtype, on whether it is a 0-d tensor, and on
        Python numbers' kinds; meta tensors of the right dtype and rank stand in for Values.
        """

        def stand_in(v: Any) -> Any:
            if isinstance(v, Value):
                shape = () if v.ndim == 0 else (0,)
                return torch.empty(shape, dtype=torch_dtype(v.dtype), device="meta")
            if isinstance(v, (bool, int, float)):
                return v
            raise Unsupported(f"operand of type {type(v).__name__}")

        a, b = stand_in(x), stand_in(other)
        if not (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
            raise Unsupported("no tensor operand")
        return kiln_dtype(torch.result_type(a, b))


# ---------------------------------------------------------------------------------- lowering

class SymArg:
    """A size argument computed by torch at run time (a SymInt node of a dynamic-shape graph,
    such as a view's target size): only shape lowerings accept it, as "the size that this
    dimension has" (see :func:`_view`, :func:`_expand`); every other lowering refuses it."""

    __slots__ = ("value",)

    def __init__(self, value: torch.SymInt) -> None:
        self.value = value

    @property
    def expr(self) -> Any:
        return self.value.node.expr

    def __repr__(self) -> str:
        return f"SymArg({self.expr})"


#: Ops whose size arguments may be SymArgs.
_SYM_SIZE_OPS: frozenset[Any] = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
    aten.expand.default, aten.expand_copy.default,
    aten.arange.start_step, aten.arange.start, aten.arange.default,
})


def is_size_node(n: Any) -> bool:
    """Whether ``n`` is an FX node producing a symbolic integer (a size), not a tensor."""
    return isinstance(n, torch.fx.Node) and isinstance(node_meta(n), torch.SymInt)


def _map_args(a: Any, env: Callable[[torch.fx.Node], Any], sizes_ok: bool = False) -> Any:
    if isinstance(a, torch.fx.Node):
        if sizes_ok and is_size_node(a):
            return SymArg(node_meta(a))
        return env(a)
    if isinstance(a, (list, tuple)):
        return type(a)(_map_args(x, env, sizes_ok) for x in a)
    if isinstance(a, dict):
        return {k: _map_args(v, env, sizes_ok) for k, v in a.items()}
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unsupported("symbolic scalar argument")
    return a


def lower_node(b: GraphBuilder, node: torch.fx.Node, env: Callable[[torch.fx.Node], Any],
               symbol_dims: Optional[dict[Any, tuple[Value, int]]] = None) -> Any:
    """Emits ``node`` into ``b``; ``env`` maps an FX node to its Value (or tuple of Values);
    ``symbol_dims`` maps a symbolic size's expression to an argument of the part and the
    dimension that has it (:meth:`LoweringContext.extent`).

    Returns what the node produces in kiln terms, checked against its FakeTensor: dtype
    differences are cast away, shape differences with the same element count become a
    reshape, anything else raises :class:`Unsupported`.
    """
    if node.op != "call_function":
        raise Unsupported(f"{node.op} node")
    if node.target is operator.getitem:
        src, idx = node.args
        produced = env(src)
        if not isinstance(produced, tuple) or not isinstance(idx, int):
            raise Unsupported("getitem of a non-tuple")
        return produced[idx]
    fn = find_lowering(node.target)
    if fn is None:
        raise Unsupported(f"no lowering for {node.target}")
    meta = node_meta(node)
    metas = meta if isinstance(meta, (tuple, list)) else [meta]
    for m in metas:
        if not (is_static_tensor(m) or is_symbolic_tensor(m)):
            raise Unsupported("an output is not a tensor of static shape")
        kiln_dtype(m.dtype)
    sizes_ok = node.target in _SYM_SIZE_OPS
    args = _map_args(node.args, env, sizes_ok)
    kwargs = _map_args(dict(node.kwargs), env, sizes_ok)
    # Schemas name the first operand "self" or "input"; lowerings take it positionally.
    for first in ("self", "input"):
        if first in kwargs:
            args = (kwargs.pop(first),) + tuple(args)
    ctx = LoweringContext(b, node, symbol_dims)
    with b.name_scope(node.name):
        try:
            out = fn(ctx, *args, **kwargs)
        except (Unsupported, TypeError, ValueError, KeyError, OverflowError, IndexError) as e:
            if isinstance(e, Unsupported):
                raise
            raise Unsupported(f"{node.target}: {type(e).__name__}: {e}") from None
        if isinstance(meta, (tuple, list)):
            if not isinstance(out, tuple) or len(out) != len(meta):
                raise Unsupported(f"{node.target}: lowered to {type(out).__name__}, expected {len(meta)} outputs")
            return tuple(_conform(b, v, m) if v is not None else None for v, m in zip(out, meta))
        if not isinstance(out, Value):
            raise Unsupported(f"{node.target}: lowered to {type(out).__name__}")
        return _conform(b, out, meta)


def _conform(b: GraphBuilder, v: Value, m: torch.Tensor) -> Value:
    want_dtype = kiln_dtype(m.dtype)
    want_shape = example_shape(m)
    if v.dtype != want_dtype:
        v = b.cast(v, want_dtype)
    if v.shape != want_shape:
        if math.prod(v.shape) != math.prod(want_shape):
            raise Unsupported(f"lowered shape {v.shape}, torch says {want_shape}")
        target = list(want_shape)
        symbolic = [i for i, d in enumerate(m.shape) if isinstance(d, torch.SymInt)]
        if len(symbolic) > 1:
            raise Unsupported(f"a reshape to {tuple(m.shape)}: more than one symbolic size")
        if symbolic:  # the one size kiln infers, so that the reshape holds for every size
            target[symbolic[0]] = -1
        v = b.reshape(v, target)
    return v


# ---------------------------------------------------------------------------------- helpers

def _axes(dim: Any, rank: int) -> Optional[list[int]]:
    """Torch's reduction dims: None or empty means every axis."""
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    dims = list(dim)
    if not dims:
        return None
    return [d % rank if rank else 0 for d in dims]


def _norm_dim(d: int, rank: int) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise Unsupported(f"dim {d} for rank {rank}")
    return d % max(rank, 1)


def _check_plain_alloc(**kwargs: Any) -> None:
    """Allocation attributes of factory ops that kiln cannot honour."""
    if kwargs.get("layout") not in (None, torch.strided):
        raise Unsupported("non-strided layout")
    if kwargs.get("pin_memory"):
        raise Unsupported("pinned memory")


# ---------------------------------------------------------------------------------- elementwise

_UNARY_FLOAT = {
    aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log", aten.log2: "log2",
    aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.sin: "sin", aten.cos: "cos",
    aten.tan: "tan", aten.tanh: "tanh", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan",
    aten.sinh: "sinh", aten.cosh: "cosh", aten.sigmoid: "sigmoid", aten.erf: "erf",
    aten.reciprocal: "reciprocal",
}
_UNARY_SAME = {
    aten.neg: "neg", aten.abs: "abs", aten.sign: "sign", aten.floor: "floor", aten.ceil: "ceil",
    aten.trunc: "trunc", aten.bitwise_not: "bitwise_not",
}
_UNARY_BOOL = {aten.logical_not: "logical_not", aten.isnan: "isnan", aten.isinf: "isinf"}


def _unary_float(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Value) -> Value:
        # Integer inputs compute in the float type torch chose (float32 by default).
        return ctx.b.unary(kop, ctx.value(x, ctx.out_dtype))

    return lower


def _unary_same(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Value) -> Value:
        return ctx.b.unary(kop, ctx.value(x, ctx.out_dtype))

    return lower


def _unary_bool(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Value) -> Value:
        return ctx.b.unary(kop, x)

    return lower


for _op, _k in _UNARY_FLOAT.items():
    register_lowering(_op.default)(_unary_float(_k))
for _op, _k in _UNARY_SAME.items():
    register_lowering(_op.default)(_unary_same(_k))
for _op, _k in _UNARY_BOOL.items():
    register_lowering(_op.default)(_unary_bool(_k))


@register_lowering(aten.round.default)
def _round(ctx: LoweringContext, x: Value) -> Value:
    return ctx.b.round(ctx.value(x, ctx.out_dtype))


@register_lowering(aten.round.decimals)
def _round_decimals(ctx: LoweringContext, x: Value, decimals: int = 0) -> Value:
    if decimals != 0:
        raise Unsupported("round with decimals")
    return ctx.b.round(ctx.value(x, ctx.out_dtype))


@register_lowering(aten.log10.default)
def _log10(ctx: LoweringContext, x: Value) -> Value:
    dt = ctx.out_dtype
    return ctx.b.mul(ctx.b.log(ctx.value(x, dt)), ctx.value(1.0 / math.log(10.0), dt))


@register_lowering(aten.relu.default)
def _relu(ctx: LoweringContext, x: Value) -> Value:
    return ctx.b.relu(ctx.value(x, ctx.out_dtype))


@register_lowering(aten.silu.default)
def _silu(ctx: LoweringContext, x: Value) -> Value:
    return ctx.b.silu(ctx.value(x, ctx.out_dtype))


@register_lowering(aten.gelu.default)
def _gelu(ctx: LoweringContext, x: Value, approximate: str = "none") -> Value:
    return ctx.b.gelu(ctx.value(x, ctx.out_dtype), approximate=approximate)


@register_lowering(aten.elu.default)
def _elu(ctx: LoweringContext, x: Value, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Value:
    dt = ctx.out_dtype
    x = ctx.value(x, dt)
    if scale == 1 and input_scale == 1:
        return ctx.b.elu(x, alpha=float(alpha))
    # SELU-style parameters: scale * (x > 0 ? x : alpha * (exp(x * input_scale) - 1)).
    neg = ctx.b.mul(ctx.b.expm1(ctx.b.mul(x, ctx.value(float(input_scale), dt))), ctx.value(float(alpha), dt))
    return ctx.b.mul(ctx.b.where(ctx.b.gt(x, ctx.value(0.0, dt)), x, neg), ctx.value(float(scale), dt))


@register_lowering(aten.leaky_relu.default)
def _leaky_relu(ctx: LoweringContext, x: Value, negative_slope: float = 0.01) -> Value:
    return ctx.b.leaky_relu(ctx.value(x, ctx.out_dtype), negative_slope=float(negative_slope))


@register_lowering(aten.hardtanh.default)
def _hardtanh(ctx: LoweringContext, x: Value, min_val: float = -1.0, max_val: float = 1.0) -> Value:
    return ctx.b.clamp(ctx.value(x, ctx.out_dtype), float(min_val), float(max_val))


@register_lowering(aten.softplus.default)
def _softplus(ctx: LoweringContext, x: Value, beta: float = 1.0, threshold: float = 20.0) -> Value:
    # torch: x * beta > threshold ? x : log1p(exp(x * beta)) / beta.
    dt = ctx.out_dtype
    x = ctx.value(x, dt)
    bx = ctx.b.mul(x, ctx.value(float(beta), dt))
    soft = ctx.b.div(ctx.b.log1p(ctx.b.exp(bx)), ctx.value(float(beta), dt))
    return ctx.b.where(ctx.b.gt(bx, ctx.value(float(threshold), dt)), x, soft)


def _binary_arith(kop: str, has_alpha: bool = False) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Any, other: Any, alpha: Any = 1) -> Value:
        dt = ctx.out_dtype
        a, o = ctx.value(x, dt), ctx.value(other, dt)
        if has_alpha and alpha != 1:
            o = ctx.b.mul(o, ctx.value(alpha, dt))
        return ctx.b.binary(kop, a, o)

    return lower


register_lowering(aten.add.Tensor, aten.add.Scalar)(_binary_arith("add", has_alpha=True))
register_lowering(aten.sub.Tensor, aten.sub.Scalar)(_binary_arith("sub", has_alpha=True))
register_lowering(aten.mul.Tensor, aten.mul.Scalar)(_binary_arith("mul"))
register_lowering(aten.div.Tensor, aten.div.Scalar)(_binary_arith("div"))
register_lowering(aten.maximum.default)(_binary_arith("maximum"))
register_lowering(aten.minimum.default)(_binary_arith("minimum"))
register_lowering(aten.atan2.default)(_binary_arith("atan2"))
register_lowering(aten.remainder.Tensor, aten.remainder.Scalar)(_binary_arith("remainder"))
register_lowering(aten.floor_divide.default)(_binary_arith("floordiv"))
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _packet = getattr(aten, _name)
    register_lowering(_packet.Tensor, _packet.Scalar)(_binary_arith(_name))


@register_lowering("prims::fma")
def _fma(ctx: LoweringContext, a: Any, b: Any, c: Any) -> Value:
    """``prims.fma(a, b, c)`` (torch.compile's optimizers: lerp and addcmul as in CUDA's
    kernels): ``a * b + c``, as torch computes it outside Inductor (the CUDA compilers
    contract the pair into one fused multiply-add, as CUDA's own lerp has it)."""
    dt = ctx.out_dtype
    return ctx.b.add(ctx.b.mul(ctx.value(a, dt), ctx.value(b, dt)), ctx.value(c, dt))


@register_lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx: LoweringContext, x: Any, other: Any, alpha: Any = 1) -> Value:
    dt = ctx.out_dtype
    a, o = ctx.value(x, dt), ctx.value(other, dt)
    if alpha != 1:
        a = ctx.b.mul(a, ctx.value(alpha, dt))
    return ctx.b.sub(o, a)


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx: LoweringContext, x: Any, other: Any, rounding_mode: Optional[str] = None) -> Value:
    dt = ctx.out_dtype
    a, o = ctx.value(x, dt), ctx.value(other, dt)
    if rounding_mode is None:
        return ctx.b.div(a, o)
    if rounding_mode == "floor":
        return ctx.b.floordiv(a, o)
    if rounding_mode == "trunc":
        if dt in ("f16", "bf16", "f32", "f64"):
            return ctx.b.trunc(ctx.b.div(a, o))
        # Integers: floor division, plus one where the signs differ and it was not exact.
        q = ctx.b.floordiv(a, o)
        inexact = ctx.b.ne(ctx.b.remainder(a, o), ctx.value(0, dt))
        signs = ctx.b.logical_xor(ctx.b.lt(a, ctx.value(0, dt)), ctx.b.lt(o, ctx.value(0, dt)))
        return ctx.b.where(ctx.b.logical_and(inexact, signs), ctx.b.add(q, ctx.value(1, dt)), q)
    raise Unsupported(f"rounding_mode {rounding_mode!r}")


@register_lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(ctx: LoweringContext, x: Value, exponent: Any) -> Value:
    dt = ctx.out_dtype
    x = ctx.value(x, dt)
    # Small integral exponents as multiplications: exact, and what torch computes too.
    if exponent == 1:
        return x
    if exponent == 2:
        return ctx.b.mul(x, x)
    if exponent == 3:
        return ctx.b.mul(ctx.b.mul(x, x), x)
    if dt in ("f16", "bf16", "f32", "f64"):
        if exponent == 0.5:
            return ctx.b.sqrt(x)
        if exponent == -0.5:
            return ctx.b.rsqrt(x)
        if exponent == -1:
            return ctx.b.reciprocal(x)
    return ctx.b.pow(x, ctx.value(exponent, dt))


@register_lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx: LoweringContext, x: Any, exponent: Any) -> Value:
    dt = ctx.out_dtype
    return ctx.b.pow(ctx.value(x, dt), ctx.value(exponent, dt))


def _compare(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Any, other: Any) -> Value:
        ct = ctx.result_type(x, other)
        return ctx.b.binary(kop, ctx.value(x, ct), ctx.value(other, ct))

    return lower


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _packet = getattr(aten, _name)
    register_lowering(_packet.Tensor, _packet.Scalar)(_compare(_name))


def _logical(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Any, other: Any) -> Value:
        # Logical ops read "non-zero" in each operand's own type.
        a = ctx.b.cast(x, "bool") if isinstance(x, Value) and x.dtype != "bool" else ctx.value(x, "bool")
        o = ctx.b.cast(other, "bool") if isinstance(other, Value) and other.dtype != "bool" else ctx.value(other, "bool")
        return ctx.b.binary(kop, a, o)

    return lower


for _name in ("logical_and", "logical_or", "logical_xor"):
    register_lowering(getattr(aten, _name).default)(_logical(_name))


@register_lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: LoweringContext, condition: Value, x: Any, other: Any) -> Value:
    dt = ctx.out_dtype
    return ctx.b.where(ctx.value(condition, "bool"), ctx.value(x, dt), ctx.value(other, dt))


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: LoweringContext, x: Value, mask: Value, value: Any) -> Value:
    dt = ctx.out_dtype
    return ctx.b.where(ctx.value(mask, "bool"), ctx.value(value, dt), ctx.value(x, dt))


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx: LoweringContext, x: Value, min: Any = None, max: Any = None) -> Value:
    dt = ctx.out_dtype
    v = ctx.value(x, dt)
    if isinstance(min, Value) or isinstance(max, Value):
        if min is not None:
            v = ctx.b.maximum(v, ctx.value(min, dt))
        if max is not None:
            v = ctx.b.minimum(v, ctx.value(max, dt))
        return v
    if min is None and max is None:
        return v
    return ctx.b.clamp(v, None if min is None else float(min), None if max is None else float(max))


@register_lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx: LoweringContext, x: Value, min: Any) -> Value:
    return _clamp(ctx, x, min=min)


@register_lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx: LoweringContext, x: Value, max: Any) -> Value:
    return _clamp(ctx, x, max=max)


# ---------------------------------------------------------------------------------- conversions

@register_lowering(aten._to_copy.default)
def _to_copy(ctx: LoweringContext, x: Value, dtype: Optional[torch.dtype] = None, layout: Any = None,
             device: Any = None, pin_memory: Any = None, non_blocking: bool = False,
             memory_format: Any = None) -> Value:
    _check_plain_alloc(layout=layout, pin_memory=pin_memory)
    src = node_meta(ctx.node.args[0]) if ctx.node.args else None
    if device is not None and src is not None and torch.device(device) != src.device:
        raise Unsupported("a copy to another device")
    return ctx.cast(x, ctx.out_dtype)


@register_lowering(prims.convert_element_type.default)
def _convert_element_type(ctx: LoweringContext, x: Value, dtype: torch.dtype) -> Value:
    return ctx.cast(x, kiln_dtype(dtype))


@register_lowering(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def _identity(ctx: LoweringContext, x: Value, memory_format: Any = None) -> Value:
    return x


@register_lowering(aten.copy.default)
def _copy(ctx: LoweringContext, x: Value, src: Value, non_blocking: bool = False) -> Value:
    v = ctx.cast(src, x.dtype)
    return v if v.shape == x.shape else ctx.b.broadcast_to(v, x.shape)


# ---------------------------------------------------------------------------------- sources

def _full(ctx: LoweringContext, value: Any, like: Any = None) -> Value:
    """``value`` in the output's shape. A symbolic output shape cannot be written as a ``full``
    node's attribute; when the op copies the shape of a tensor (``ones_like``, ``fill``...),
    the constant is spread over that tensor's shape by an elementwise select whose branches
    are equal, which follows the tensor's symbols (its condition is folded into the fused
    kernel's loop; NaNs select the same constant)."""
    if not isinstance(value, (bool, int, float)):
        raise Unsupported("fill value is not a number")
    if ctx.out_symbolic and isinstance(like, Value) and like.shape == example_shape(ctx.meta):
        c = ctx.value(value, ctx.out_dtype)
        return ctx.b.where(ctx.b.eq(like, like), c, c)
    return ctx.b.full(ctx.out_shape, float(value), ctx.out_dtype)


@register_lowering(aten.full.default)
def _full_op(ctx: LoweringContext, size: Sequence[int], fill_value: Any, **kw: Any) -> Value:
    _check_plain_alloc(**kw)
    return _full(ctx, fill_value)


@register_lowering(aten.full_like.default)
def _full_like(ctx: LoweringContext, x: Value, fill_value: Any, **kw: Any) -> Value:
    _check_plain_alloc(**kw)
    return _full(ctx, fill_value, x)


@register_lowering(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default)
def _zeros(ctx: LoweringContext, *args: Any, **kw: Any) -> Value:
    _check_plain_alloc(**kw)
    return _full(ctx, 0, args[0] if ctx.node.target is aten.zeros_like.default and args else None)


@register_lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(ctx: LoweringContext, *args: Any, **kw: Any) -> Value:
    _check_plain_alloc(**kw)
    return _full(ctx, 1, args[0] if ctx.node.target is aten.ones_like.default and args else None)


@register_lowering(aten.scalar_tensor.default)
def _scalar_tensor(ctx: LoweringContext, s: Any, **kw: Any) -> Value:
    _check_plain_alloc(**kw)
    return _full(ctx, s)


@register_lowering(aten.fill.Scalar)
def _fill(ctx: LoweringContext, x: Value, value: Any) -> Value:
    return _full(ctx, value, x)


@register_lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx: LoweringContext, *args: Any, **kw: Any) -> Value:
    _check_plain_alloc(**kw)
    if any(isinstance(a, SymArg) for a in args):
        # arange(n) or arange(0, n) of a run-time n: an iota shaped like an argument's dimension.
        end = args[-1] if len(args) == 1 or (len(args) == 2 and args[0] == 0) else None
        if not isinstance(end, SymArg) or end.expr.is_number:
            raise Unsupported("arange with run-time bounds other than arange(n)")
        like = ctx.extent(end)
        dt = ctx.out_dtype
        return ctx.cast(ctx.b.iota(like.shape, 0, "i64" if dt not in ("f16", "bf16", "f32", "f64") else dt, like=like), dt)
    nums = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if len(nums) != len(args):
        raise Unsupported("arange bounds are not numbers")
    start, step = 0, 1
    if len(nums) == 1:
        (end,) = nums
    elif len(nums) == 2:
        start, end = nums
    else:
        start, end, step = nums[:3]
    dt = ctx.out_dtype
    (n,) = ctx.out_shape
    i = ctx.b.iota((n,), 0, "i64" if dt not in ("f16", "bf16", "f32", "f64") else dt)
    v = i
    if step != 1:
        v = ctx.b.mul(v, ctx.value(step, v.dtype))
    if start != 0:
        v = ctx.b.add(v, ctx.value(start, v.dtype))
    return ctx.cast(v, dt)


# ---------------------------------------------------------------------------------- layout

def _static_or_sym(d: Any) -> Any:
    """A size argument as an int when it is one (or a SymArg torch fixed to a number), else
    the SymArg itself."""
    if isinstance(d, SymArg):
        return int(d.expr) if d.expr.is_number else d
    if isinstance(d, bool) or not isinstance(d, int):
        raise Unsupported(f"size argument {d!r}")
    return d


@register_lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def _view(ctx: LoweringContext, x: Value, size: Sequence[Any]) -> Value:
    """A reshape. In a dynamic-shape graph one target size may be symbolic (computed by torch
    at run time): kiln infers it, as -1, from the element count, which holds at every size."""
    dims = [_static_or_sym(d) for d in size]
    sym = [i for i, d in enumerate(dims) if isinstance(d, SymArg)]
    if len(sym) > 1 or (sym and -1 in dims):
        raise Unsupported(f"a reshape to {list(size)}: more than one size known only at run time")
    if sym:
        # kiln's shape inference treats each symbolic size of the argument as an opaque
        # symbol: -1 is inferable when the argument's static sizes are a multiple of the
        # target's ([2*s, 64] -> [2, s, 64] is not: kiln sees s0 / 2).
        arg = ctx.node.args[0] if ctx.node.args else None
        x_meta = node_meta(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(x_meta, torch.Tensor):
            raise Unsupported("a reshape to a run-time size of an argument without a FakeTensor")
        static_in = math.prod(int(d) for d in x_meta.shape if _is_static_size(d))
        static_out = math.prod(d for d in dims if isinstance(d, int) and d != -1)
        if static_out == 0 or static_in % static_out:
            raise Unsupported(f"a reshape of {tuple(x_meta.shape)} to {list(size)}: kiln cannot infer the run-time size")
        dims[sym[0]] = -1
        return ctx.b.reshape(x, dims)
    shape = tuple(dims)
    return x if shape == x.shape else ctx.b.reshape(x, shape)


@register_lowering(aten.expand.default, aten.expand_copy.default)
def _expand(ctx: LoweringContext, x: Value, size: Sequence[Any], implicit: bool = False) -> Value:
    """A broadcast. A symbolic target size is accepted where it keeps a dimension of ``x``
    that has that same symbolic size (torch's FakeTensor of the argument says so); growing a
    size-1 dimension to a run-time size has no static spelling and stays in torch."""
    lead = len(size) - x.ndim
    if lead < 0:
        raise Unsupported("expand to a lower rank")
    arg = ctx.node.args[0] if ctx.node.args else None
    x_meta = node_meta(arg) if isinstance(arg, torch.fx.Node) else None
    shape = []
    kept_symbolic = False
    for i, d in enumerate(size):
        d = _static_or_sym(d)
        if isinstance(d, SymArg):
            src = x_meta.shape[i - lead] if isinstance(x_meta, torch.Tensor) and i >= lead else None
            if not isinstance(src, torch.SymInt) or src.node.expr != d.expr:
                raise Unsupported(f"expand to the run-time size {d.expr}")
            shape.append(x.shape[i - lead])
            kept_symbolic = True
        else:
            if d == -1 and i >= lead and isinstance(x_meta, torch.Tensor) and not _is_static_size(x_meta.shape[i - lead]):
                kept_symbolic = True
            shape.append(x.shape[i - lead] if d == -1 else d)
    shape_t = tuple(shape)
    if shape_t == x.shape:
        return x
    if kept_symbolic:
        # broadcast_to spells its target in numbers, which a run-time size is not: the static
        # dimensions that grow come from broadcasting against a condition of those sizes
        # instead (``where(True, x, x)``), and the symbolic ones stay x's own.
        grow = tuple(t if i < lead or x.shape[i - lead] != t else 1 for i, t in enumerate(shape_t))
        return ctx.b.where(ctx.b.full(grow, 1, "bool"), x, x)
    return ctx.b.broadcast_to(x, shape_t)


@register_lowering(aten.permute.default, aten.permute_copy.default)
def _permute(ctx: LoweringContext, x: Value, dims: Sequence[int]) -> Value:
    d = [_norm_dim(int(a), x.ndim) for a in dims]
    return x if d == list(range(x.ndim)) else ctx.b.permute(x, d)


@register_lowering(aten.t.default)
def _t(ctx: LoweringContext, x: Value) -> Value:
    return x if x.ndim < 2 else ctx.b.permute(x, [1, 0])


@register_lowering(aten.transpose.int)
def _transpose(ctx: LoweringContext, x: Value, dim0: int, dim1: int) -> Value:
    d0, d1 = _norm_dim(dim0, x.ndim), _norm_dim(dim1, x.ndim)
    if d0 == d1 or x.ndim < 2:
        return x
    dims = list(range(x.ndim))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return ctx.b.permute(x, dims)


@register_lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def _unsqueeze(ctx: LoweringContext, x: Value, dim: int) -> Value:
    return ctx.b.unsqueeze(x, [_norm_dim(dim, x.ndim + 1)])


@register_lowering(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.squeeze_copy.dims)
def _squeeze(ctx: LoweringContext, x: Value, dim: Any = None) -> Value:
    if x.ndim == 0:
        return x
    if dim is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        axes = sorted({_norm_dim(d, x.ndim) for d in dims if x.shape[_norm_dim(d, x.ndim)] == 1})
    return ctx.b.squeeze(x, axes) if axes else x


@register_lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(ctx: LoweringContext, x: Value, dim: int = 0, start: Optional[int] = None,
           end: Optional[int] = None, step: int = 1) -> Value:
    if x.ndim == 0:
        raise Unsupported("slice of a 0-d tensor")
    d = _norm_dim(dim, x.ndim)
    size = x.shape[d]
    if step <= 0:
        raise Unsupported("slice step must be positive in torch")
    if start in (None, 0) and step == 1 and (end is None or (isinstance(end, int) and end >= 1 << 62)):
        return x  # the whole axis, at any size
    ctx.require_static_axis(d, "a slice")
    s0, s1, st = slice(start, end, step).indices(size)
    if (s0, s1, st) == (0, size, 1):
        return x
    return ctx.b.slice(x, [d], [s0], [max(s1, s0)], [st])


@register_lowering(aten.select.int)
def _select(ctx: LoweringContext, x: Value, dim: int, index: int) -> Value:
    d = _norm_dim(dim, x.ndim)
    ctx.require_static_axis(d, "a select")
    size = x.shape[d]
    if not -size <= index < size:
        raise Unsupported("select index out of range")
    i = index % size
    v = ctx.b.slice(x, [d], [i], [i + 1], [1]) if size != 1 else x
    return ctx.b.squeeze(v, [d])


def _split_at(ctx: LoweringContext, x: Value, sizes: Sequence[int], dim: int) -> tuple[Value, ...]:
    d = _norm_dim(dim, x.ndim)
    if len(sizes) > 1:
        ctx.require_static_axis(d, "a split")
    outs: list[Value] = []
    start = 0
    for s in sizes:
        s = int(s)
        if (start, start + s) == (0, x.shape[d]):
            outs.append(x)
        else:
            outs.append(ctx.b.slice(x, [d], [start], [start + s], [1]))
        start += s
    return tuple(outs)


@register_lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_with_sizes(ctx: LoweringContext, x: Value, split_sizes: Sequence[int], dim: int = 0) -> tuple[Value, ...]:
    return _split_at(ctx, x, split_sizes, dim)


@register_lowering(aten.split.Tensor)
def _split(ctx: LoweringContext, x: Value, split_size: int, dim: int = 0) -> tuple[Value, ...]:
    d = _norm_dim(dim, x.ndim)
    n = x.shape[d]
    if split_size <= 0:
        raise Unsupported("split size")
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    return _split_at(ctx, x, sizes, d)


@register_lowering(aten.unbind.int)
def _unbind(ctx: LoweringContext, x: Value, dim: int = 0) -> tuple[Value, ...]:
    d = _norm_dim(dim, x.ndim)
    return tuple(_select(ctx, x, d, i) for i in range(x.shape[d]))


# ---------------------------------------------------------------------------------- random

@register_lowering(torch.ops.kiln.uniform.default)
def _uniform(ctx: LoweringContext, seed: Value, like: Value, stream: int, dtype: torch.dtype) -> Value:
    """kiln.torch's counter-based draws (:mod:`.rng`): the same numbers torch's op computes."""
    return ctx.b.uniform(seed, like, stream=stream, dtype=kiln_dtype(dtype))


# ---------------------------------------------------------------------------------- indexing
#
# Reads at positions held in a tensor lower to kiln's gather (NumPy's take_along_axis), which
# reads a graph input's buffer where it is: an embedding lookup fuses with the adds and the
# layer_norm after it. Positions out of range read the axis's nearest end where torch would
# raise a device-side error (a valid program never has them).

@register_lowering(aten.embedding.default)
def _embedding(ctx: LoweringContext, weight: Value, indices: Value, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    if weight.ndim != 2:
        raise Unsupported("embedding of a table that is not 2-D")
    return ctx.b.take(weight, indices, axis=0)  # padding_idx and the rest concern the backward


@register_lowering(aten.index_select.default)
def _index_select(ctx: LoweringContext, x: Value, dim: int, index: Value) -> Value:
    if x.ndim == 0:
        raise Unsupported("index_select of a 0-d tensor")
    if index.ndim == 0:  # torch keeps the dimension (size 1)
        index = ctx.b.reshape(index, (1,))
    return ctx.b.take(x, index, axis=_norm_dim(dim, x.ndim))


@register_lowering(aten.index.Tensor)
def _index(ctx: LoweringContext, x: Value, indices: Sequence[Any]) -> Value:
    """Advanced indexing ``x[..., i0, i1, ...]``: integer index tensors on consecutive
    dimensions (after any number of full slices) broadcast together, and their positions
    (negative ones from the end) combine into one position of those dimensions flattened,
    which a gather reads. Masks, and index tensors apart from each other (torch moves their
    dimensions to the front), stay in torch."""
    idx = list(indices)
    where = [i for i, t in enumerate(idx) if t is not None]
    if not where or where != list(range(where[0], where[-1] + 1)) or where[-1] >= x.ndim:
        raise Unsupported("advanced indexing other than consecutive index tensors")
    ts = [idx[i] for i in where]
    if any(not isinstance(t, Value) or t.dtype == "bool" or not dt_is_integer(t.dtype) for t in ts):
        raise Unsupported("indexing with a mask or a non-integer tensor")
    p, k = where[0], len(ts)
    if k == 1:
        return ctx.b.take(x, ts[0], axis=p)
    xm = node_meta(ctx.node.args[0])
    if not isinstance(xm, torch.Tensor) or not all(_is_static_size(d) for d in xm.shape):
        return _index_in_steps(ctx, x, ts, p)
    sizes = x.shape[p:p + k]
    pos: Optional[Value] = None
    stride = 1
    for t, n in reversed(list(zip(ts, sizes))):
        t = ctx.cast(t, "i64")
        zero, size = ctx.b.constant(0, "i64"), ctx.b.constant(n, "i64")
        t = ctx.b.where(ctx.b.lt(t, zero), ctx.b.binary("add", t, size), t)
        t = ctx.b.clamp(t, 0, max(n - 1, 0))
        term = t if stride == 1 else ctx.b.binary("mul", t, ctx.b.constant(stride, "i64"))
        pos = term if pos is None else ctx.b.binary("add", pos, term)
        stride *= n
    flat = ctx.b.reshape(x, tuple(x.shape[:p]) + (stride,) + tuple(x.shape[p + k:]))
    assert pos is not None
    return ctx.b.take(flat, pos, axis=p)


def _index_in_steps(ctx: LoweringContext, x: Value, ts: list[Value], p: int) -> Value:
    """``x[..., i0, i1, ...]`` (index tensors on dimensions p, p+1, ...) at run-time sizes, where
    the flattened position would need a size as a number: one gather per index tensor. The
    first takes rows of x by ``i0`` (its dimensions replace dimension p); each next one picks,
    in the dimension after the index dimensions so far, the position its index tensor holds,
    broadcasting with them (the gather's rule off its axis). Each step's result but the last is
    stored (a gather reads a computed source from memory): the size of the indices' broadcast
    shape times the dimensions not yet indexed."""
    r = max(t.ndim for t in ts)
    ts = [ctx.b.unsqueeze(t, list(range(r - t.ndim))) if t.ndim < r else t for t in ts]
    y = ctx.b.take(x, ts[0], axis=p)  # x[:p] + shape(i0) + x[p+1:]
    for t in ts[1:]:
        axis = p + r  # the dimension this index tensor picks in
        rest = y.ndim - axis - 1
        idx = ctx.b.unsqueeze(t, list(range(p)) + [axis + j for j in range(rest + 1)])
        y = ctx.b.squeeze(ctx.b.gather(y, idx, axis), [axis])
    return y


@register_lowering(aten.gather.default)
def _gather(ctx: LoweringContext, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    """torch.gather reads the first ``index.size(d)`` positions of each other dimension of x
    (kiln's gather broadcasts instead): x is sliced to the index's sizes first."""
    if x.ndim != index.ndim or x.ndim == 0:
        raise Unsupported("gather of tensors of different ranks")
    d = _norm_dim(dim, x.ndim)
    xm, im = node_meta(ctx.node.args[0]), node_meta(ctx.node.args[2])
    axes, stops = [], []
    for k in range(x.ndim):
        if k == d:
            continue
        xs, ix = xm.shape[k], im.shape[k]
        if _is_static_size(xs) and _is_static_size(ix):
            if int(ix) > int(xs):
                raise Unsupported("gather index larger than its input")
            if int(ix) < int(xs):
                axes.append(k)
                stops.append(int(ix))
        elif str(xs) != str(ix):
            raise Unsupported("gather with symbolic sizes that may differ off its axis")
    if axes:
        x = ctx.b.slice(x, axes, [0] * len(axes), stops, [1] * len(axes))
    return ctx.b.gather(x, index, d)


@register_lowering(aten.cat.default)
def _cat(ctx: LoweringContext, tensors: Sequence[Value], dim: int = 0) -> Value:
    dt = ctx.out_dtype
    vals = [ctx.value(t, dt) for t in tensors]
    # torch skips 1-D empty tensors in cat (a legacy rule); so does this.
    vals = [v for v in vals if not (v.ndim == 1 and v.shape[0] == 0)] or vals[:1]
    if len(vals) == 1:
        return vals[0]
    return ctx.b.concat(vals, axis=_norm_dim(dim, vals[0].ndim))


@register_lowering(aten.flip.default)
def _flip(ctx: LoweringContext, x: Value, dims: Sequence[int]) -> Value:
    axes = sorted({_norm_dim(int(d), x.ndim) for d in dims})
    axes = [a for a in axes if x.shape[a] > 1]
    if not axes:
        return x
    return ctx.b.slice(x, axes, [-1] * len(axes), [-x.shape[a] - 1 for a in axes], [-1] * len(axes))


@register_lowering(aten.constant_pad_nd.default)
def _constant_pad_nd(ctx: LoweringContext, x: Value, pad: Sequence[int], value: Any = 0) -> Value:
    """``F.pad(x, pad, value=value)``: (before, after) amounts per dimension from the last one
    back; a negative amount cuts. A pad of zero widths is ``x`` itself, at any size (Swin pads
    every feature map up to a multiple of its window, which at 224x224 each one is already: in
    torch a copy, in a part nothing). Widening concatenates fills (static shapes only)."""
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in pad) or len(pad) % 2 or len(pad) > 2 * x.ndim:
        raise Unsupported(f"pad amounts {list(pad)}")
    if not isinstance(value, (bool, int, float)) or (isinstance(value, int) and abs(value) > 1 << 53):
        raise Unsupported(f"pad value {value!r}")  # a fill's value is a double
    if ctx.node.meta.get(DISTINCT) and not any(pad):
        raise Unsupported("a copy that must stay a tensor of its own")
    dt = ctx.out_dtype
    out = ctx.cast(x, dt)
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo == 0 and hi == 0:
            continue
        ctx.require_static_axis(d, "a pad")
        if lo < 0 or hi < 0:
            start, stop = max(-lo, 0), out.shape[d] - max(-hi, 0)
            if stop < start:
                raise Unsupported(f"a pad that cuts more than dimension {d} holds")
            out = ctx.b.slice(out, [d], [start], [stop], [1])
        if lo <= 0 and hi <= 0:
            continue
        if ctx.out_symbolic:
            raise Unsupported("a widening pad of a tensor of symbolic sizes")
        out = _widen(ctx, out, d, lo, hi, value, dt)
    return out


def _widen(ctx: LoweringContext, x: Value, axis: int, lo: int, hi: int, value: Any, dtype: str) -> Value:
    """``x`` with ``lo`` elements of ``value`` before it and ``hi`` after it along ``axis``
    (fills of static size concatenated; a width of 0 or less adds nothing)."""
    def fill(w: int) -> list[Value]:
        return [ctx.b.full(tuple(x.shape[:axis]) + (w,) + tuple(x.shape[axis + 1:]), value, dtype)] if w > 0 else []

    if lo <= 0 and hi <= 0:
        return x
    return ctx.b.concat(fill(lo) + [x] + fill(hi), axis=axis)


# ---------------------------------------------------------------------------------- reductions

def _reduce(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Value, dim: Any = None, keepdim: bool = False,
              dtype: Optional[torch.dtype] = None) -> Value:
        if dtype is not None:
            x = ctx.cast(x, kiln_dtype(dtype))
        elif kop in ("mean",):
            x = ctx.cast(x, ctx.out_dtype)
        return ctx.b.reduce(kop, x, _axes(dim, x.ndim), bool(keepdim))

    return lower


register_lowering(aten.sum.dim_IntList, aten.sum.default)(_reduce("sum"))
register_lowering(aten.mean.dim, aten.mean.default)(_reduce("mean"))
register_lowering(aten.prod.dim_int, aten.prod.default)(_reduce("prod"))
register_lowering(aten.amax.default)(_reduce("max"))
register_lowering(aten.amin.default)(_reduce("min"))
register_lowering(aten.max.default)(_reduce("max"))
register_lowering(aten.min.default)(_reduce("min"))
register_lowering(aten.logsumexp.default)(_reduce("logsumexp"))


def _bool_reduce(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
        return ctx.b.reduce(kop, x, _axes(dim, x.ndim), bool(keepdim))

    return lower


register_lowering(aten.any.dim, aten.any.dims, aten.any.default)(_bool_reduce("any"))
register_lowering(aten.all.dim, aten.all.dims, aten.all.default)(_bool_reduce("all"))


def _minmax_dim(kop: str, argop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
        d = _norm_dim(dim, x.ndim)
        return (ctx.b.reduce(kop, x, [d], bool(keepdim)), ctx.b._arg(argop, x, d, bool(keepdim)))

    return lower


register_lowering(aten.max.dim)(_minmax_dim("max", "argmax"))
register_lowering(aten.min.dim)(_minmax_dim("min", "argmin"))


def _arg_reduce(kop: str) -> LoweringFn:
    def lower(ctx: LoweringContext, x: Value, dim: Optional[int] = None, keepdim: bool = False) -> Value:
        if dim is None:
            return ctx.b._arg(kop, x, None, False)  # torch's keepdim shape comes from _conform
        return ctx.b._arg(kop, x, _norm_dim(dim, x.ndim), bool(keepdim))

    return lower


register_lowering(aten.argmax.default)(_arg_reduce("argmax"))
register_lowering(aten.argmin.default)(_arg_reduce("argmin"))


def _correction(correction: Any, unbiased: Optional[bool] = None) -> float:
    if correction is None:
        return 0.0 if unbiased is False else 1.0
    return float(correction)


@register_lowering(aten.var.correction, aten.std.correction)
def _var(ctx: LoweringContext, x: Value, dim: Any = None, correction: Any = None, keepdim: bool = False) -> Value:
    op = "std" if ctx.node.target is aten.std.correction else "var"
    x = ctx.cast(x, ctx.out_dtype)
    return ctx.b.reduce(op, x, _axes(dim, x.ndim), bool(keepdim), _correction(correction) or None)


@register_lowering(aten.var.dim, aten.std.dim)
def _var_dim(ctx: LoweringContext, x: Value, dim: Any = None, unbiased: bool = True, keepdim: bool = False) -> Value:
    op = "std" if ctx.node.target is aten.std.dim else "var"
    x = ctx.cast(x, ctx.out_dtype)
    return ctx.b.reduce(op, x, _axes(dim, x.ndim), bool(keepdim), _correction(None, unbiased) or None)


@register_lowering(aten.var_mean.correction, aten.std_mean.correction)
def _var_mean(ctx: LoweringContext, x: Value, dim: Any = None, correction: Any = None, keepdim: bool = False) -> tuple[Value, Value]:
    op = "std" if ctx.node.target is aten.std_mean.correction else "var"
    x = ctx.cast(x, kiln_dtype(ctx.out_meta(0).dtype))
    axes = _axes(dim, x.ndim)
    return (ctx.b.reduce(op, x, axes, bool(keepdim), _correction(correction) or None),
            ctx.b.reduce("mean", x, axes, bool(keepdim)))


@register_lowering(aten.linalg_vector_norm.default)
def _vector_norm(ctx: LoweringContext, x: Value, ord: Any = 2, dim: Any = None, keepdim: bool = False,
                 dtype: Optional[torch.dtype] = None) -> Value:
    x = ctx.cast(x, ctx.out_dtype)
    axes = _axes(dim, x.ndim)
    if ord in (1, 2, math.inf):
        return ctx.b.norm(x, float(ord), axes, bool(keepdim))
    if ord == -math.inf:
        return ctx.b.reduce("min", ctx.b.abs(x), axes, bool(keepdim))
    if isinstance(ord, (int, float)) and ord > 0:
        p = ctx.value(float(ord), x.dtype)
        s = ctx.b.reduce("sum", ctx.b.pow(ctx.b.abs(x), p), axes, bool(keepdim))
        return ctx.b.pow(s, ctx.value(1.0 / float(ord), x.dtype))
    raise Unsupported(f"vector norm of order {ord}")


# ---------------------------------------------------------------------------------- composites

# Average pooling is a sum of shifted strided slices of the zero-padded operand, one per tap of
# the window; past this many taps it is left to torch.
_POOL_MAX_TAPS = 64


def _pair(v: Sequence[int], default: tuple[int, int]) -> tuple[int, int]:
    """A 2-D pooling argument as torch takes it: two values, one for both axes, or none."""
    return (int(v[0]), int(v[-1])) if len(v) else default


@register_lowering(aten.avg_pool2d.default)
def _avg_pool2d(ctx: LoweringContext, x: Value, kernel_size: Sequence[int], stride: Sequence[int] = (),
                padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Optional[int] = None) -> Value:
    """``F.avg_pool2d``: each output the sum of a window's taps, each tap one strided slice of
    the padded operand (a pointwise kernel reads them all, so the pooling fuses with what is
    computed before and after it: PoolFormer's ``pool(y) - y``). The divisor per position is
    torch's: the window clipped to the padded operand (``count_include_pad``) or to the
    operand itself, computed from the positions' indices."""
    if ctx.out_symbolic or x.ndim not in (3, 4):
        raise Unsupported("average pooling of symbolic sizes or of other than 3 or 4 dimensions")
    if isinstance(ctx.meta, torch.Tensor) and ctx.meta.device.type != "cpu":
        # Measured on an H200 (PoolFormer-s12, batch 16): fused with the group norms around
        # it, the pooling's part took 47 us per call against 30 for torch's pooling kernel and
        # a smaller part, so the model's GPU time grew from 3.66 to 4.12 ms. On CUDA the
        # pooling stays torch's until its kernel reads each input once.
        raise Unsupported("average pooling on CUDA runs in torch (kiln's fused kernel measured slower)")
    kh, kw = _pair(kernel_size, (1, 1))
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, (0, 0))
    if kh * kw > _POOL_MAX_TAPS:
        raise Unsupported(f"average pooling over {kh}x{kw} taps")
    H, W = x.shape[-2], x.shape[-1]
    oh, ow = ctx.out_shape[-2:]
    out_dt = ctx.out_dtype
    acc = "f32" if out_dt in ("f16", "bf16") else out_dt
    # Zeros around the operand: the padding, and past its end the rows and columns a ceil-mode
    # window reaches.
    extra_h = max(0, (oh - 1) * sh + kh - H - ph)
    extra_w = max(0, (ow - 1) * sw + kw - W - pw)
    padded = _widen(ctx, ctx.cast(x, acc), x.ndim - 2, ph, extra_h, 0.0, acc)
    padded = _widen(ctx, padded, x.ndim - 1, pw, extra_w, 0.0, acc)
    total: Optional[Value] = None
    for i in range(kh):
        for j in range(kw):
            tap = ctx.b.slice(padded, [x.ndim - 2, x.ndim - 1], [i, j], [i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1],
                              [sh, sw])
            total = tap if total is None else ctx.b.add(total, tap)
    assert total is not None
    if divisor_override:
        return ctx.cast(ctx.b.div(total, ctx.value(float(divisor_override), acc)), out_dt)

    def count(n: int, k: int, st: int, pad: int, size: int) -> Value:
        # Window extents along one axis, as torch clips them.
        start = ctx.b.sub(ctx.b.mul(ctx.b.iota((n,), 0, "i64"), ctx.value(st, "i64")), ctx.value(pad, "i64"))
        end = ctx.b.minimum(ctx.b.add(start, ctx.value(k, "i64")), ctx.value(size + pad, "i64"))
        if not count_include_pad:
            start = ctx.b.maximum(start, ctx.value(0, "i64"))
            end = ctx.b.minimum(end, ctx.value(size, "i64"))
        return ctx.cast(ctx.b.sub(end, start), acc)

    ch = ctx.b.reshape(count(oh, kh, sh, ph, H), (oh, 1))
    cw = ctx.b.reshape(count(ow, kw, sw, pw, W), (1, ow))
    return ctx.cast(ctx.b.div(total, ctx.b.mul(ch, cw)), out_dt)


@register_lowering(aten._softmax.default)
def _softmax(ctx: LoweringContext, x: Value, dim: int, half_to_float: bool = False) -> Value:
    return ctx.b.softmax(ctx.cast(x, ctx.out_dtype), axis=_norm_dim(dim, x.ndim))


@register_lowering(aten._log_softmax.default)
def _log_softmax(ctx: LoweringContext, x: Value, dim: int, half_to_float: bool = False) -> Value:
    return ctx.b.log_softmax(ctx.cast(x, ctx.out_dtype), axis=_norm_dim(dim, x.ndim))


@register_lowering(aten.native_layer_norm.default)
def _native_layer_norm(ctx: LoweringContext, x: Value, normalized_shape: Sequence[int], weight: Optional[Value],
                       bias: Optional[Value], eps: float) -> tuple[Value, Value, Value]:
    k = len(normalized_shape)
    if k == 0 or k > x.ndim:
        raise Unsupported("layer_norm over no axis")
    axes = list(range(x.ndim - k, x.ndim))
    out_dt = kiln_dtype(ctx.out_meta(0).dtype)
    stat_dt = kiln_dtype(ctx.out_meta(1).dtype)
    if not (ctx.output_used(1) or ctx.output_used(2)):
        # Inference: the composite, which the compiler schedules as one row-persistent kernel.
        xin = ctx.cast(x, out_dt)
        w = ctx.cast(weight, out_dt) if weight is not None else None
        bb = ctx.cast(bias, out_dt) if bias is not None else None
        if bb is not None and w is None:
            w = ctx.b.full(bb.shape, 1.0, out_dt)
        out = ctx.b.layer_norm(xin, w, bb, axes=axes, eps=float(eps))
        return (out, None, None)  # type: ignore[return-value]
    # Training: the saved mean and rstd are outputs too; one set of statistics serves all.
    xs = ctx.cast(x, stat_dt)
    mean = ctx.b.mean(xs, axes, keepdim=True)
    centered = ctx.b.sub(xs, mean)
    var = ctx.b.mean(ctx.b.mul(centered, centered), axes, keepdim=True)
    rstd = ctx.b.rsqrt(ctx.b.add(var, ctx.value(float(eps), stat_dt)))
    out = ctx.b.mul(centered, rstd)
    if weight is not None:
        out = ctx.b.mul(out, ctx.cast(weight, stat_dt))
    if bias is not None:
        out = ctx.b.add(out, ctx.cast(bias, stat_dt))
    return (ctx.cast(out, out_dt), mean, rstd)


#: Marks the layout copies the channels-last pass inserts (:mod:`.passes.channels_last`): a lowering may read
#: through one to its source's layout.
RELAYOUT = "kiln_relayout"

# A group longer than this is reduced in chunks of about this many elements: the few long
# rows of a GroupNorm with one group (PoolFormer: 16 rows of 64x56x56 at batch 16) would
# otherwise give the GPU one block per row.
_GROUP_CHUNK = 4096


def _few_long_rows(rows: int, length: int) -> bool:
    """Whether ``rows`` reductions of ``length`` elements each are too few and too long to
    fill a GPU on their own, so they are reduced in chunks."""
    return rows < 1024 and length >= 4 * _GROUP_CHUNK


def copy_source(n: Any) -> Any:
    """The node a ``clone`` copies (it holds the same values, in the source's layout), else
    ``n`` itself."""
    if isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target is aten.clone.default:
        return n.args[0]
    return n


def _chunks(length: int, unit: int, rows: int) -> int:
    """How many equal chunks to cut each of ``rows`` rows of ``length`` runs of ``unit``
    elements into (a chunk holds whole runs): 1 when the rows alone are many or short, else a
    divisor of ``length`` leaving chunks of about ``_GROUP_CHUNK`` elements."""
    total = length * unit
    if not _few_long_rows(rows, total):
        return 1
    want = max(1, min(length, total // _GROUP_CHUNK))
    return max(d for d in range(1, want + 1) if length % d == 0)


@register_lowering(aten.native_group_norm.default)
def _native_group_norm(ctx: LoweringContext, x: Value, weight: Optional[Value], bias: Optional[Value], n: int, c: int,
                       hw: int, group: int, eps: float) -> tuple[Value, Value, Value]:
    """Statistics over each group of ``c // group`` channels and every spatial position, in f32
    for half-precision inputs (as torch's kernels); the normalised values, then the channels'
    weight and bias.

    The statistics are taken in the operand's memory order: a channels-last operand (the
    layout pass makes convolutions' outputs so) is viewed as [N, HW, G, C/G], whose groups
    interleave along the channels, rather than read channel-major with strided loads. A long
    group is reduced in equal chunks (a mean and a sum of squared deviations per chunk), and
    the chunks combined exactly (Chan et al.'s pairwise update: M2 = sum M2_s + L * sum (m_s -
    mean)^2), so the first pass has rows enough to fill a GPU: runs of spatial positions
    channels-last, channels (or runs of a channel's rows) in the traced layout."""
    if x.ndim < 2 or x.shape[0] != n or x.shape[1] != c or group <= 0 or c % group:
        raise Unsupported("group_norm with sizes that do not match its operand")
    out_dt = kiln_dtype(ctx.out_meta(0).dtype)
    acc = "f32" if out_dt in ("f16", "bf16") else out_dt
    # A contiguous copy of the operand (the layout pass's, for torch's kernel, or on CUDA the
    # one torch's own group_norm traces) holds its source's values: kiln reads the source, in
    # the source's layout.
    xm = node_meta(copy_source(ctx.node.args[0]))
    spatial = x.shape[2:]
    cg = c // group
    last = x.ndim >= 3 and isinstance(xm, torch.Tensor) and xm.stride()[1] == 1 and c > 1
    xs = ctx.cast(x, acc)
    if last:  # [N, HW, G, C/G]; a chunk is a run of spatial positions
        grouped = ctx.b.reshape(ctx.b.permute(xs, [0, *range(2, x.ndim), 1]), (n, hw, group, cg))
        s = _chunks(hw, cg, n * group)
        parts = ctx.b.reshape(grouped, (n, s, hw // s, group, cg))
        axes, chunk_axes, per = [2, 4], [1], (hw // s) * cg
    else:  # [N, G, C/G, *spatial]; a chunk is one channel, or a run of its first spatial axis
        # The reduced axes stay the operand's own (no merged channel-and-space axis): indices
        # along them are affine in the address, so the CUDA code generator sees a contiguous
        # reduction and gives each chunk a row of threads.
        grouped = ctx.b.reshape(xs, (n, group, cg, *spatial))
        if not spatial or not _few_long_rows(n * group, cg * hw):
            parts, axes, chunk_axes, s, per = grouped, list(range(2, grouped.ndim)), [], 1, cg * hw
        else:
            want = max(1, min(spatial[0], hw // _GROUP_CHUNK))
            cut = max(d for d in range(1, want + 1) if spatial[0] % d == 0)
            parts = ctx.b.reshape(grouped, (n, group, cg, cut, spatial[0] // cut, *spatial[1:]))
            axes, chunk_axes, s, per = list(range(4, 4 + len(spatial))), [2, 3], cg * cut, hw // cut
    m_s = ctx.b.mean(parts, axes, keepdim=True)
    d = ctx.b.sub(parts, m_s)
    m2_s = ctx.b.sum(ctx.b.mul(d, d), axes, keepdim=True)
    if s > 1:
        mean = ctx.b.mean(m_s, chunk_axes, keepdim=True)
        spread = ctx.b.sub(m_s, mean)
        m2 = ctx.b.add(ctx.b.sum(m2_s, chunk_axes, keepdim=True),
                       ctx.b.mul(ctx.b.sum(ctx.b.mul(spread, spread), chunk_axes, keepdim=True),
                                 ctx.value(float(per), acc)))
    else:
        mean, m2 = m_s, m2_s
    var = ctx.b.mul(m2, ctx.value(1.0 / float(per * s), acc))
    rstd = ctx.b.rsqrt(ctx.b.add(var, ctx.value(float(eps), acc)))
    # Statistics [N, G] and their broadcast shapes over `grouped`.
    stat_shape = (n, 1, group, 1) if last else (n, group) + (1,) * (1 + len(spatial))
    mean_b, rstd_b = (ctx.b.reshape(v, stat_shape) for v in (mean, rstd))
    normed = ctx.b.mul(ctx.b.sub(grouped, mean_b), rstd_b)
    if last:
        out = ctx.b.permute(ctx.b.reshape(normed, (n, *spatial, c)), [0, x.ndim - 1, *range(1, x.ndim - 1)])
    else:
        out = ctx.b.reshape(normed, x.shape)
    pshape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = ctx.b.mul(out, ctx.b.reshape(ctx.cast(weight, acc), pshape))
    if bias is not None:
        out = ctx.b.add(out, ctx.b.reshape(ctx.cast(bias, acc), pshape))
    stats = [ctx.cast(ctx.b.reshape(v, (n, group)), kiln_dtype(ctx.out_meta(i).dtype)) if ctx.output_used(i) else None
             for i, v in ((1, mean), (2, rstd))]
    return (ctx.cast(out, out_dt), stats[0], stats[1])  # type: ignore[return-value]


@register_lowering(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_inference(ctx: LoweringContext, x: Value, weight: Optional[Value], bias: Optional[Value],
                          running_mean: Value, running_var: Value, momentum: float,
                          eps: float) -> tuple[Value, Value, Value]:
    if ctx.output_used(1) or ctx.output_used(2) or x.ndim < 2:
        raise Unsupported("batch_norm statistics outputs")
    dt = kiln_dtype(ctx.out_meta(0).dtype)
    c = x.shape[1]
    pshape = (1, c) + (1,) * (x.ndim - 2)

    def chan(v: Value) -> Value:
        return ctx.b.reshape(ctx.cast(v, dt), pshape)

    scale = ctx.b.rsqrt(ctx.b.add(chan(running_var), ctx.value(float(eps), dt)))
    if weight is not None:
        scale = ctx.b.mul(scale, chan(weight))
    out = ctx.b.mul(ctx.b.sub(ctx.cast(x, dt), chan(running_mean)), scale)
    if bias is not None:
        out = ctx.b.add(out, chan(bias))
    return (out, None, None)  # type: ignore[return-value]


#: Marks a node whose result equals its argument but must stay a tensor of its own (the graph
#: returns it, or something writes one of the two in place): it runs in torch, which copies,
#: where a part would hand out one buffer for both (:func:`.partition.drop_empty_pads`).
DISTINCT = "kiln_distinct"

#: Ops whose output is a rearrangement of one input (free in torch, index math in kiln).
VIEW_OPS: frozenset[Any] = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
    aten.permute.default, aten.t.default, aten.transpose.int, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor,
    aten.select.int, aten.alias.default, aten.detach.default, aten.clone.default,
    aten.lift_fresh_copy.default,
})

#: Ops that make a tensor from nothing but attributes.
SOURCE_OPS: frozenset[Any] = frozenset({
    aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
    aten.arange.start_step, aten.arange.start, aten.arange.default,
})

#: Ops that compute nothing by themselves: a kiln part made only of these is not worth a kernel.
NON_COMPUTE_OPS: frozenset[Any] = VIEW_OPS | SOURCE_OPS | frozenset({
    aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int, operator.getitem,
    aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
    aten.new_zeros.default, aten.new_ones.default, aten.fill.Scalar,
})


def lowered_ops() -> list[str]:
    """The names of every op the table lowers (for diagnostics and documentation)."""
    return sorted(str(k) for k in _LOWERINGS)

