#!/usr/bin/env python3
"""Writes the GPU suite's graphs into tests/gpu/graphs/: one kiln.v1.Graph text file per graph,
and manifest.json saying how to feed each graph and what PyTorch expression gives each output.

The op suite puts many ops in one graph (one output each) so the suite stays a few dozen
compiles; the benchmark graphs are the workloads of the CUDA backend's acceptance table at
full size. Deterministic: running it twice writes the same files.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "graphs")

WIRE = {"f16": "F16", "bf16": "BF16", "f32": "F32", "f64": "F64", "i8": "I8", "i16": "I16", "i32": "I32",
        "i64": "I64", "u8": "U8", "bool": "BOOL"}


class DT:
    """A dtype attribute value."""

    def __init__(self, name):
        self.name = name


def attr_text(key, v):
    if isinstance(v, bool):
        val = "b: %s" % ("true" if v else "false")
    elif isinstance(v, int):
        val = "i: %d" % v
    elif isinstance(v, float):
        val = "f: %r" % v
    elif isinstance(v, str):
        val = 's: "%s"' % v
    elif isinstance(v, DT):
        val = "dtype: %s" % WIRE[v.name]
    elif isinstance(v, (list, tuple)):
        val = "ints { %s }" % " ".join("values: %d" % i for i in v)
    else:
        raise TypeError(v)
    return 'attrs { key: "%s" value { %s } }' % (key, val)


class Graph:
    def __init__(self, name, kind="suite"):
        self.name, self.kind = name, kind
        self.inputs, self.nodes, self.outputs = [], [], []

    def input(self, name, dtype, shape, gen="normal"):
        self.inputs.append({"name": name, "dtype": dtype, "shape": list(shape), "gen": gen})
        return len(self.inputs) - 1

    def node(self, op, ins, **attrs):
        self.nodes.append((op, list(ins), attrs))
        return len(self.inputs) + len(self.nodes) - 1

    def output(self, v, ref, label, conv="auto", rtol=None, atol=None):
        """`ref`: a PyTorch expression over the inputs by name (converted by `conv`)."""
        self.outputs.append({"value": v, "ref": ref, "label": label, "conv": conv, "rtol": rtol, "atol": atol})

    def text(self):
        lines = []
        for i in self.inputs:
            shape = " ".join("shape: %d" % d for d in i["shape"])
            lines.append('inputs { name: "%s" type { dtype: %s %s } }' % (i["name"], WIRE[i["dtype"]], shape))
        for op, ins, attrs in self.nodes:
            parts = ['op: "%s"' % op] + ["inputs: %d" % i for i in ins]
            parts += [attr_text(k, attrs[k]) for k in sorted(attrs)]
            lines.append("nodes { %s }" % " ".join(parts))
        for o in self.outputs:
            lines.append("outputs: %d" % o["value"])
        return "\n".join(lines) + "\n"

    def manifest(self):
        return {"name": self.name, "kind": self.kind, "inputs": self.inputs,
                "outputs": [{k: v for k, v in o.items() if k != "value"} for o in self.outputs]}


FLOAT_UNARY = {
    "neg": "-x", "abs": "torch.abs(x)", "sign": "torch.sign(x)", "exp": "torch.exp(x)", "exp2": "torch.exp2(x)",
    "expm1": "torch.expm1(x)", "log": "torch.log(x)", "log2": "torch.log2(x)", "log1p": "torch.log1p(x)",
    "sqrt": "torch.sqrt(x)", "rsqrt": "torch.rsqrt(x)", "sin": "torch.sin(x)", "cos": "torch.cos(x)",
    "tan": "torch.tan(x)", "tanh": "torch.tanh(x)", "asin": "torch.asin(x)", "acos": "torch.acos(x)",
    "atan": "torch.atan(x)", "sinh": "torch.sinh(x)", "cosh": "torch.cosh(x)", "sigmoid": "torch.sigmoid(x)",
    "erf": "torch.erf(x)", "floor": "torch.floor(x)", "ceil": "torch.ceil(x)", "round": "torch.round(x)",
    "trunc": "torch.trunc(x)", "reciprocal": "torch.reciprocal(x)", "logical_not": "torch.logical_not(x)",
    "isnan": "torch.isnan(x)", "isinf": "torch.isinf(x)", "gelu": "F.gelu(x)", "elu": "F.elu(x)",
    "silu": "F.silu(x)", "softplus": "F.softplus(x)", "relu": "F.relu(x)", "leaky_relu": "F.leaky_relu(x)",
    "hardtanh": "F.hardtanh(x)",
}
FLOAT_BINARY = {
    "add": "x + y", "sub": "x - y", "mul": "x * y", "div": "x / y", "floordiv": "torch.floor_divide(x, y)",
    "remainder": "torch.remainder(x, y)", "pow": "torch.pow(x, y)", "maximum": "torch.maximum(x, y)",
    "minimum": "torch.minimum(x, y)", "atan2": "torch.atan2(x, y)", "eq": "x == y", "ne": "x != y",
    "lt": "x < y", "le": "x <= y", "gt": "x > y", "ge": "x >= y",
}
INT_BINARY = {
    "add": "x + y", "sub": "x - y", "mul": "x * y", "floordiv": "torch.floor_divide(x, y)",
    "remainder": "torch.remainder(x, y)", "maximum": "torch.maximum(x, y)", "minimum": "torch.minimum(x, y)",
    "eq": "x == y", "ne": "x != y", "lt": "x < y", "le": "x <= y", "gt": "x > y", "ge": "x >= y",
    "bitwise_and": "x & y", "bitwise_or": "x | y", "bitwise_xor": "x ^ y",
}
BOOL_BINARY = {
    "logical_and": "torch.logical_and(x, y)", "logical_or": "torch.logical_or(x, y)",
    "logical_xor": "torch.logical_xor(x, y)", "bitwise_and": "x & y", "bitwise_or": "x | y",
    "bitwise_xor": "x ^ y", "eq": "x == y", "ne": "x != y",
}


def suite():
    gs = []
    for dt in ["f32", "f16", "bf16", "f64"]:
        for shape in ([256, 1024], [37, 1001]) if dt == "f32" else ([256, 1024],):
            g = Graph("unary_%s_%dx%d" % (dt, shape[0], shape[1]))
            a = g.input("x", dt, shape)
            for op, ref in FLOAT_UNARY.items():
                # gelu's 1 + erf(x/sqrt(2)) cancels for negative x, so an ulp of erf is 1e-4 of
                # the result: compare with a double-precision reference, loosely.
                gelu = op == "gelu"
                g.output(g.node(op, [a]), ref, op, conv="f64" if gelu else "auto", rtol=1e-4 if gelu else None,
                         atol=1e-6 if gelu else None)
            g.output(g.node("clamp", [a], min=-1.5, max=2.0), "torch.clamp(x, -1.5, 2.0)", "clamp")
            g.output(g.node("cast", [a], dtype=DT("i32")), "x.to(torch.int32)", "cast_i32", conv="none")
            g.output(g.node("cast", [a], dtype=DT("bool")), "x != 0", "cast_bool", conv="none")
            gs.append(g)
            g = Graph("binary_%s_%dx%d" % (dt, shape[0], shape[1]))
            a, b = g.input("x", dt, shape), g.input("y", dt, shape)
            for op, ref in FLOAT_BINARY.items():
                g.output(g.node(op, [a, b]), ref, op)
            g.output(g.node("where", [g.node("gt", [a, b]), a, b]), "torch.where(x > y, x, y)", "where")
            gs.append(g)
    g = Graph("unary_i32")
    a = g.input("x", "i32", [256, 1024], gen="int")
    for op, ref in {"neg": "-x", "abs": "torch.abs(x)", "sign": "torch.sign(x)", "bitwise_not": "~x",
                    "logical_not": "torch.logical_not(x)", "floor": "x", "round": "x"}.items():
        g.output(g.node(op, [a]), ref, op)
    for op in ["exp", "sqrt", "sin", "sigmoid"]:  # float ops on i32 compute in f64 (NumPy's rule)
        g.output(g.node(op, [a]), FLOAT_UNARY[op], op + "_f64", conv="f64")
    gs.append(g)
    for dt in ["i32", "i64", "i8", "u8"]:
        g = Graph("binary_%s" % dt)
        a = g.input("x", dt, [256, 1024], gen="int" if dt != "u8" else "uint")
        b = g.input("y", dt, [256, 1024], gen="nonzero" if dt != "u8" else "posint")
        for op, ref in INT_BINARY.items():
            g.output(g.node(op, [a, b]), ref, op)
        g.output(g.node("div", [a, b]), "x / y", "div", conv="f64")
        gs.append(g)
    g = Graph("pow_i32")
    a, b = g.input("x", "i32", [256, 1024], gen="int"), g.input("y", "i32", [256, 1024], gen="smallexp")
    g.output(g.node("pow", [a, b]), "torch.pow(x, y)", "pow")
    gs.append(g)
    g = Graph("logic_bool")
    a, b = g.input("x", "bool", [256, 1024], gen="bool"), g.input("y", "bool", [256, 1024], gen="bool")
    for op, ref in BOOL_BINARY.items():
        g.output(g.node(op, [a, b]), ref, op)
    g.output(g.node("logical_not", [a]), "torch.logical_not(x)", "logical_not")
    gs.append(g)

    # Reductions over the last axis, the first axis and everything, in three float types.
    for dt in ["f32", "f16", "f64"]:
        for shape in ([512, 1000], [1000, 96]):
            g = Graph("reduce_%s_%dx%d" % (dt, shape[0], shape[1]))
            a = g.input("x", dt, shape)
            for dim, attrs, tdim in [(-1, {"axes": [-1]}, ", dim=-1"), (0, {"axes": [0]}, ", dim=0"), (None, {}, "")]:
                tag = "all" if dim is None else "axis%d" % dim
                for op, ref in [("sum", "torch.sum(x%s)"), ("max", "torch.amax(x%s)" if dim is not None else "torch.max(x)"),
                                ("min", "torch.amin(x%s)" if dim is not None else "torch.min(x)"),
                                ("mean", "torch.mean(x%s)"), ("var", "torch.var(x%s, correction=0)"),
                                ("std", "torch.std(x%s, correction=0)"), ("logsumexp", None), ("norm", None)]:
                    if op == "logsumexp":
                        ref = "torch.logsumexp(x, dim=%s)" % (dim if dim is not None else "(0, 1)")
                    elif op == "norm":
                        ref = "torch.linalg.vector_norm(x%s)" % tdim
                    else:
                        ref = ref % tdim if "%s" in ref else ref
                    # Sums are compared with an absolute tolerance scaled to the sum of |x| they
                    # add up (the two sides add in different orders); the rest are relative.
                    n = shape[0] * shape[1] if dim is None else shape[dim]
                    scale = {"f32": 2e-7, "f64": 4e-16, "f16": 2e-7}[dt] * n * 1.6
                    atol = scale if op == "sum" else scale / n if op == "mean" else None
                    g.output(g.node(op, [a], **attrs), ref, "%s_%s" % (op, tag), rtol=1e-4 if dt == "f32" else None,
                             atol=atol)
                arg_attrs = {} if dim is None else {"axis": dim}
                for op in ["argmax", "argmin"]:
                    ref = "torch.%s(x%s)" % (op, tdim)
                    g.output(g.node(op, [a], **arg_attrs), ref, "%s_%s" % (op, tag), conv="none")
            gs.append(g)
    g = Graph("reduce_prod_i32")
    a = g.input("x", "f32", [512, 100], gen="near1")
    b = g.input("n", "i32", [512, 100], gen="int")
    g.output(g.node("prod", [a], axes=[-1]), "torch.prod(x, dim=-1)", "prod_f32", rtol=1e-4)
    g.output(g.node("sum", [b], axes=[-1]), "torch.sum(n, dim=-1)", "sum_i32", conv="none")
    g.output(g.node("max", [b], axes=[0]), "torch.amax(n, dim=0)", "max_i32", conv="none")
    g.output(g.node("argmin", [b], axis=0), "torch.argmin(n, dim=0)", "argmin_i32", conv="none")
    gs.append(g)
    g = Graph("reduce_bool")
    t = g.input("t", "bool", [512, 1000], gen="mostly_true")
    f = g.input("f", "bool", [512, 1000], gen="mostly_false")
    g.output(g.node("all", [t], axes=[-1]), "torch.all(t, dim=-1)", "all_rows", conv="none")
    g.output(g.node("any", [f], axes=[-1]), "torch.any(f, dim=-1)", "any_rows", conv="none")
    g.output(g.node("any", [f], axes=[0]), "torch.any(f, dim=0)", "any_cols", conv="none")
    gs.append(g)
    g = Graph("whole_tensor")  # partials in the workspace: sum, variance (two levels), argmax
    a = g.input("x", "f32", [4096, 1024])
    g.output(g.node("sum", [a]), "torch.sum(x)", "sum", rtol=1e-4, atol=1e-2)
    g.output(g.node("var", [a]), "torch.var(x, correction=0)", "var", rtol=1e-4)
    g.output(g.node("argmax", [a]), "torch.argmax(x)", "argmax", conv="none")
    gs.append(g)

    # Row kernels and views.
    for dt, shape in [("f32", [1000, 1000]), ("f16", [512, 4096]), ("bf16", [300, 768]), ("f32", [64, 50000])]:
        g = Graph("rows_%s_%dx%d" % (dt, shape[0], shape[1]))
        a = g.input("x", dt, shape)
        w, b = g.input("w", dt, shape[1:]), g.input("b", dt, shape[1:])
        g.output(g.node("softmax", [a], axis=-1), "torch.softmax(x, dim=-1)", "softmax", rtol=1e-4)
        g.output(g.node("log_softmax", [a], axis=-1), "torch.log_softmax(x, dim=-1)", "log_softmax", rtol=1e-4,
                 atol=1e-4)
        g.output(g.node("layer_norm", [a, w, b], eps=1e-5), "F.layer_norm(x, x.shape[-1:], w, b, eps=1e-5)",
                 "layer_norm", rtol=1e-4, atol=1e-4)
        gs.append(g)
    # Reads at positions held in a tensor: an embedding lookup fused with layer_norm (the table
    # read where it is, through inserted size-1 axes), take_along_axis with negative positions.
    g = Graph("gather")
    w = g.input("w", "f32", [64, 768])
    ids = g.input("ids", "i64", [16, 128], gen="uint")
    x = g.input("x", "f16", [512, 100])  # (inputs first: node values are numbered after them)
    p = g.input("p", "i32", [512, 100], gen="int")
    e = g.node("gather", [g.node("unsqueeze", [w], axes=[1]), g.node("unsqueeze", [ids], axes=[2])], axis=0)
    g.output(e, "F.embedding(ids, w)", "embedding")
    g.output(g.node("layer_norm", [e], eps=1e-5), "F.layer_norm(F.embedding(ids, w), (768,), eps=1e-5)",
             "embedding_layer_norm", rtol=1e-4, atol=1e-4)
    g.output(g.node("gather", [x, p], axis=1), "torch.gather(x, 1, torch.where(p < 0, p + 100, p).long())",
             "take_along_axis_f16")
    gs.append(g)
    # Gathered rows in the code generators' other loops: a short row (3), a transposing
    # store, row sums and argmax, column sums.
    g = Graph("gather_loops")
    w = g.input("w", "f32", [40, 3])
    big = g.input("big", "f32", [30, 200])
    ids = g.input("ids", "i64", [50], gen="posint")
    rows = g.input("rows", "i32", [64], gen="posint")
    gw = g.node("gather", [w, g.node("unsqueeze", [ids], axes=[1])], axis=0)
    gr = g.node("gather", [big, g.node("unsqueeze", [rows], axes=[1])], axis=0)
    g.output(g.node("mul", [gw, g.node("full", [], shape=[], value=2.0, dtype=DT("f32"))]), "w[ids] * 2", "short_rows")
    g.output(g.node("permute", [g.node("add", [gr, g.node("full", [], shape=[], value=1.0, dtype=DT("f32"))])],
                    dims=[1, 0]), "(big[rows.long()] + 1).t()", "transposed")
    g.output(g.node("sum", [gr], axes=[1]), "big[rows.long()].sum(1)", "row_sums", rtol=1e-4, atol=1e-4)
    g.output(g.node("argmax", [gr], axis=1), "big[rows.long()].argmax(1)", "row_argmax", conv="none")
    g.output(g.node("sum", [gr], axes=[0]), "big[rows.long()].sum(0)", "column_sums", rtol=1e-4, atol=1e-4)
    gs.append(g)
    # Counter-based random numbers (kiln's uniform): the bits of the Philox reference (torch integer
    # ops, kiln/torch/rng.py) in vector kernels, a transposed draw, a dropout with its mask, f16
    # numbers, and a draw feeding a row kernel (layer_norm).
    g = Graph("uniform")
    seed = g.input("seed", "i64", [], gen="uint")
    x = g.input("x", "f32", [1024, 768])
    h = g.input("h", "f16", [512, 100])
    keep = g.node("ge", [g.node("uniform", [seed, x], stream=2), g.node("full", [], shape=[], value=0.1, dtype=DT("f32"))])
    u = g.node("uniform", [seed, x], stream=1)
    g.output(u, "philox(seed, x.shape, 1, torch.float32)", "uniform_f32", rtol=0, atol=0)
    g.output(keep, "philox(seed, x.shape, 2, torch.float32) >= 0.1", "dropout_mask", conv="none")
    g.output(g.node("where", [keep, g.node("mul", [x, g.node("full", [], shape=[], value=1 / 0.9, dtype=DT("f32"))]),
                              g.node("full", [], shape=[], value=0.0, dtype=DT("f32"))]),
             "torch.where(philox(seed, x.shape, 2, torch.float32) >= 0.1, x * (1 / 0.9), 0.0)", "dropout", rtol=1e-6)
    g.output(g.node("uniform", [seed, h], stream=3, dtype=DT("f16")), "philox(seed, h.shape, 3, torch.float16)",
             "uniform_f16", rtol=0, atol=0)
    g.output(g.node("permute", [g.node("uniform", [seed, g.node("permute", [x], dims=[1, 0])], stream=4)], dims=[1, 0]),
             "philox(seed, (768, 1024), 4, torch.float32).t()", "transposed_draw", rtol=0, atol=0)
    g.output(g.node("layer_norm", [g.node("add", [x, u])], eps=1e-5),
             "F.layer_norm(x + philox(seed, x.shape, 1, torch.float32), (768,), eps=1e-5)", "noisy_layer_norm",
             rtol=1e-4, atol=1e-4)
    gs.append(g)
    g = Graph("views")
    a = g.input("x", "f32", [384, 256])
    c = g.input("c", "f32", [256])
    t = g.node("permute", [a], dims=[1, 0])
    g.output(g.node("add", [t, g.node("reshape", [c], shape=[256, 1])]), "x.t() + c[:, None]", "permute_add")
    s = g.node("slice", [a], axes=[1], starts=[250], stops=[3], steps=[-3])
    # x[:, 250:3:-3] in Python: columns 250, 247, ..., 4 (torch slices take no negative step).
    g.output(g.node("concat", [s, s], axis=0), "torch.cat([x[:, 4:251:3].flip(1)] * 2, dim=0)", "slice_concat")
    g.output(g.node("mul", [a, g.node("iota", [], shape=[384, 256], axis=0, dtype=DT("f32"))]),
             "x * torch.arange(384, device=x.device, dtype=x.dtype)[:, None]", "iota")
    gs.append(g)
    return gs


def benches():
    gs = []
    n = 64 * 1024 * 1024
    g = Graph("bench_sincos", "bench")
    x = g.input("x", "f32", [n])
    s, c = g.node("sin", [x]), g.node("cos", [x])
    g.output(g.node("add", [g.node("mul", [s, s]), g.node("mul", [c, c])]), "torch.sin(x)**2 + torch.cos(x)**2", "out")
    gs.append(g)
    g = Graph("bench_add", "bench")
    x, y = g.input("x", "f32", [n]), g.input("y", "f32", [n])
    g.output(g.node("add", [x, y]), "x + y", "out")
    gs.append(g)
    g = Graph("bench_kmeans", "bench")
    pts, means = g.input("X", "f32", [20_000_000, 2]), g.input("means", "f32", [8, 2])
    d = g.node("sub", [pts, g.node("unsqueeze", [means], axes=[1])])
    g.output(g.node("argmin", [g.node("norm", [d], axes=[2])], axis=0),
             "torch.argmin(torch.linalg.vector_norm(X[None] - means[:, None], dim=2), dim=0)", "out", conv="none")
    gs.append(g)
    g = Graph("bench_softmax", "bench")
    x = g.input("x", "f32", [32768, 4096])
    g.output(g.node("softmax", [x], axis=-1), "torch.softmax(x, dim=-1)", "out", rtol=1e-4)
    gs.append(g)
    g = Graph("bench_layernorm_gelu", "bench")
    x = g.input("x", "f32", [32768, 4096])
    g.output(g.node("gelu", [g.node("layer_norm", [x])]), "F.gelu(F.layer_norm(x, x.shape[-1:]))", "out", rtol=1e-4,
             atol=1e-4)
    gs.append(g)
    g = Graph("bench_lltm", "bench")
    B, S = 4096, 1024
    gates, c = g.input("gates", "f32", [B, 3 * S]), g.input("c", "f32", [B, S])
    ig = g.node("sigmoid", [g.node("slice", [gates], axes=[1], starts=[0], stops=[S])])
    og = g.node("sigmoid", [g.node("slice", [gates], axes=[1], starts=[S], stops=[2 * S])])
    cc = g.node("elu", [g.node("slice", [gates], axes=[1], starts=[2 * S], stops=[3 * S])])
    c_new = g.node("add", [c, g.node("mul", [cc, ig])])
    h = g.node("mul", [g.node("tanh", [c_new]), og])
    g.output(h, "torch.tanh(c + F.elu(gates[:, 2048:]) * torch.sigmoid(gates[:, :1024])) * torch.sigmoid(gates[:, 1024:2048])",
             "h", rtol=1e-5, atol=1e-6)
    g.output(c_new, "c + F.elu(gates[:, 2048:]) * torch.sigmoid(gates[:, :1024])", "c_new", rtol=1e-5, atol=1e-6)
    gs.append(g)
    return gs


def main():
    os.makedirs(OUT, exist_ok=True)
    graphs = suite() + benches()
    for g in graphs:
        with open(os.path.join(OUT, g.name + ".txtpb"), "w") as f:
            f.write(g.text())
    with open(os.path.join(OUT, "manifest.json"), "w") as f:  # one graph per line
        f.write('{"graphs": [\n')
        f.write(",\n".join(json.dumps(g.manifest(), sort_keys=True) for g in graphs))
        f.write("\n]}\n")
    print("wrote %d graphs to %s" % (len(graphs), OUT), file=sys.stderr)


if __name__ == "__main__":
    main()
