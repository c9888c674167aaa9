"""ATen rules for layout, indexing, constants, pads, linear algebra and convolution (pooling and
resizing: rules_pool)."""

from __future__ import annotations

import math

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, normalize_axes
from korch.frontend.ops.attention import allowed_bias, attend, band_bias, repeat_heads
from korch.frontend.ops.layout import (
    affine_index,
    gather_elements_core,
    row_strides,
    slice_bounds,
    tile_core,
    wrap_negative,
)
from korch.frontend.ops.linear import add_bias, matmul
from korch.frontend.torch.aten import AtenNode, aten, int_list, operand, torch_dtype_name, vector
from korch.ir.prims import Prim, is_float

# ------------------------------------------------------------------ reshaping


@aten(
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.unsqueeze.default",
    "aten.squeeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.flatten.using_ints",
    "aten.view_copy.default",
)
def view(ctx: Lowering, n: AtenNode) -> str:
    return ctx.reshape(n["self"], n.out.shape)


@aten("aten.permute.default", "aten.permute_copy.default")
def permute(ctx: Lowering, n: AtenNode) -> str:
    rank = ctx.rank(n["self"])
    return ctx.transpose(n["self"], [d % rank if rank else 0 for d in n["dims"]])


@aten("aten.transpose.int", "aten.t.default")
def transpose(ctx: Lowering, n: AtenNode) -> str:
    x = n["self"]
    rank = ctx.rank(x)
    if rank < 2:
        return x
    d0, d1 = (n["dim0"] % rank, n["dim1"] % rank) if "dim0" in n.params else (0, 1)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.transpose(x, perm)


@aten("aten.expand.default")
def expand(ctx: Lowering, n: AtenNode) -> str:
    x, shape = n["self"], n.out.shape
    x = ctx.reshape(x, (1,) * (len(shape) - ctx.rank(x)) + ctx.shape(x))
    return ctx.broadcast_to(x, shape)


@aten("aten.repeat.default")
def repeat(ctx: Lowering, n: AtenNode) -> str:
    x, reps = n["self"], list(n["repeats"])
    x = ctx.reshape(x, (1,) * (len(reps) - ctx.rank(x)) + ctx.shape(x))
    return tile_core(ctx, x, reps)


@aten("aten.cat.default")
def cat(ctx: Lowering, n: AtenNode) -> str:
    values = [ctx.cast(v, n.out.dtype) for v in n["tensors"] if ctx.shape(v) != (0,)]
    (axis,) = normalize_axes([n["dim"]], ctx.rank(values[0]))
    return ctx.concat(values, axis)


# -------------------------------------------------------------------- slicing


@aten("aten.slice.Tensor")
def slice_(ctx: Lowering, n: AtenNode) -> str:
    x = n["self"]
    shape = ctx.shape(x)
    (axis,) = normalize_axes([n["dim"]], len(shape))
    start = 0 if n["start"] is None else n["start"]
    end = shape[axis] if n["end"] is None else n["end"]
    first, size = slice_bounds(shape[axis], start, end, n["step"])
    return ctx.slice_axis(x, axis, first if size else 0, size, n["step"] if size else 1)


@aten("aten.narrow_copy.default")
def narrow(ctx: Lowering, n: AtenNode) -> str:
    x = n["self"]
    (axis,) = normalize_axes([n["dim"]], ctx.rank(x))
    start = n["start"] + ctx.shape(x)[axis] if n["start"] < 0 else n["start"]
    return ctx.slice_axis(x, axis, start, n["length"])


@aten("aten.select.int")
def select(ctx: Lowering, n: AtenNode) -> str:
    x = n["self"]
    (axis,) = normalize_axes([n["dim"]], ctx.rank(x))
    index = n["index"] % ctx.shape(x)[axis]
    return ctx.reshape(ctx.slice_axis(x, axis, index, 1), n.out.shape)


@aten("aten.split_with_sizes.default", "aten.split.Tensor", "aten.unbind.int", "aten.unbind_copy.int")
def split(ctx: Lowering, n: AtenNode) -> list[str]:
    x = n["self"]
    (axis,) = normalize_axes([n["dim"]], ctx.rank(x))
    outs, offset = [], 0
    for t in n.out_types:
        size = t.shape[axis] if "unbind" not in n.target else 1
        outs.append(ctx.reshape(ctx.slice_axis(x, axis, offset, size), t.shape))
        offset += size
    return outs


# ------------------------------------------------------------------- indexing


@aten("aten.embedding.default")
def embedding(ctx: Lowering, n: AtenNode) -> str:
    return ctx.emit(Prim.GATHER, n["weight"], n["indices"], axis=0)


@aten("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")
def embedding_bag(ctx: Lowering, n: AtenNode) -> list[str | None]:
    """EmbeddingBag: the indexed rows (times per_sample_weights), combined per bag by a scatter
    into [bags, D]: summed, averaged, or their maximum (an empty bag gives zeros). An index's bag
    is the number of bag starts (offsets) at or before it, less one (0 before the first: torch
    requires offsets[0] = 0, random check inputs do not); rows at padding_idx take no part. Only
    the first output is lowered: the others serve the backward pass."""
    weight, idx, mode = n["weight"], n["indices"], n["mode"]
    (count,), (bags, width) = ctx.shape(idx), n.out.shape
    dtype = ctx.dtype(weight)

    def scatter(fill: float, shape: tuple[int, ...], updates: str, how: str) -> str:
        return ctx.emit(
            Prim.SCATTER, ctx.broadcast_to(ctx.scalar(fill, dtype), shape), bag, updates, reduction=how
        )

    rows = ctx.emit(Prim.GATHER, weight, idx, axis=0)
    if n["per_sample_weights"] is not None:
        rows = ctx.elementwise(Prim.MUL, rows, ctx.reshape(n["per_sample_weights"], (count, 1)))
    starts = ctx.reshape(ctx.slice_axis(ctx.cast(n["offsets"], "int64"), 0, 0, bags), (1, bags))
    after = ctx.const(np.arange(1, count + 1, dtype="int64").reshape(count, 1))
    begun = ctx.cast(ctx.elementwise(Prim.LT, starts, after), "int64")  # (start <= position)
    bag = ctx.reduce(Prim.REDUCE_SUM, begun, [1], keepdims=False)
    bag = ctx.elementwise(
        Prim.MAX, ctx.elementwise(Prim.SUB, bag, ctx.scalar(1, "int64")), ctx.scalar(0, "int64")
    )
    taken = ctx.broadcast_to(ctx.scalar(True, "bool"), (count,))
    if n["padding_idx"] >= 0:
        padding = ctx.elementwise(Prim.EQ, idx, ctx.scalar(n["padding_idx"], ctx.dtype(idx)))
        taken = ctx.elementwise(Prim.NOT, padding)
    members = ctx.reshape(scatter(0, (bags,), ctx.cast(taken, dtype), "add"), (bags, 1))
    taken = ctx.reshape(taken, (count, 1))
    if mode == 2:  # max
        top = scatter(
            -np.inf,
            (bags, width),
            ctx.elementwise(Prim.WHERE, taken, rows, ctx.scalar(-np.inf, dtype)),
            "max",
        )
        empty = ctx.elementwise(Prim.EQ, members, ctx.scalar(0, dtype))
        return [ctx.elementwise(Prim.WHERE, empty, ctx.scalar(0, dtype), top), None, None, None]
    total = scatter(0, (bags, width), ctx.elementwise(Prim.WHERE, taken, rows, ctx.scalar(0, dtype)), "add")
    if mode == 1:  # mean
        total = ctx.elementwise(Prim.DIV, total, ctx.elementwise(Prim.MAX, members, ctx.scalar(1, dtype)))
    return [total, None, None, None]


@aten("aten._trilinear.default")
def bilinear(ctx: Lowering, n: AtenNode) -> str:
    """F.bilinear's form (y[n, o] = sum x1[n, i] w[o, i, j] x2[n, j]): a matmul of x2 with w's
    rows [o * i, j], then x1 times that, summed over i. _trilinear's other forms are refused."""
    x1, w, x2 = n["i1"], n["i2"], n["i3"]
    layout = [list(n[k]) for k in ("expand1", "expand2", "expand3", "sumdim")]
    if layout != [[1, 3], [0], [1, 2], [2, 3]] or ctx.rank(x1) != 2 or ctx.rank(x2) != 2:
        raise KorchError(f"_trilinear other than F.bilinear's (expansions and sums {layout})")
    (rows, left), (out, _, right) = ctx.shape(x1), ctx.shape(w)
    weight = ctx.transpose(ctx.reshape(w, (out * left, right)), [1, 0])
    mixed = ctx.reshape(matmul(ctx, x2, weight), (rows, out, left))
    product = ctx.elementwise(Prim.MUL, ctx.reshape(x1, (rows, 1, left)), mixed)
    return ctx.reduce(Prim.REDUCE_SUM, product, [2], keepdims=False)


@aten("aten.index_select.default")
def index_select(ctx: Lowering, n: AtenNode) -> str:
    x = vector(ctx, n["self"])
    (axis,) = normalize_axes([n["dim"]], ctx.rank(x))
    index = _wrapped(ctx, n["index"], ctx.shape(x)[axis])
    return ctx.reshape(ctx.emit(Prim.GATHER, x, index, axis=axis), n.out.shape)


@aten("aten.gather.default")
def gather(ctx: Lowering, n: AtenNode) -> str:
    data, index = vector(ctx, n["self"]), vector(ctx, n["index"])
    return ctx.reshape(gather_elements_core(ctx, data, index, n["dim"]), n.out.shape)


@aten("aten.unfold.default")
def unfold(ctx: Lowering, n: AtenNode) -> str:
    """Tensor.unfold(dimension, size, step): the windows along one axis, each a new last axis (a
    window primitive over that axis moved last, the window count moved back)."""
    x = vector(ctx, n["self"])
    rank = ctx.rank(x)
    (axis,) = normalize_axes([n["dimension"]], rank)
    last = ctx.transpose(x, [a for a in range(rank) if a != axis] + [axis])
    windows = ctx.emit(Prim.WINDOW, last, kernel=(n["size"],), strides=(n["step"],), dilations=(1,))
    back = [*range(axis), rank - 1, *range(axis, rank - 1), rank]
    return ctx.reshape(ctx.transpose(windows, back), n.out.shape)


@aten("aten.flip.default")
def flip(ctx: Lowering, n: AtenNode) -> str:
    """A gather of the reversed positions along each flipped axis."""
    x = n["self"]
    for axis in normalize_axes(n["dims"], ctx.rank(x)) if ctx.rank(x) else ():
        size = ctx.shape(x)[axis]
        if size > 1:
            x = ctx.emit(Prim.GATHER, x, ctx.const(np.arange(size - 1, -1, -1, dtype="int64")), axis=axis)
    return x


def _wrapped(ctx: Lowering, index: str, dim: int) -> str:
    """Constant negative indices counted from the end, as torch does."""
    value = ctx.const_value(index)
    return (
        index
        if value is None or not (value < 0).any()
        else ctx.const(np.where(value < 0, value + dim, value))
    )


@aten("aten.index.Tensor")
def index(ctx: Lowering, n: AtenNode) -> str:
    """Advanced indexing: the indexed axes merged into one, and one gather of the flat positions
    sum(wrap(index_k) * stride_k) (the index tensors broadcast together; folded when they are all
    constants). Index tensors separated by slices put their broadcast axes first, as torch does:
    the indexed axes are moved to the front, where they are adjacent."""
    x, indices = n["self"], list(n["indices"])
    axes = [i for i, v in enumerate(indices) if v is not None]
    if any(ctx.dtype(indices[a]) == "bool" for a in axes):
        raise KorchError("boolean mask indexing has a data-dependent shape")
    if axes != list(range(axes[0], axes[-1] + 1)):
        x = ctx.transpose(x, axes + [a for a in range(ctx.rank(x)) if a not in axes])
        indices, axes = [indices[a] for a in axes], list(range(len(axes)))
    shape = ctx.shape(x)
    if len(axes) == 1:
        return ctx.emit(Prim.GATHER, x, _wrapped(ctx, indices[axes[0]], shape[axes[0]]), axis=axes[0])
    dims = [shape[a] for a in axes]
    merged = ctx.reshape(x, shape[: axes[0]] + (math.prod(dims),) + shape[axes[-1] + 1 :])
    values = [ctx.const_value(indices[a]) for a in axes]
    if all(v is not None for v in values):
        wrapped = [np.where(v < 0, v + d, v) for v, d in zip(values, dims)]
        flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*wrapped)), dims).astype("int64")
        return ctx.emit(Prim.GATHER, merged, ctx.const(flat), axis=axes[0])
    terms = []
    for a, d, stride in zip(axes, dims, row_strides(dims)):
        idx = wrap_negative(ctx, ctx.cast(indices[a], "int64"), d)
        terms.append(affine_index(ctx, idx, stride, np.zeros((), "int64")))
    flat = terms[0]
    for term in terms[1:]:
        flat = ctx.elementwise(Prim.ADD, flat, term)
    return ctx.emit(Prim.GATHER, merged, flat, axis=axes[0])


# ------------------------------------------------------------------ constants


@aten("aten.arange.default", "aten.arange.start", "aten.arange.start_step", "aten.scalar_tensor.default")
def factory(ctx: Lowering, n: AtenNode) -> str:
    """Tensors made from scalars alone are computed here, once, with torch itself."""
    from korch.ir.tensors import to_numpy

    kwargs = {k: v for k, v in n.params.items() if k not in ("layout", "device", "pin_memory")}
    return ctx.const(to_numpy(n.op(**kwargs)))


@aten("aten.full.default", "aten.zeros.default", "aten.ones.default")
def full(ctx: Lowering, n: AtenNode) -> str:
    value = {"aten.zeros.default": 0, "aten.ones.default": 1}.get(n.target, n.get("fill_value"))
    return ctx.broadcast_to(operand(ctx, value, n.out.dtype), n.out.shape)


@aten("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")
def full_like(ctx: Lowering, n: AtenNode) -> str:
    value = {"aten.zeros_like.default": 0, "aten.ones_like.default": 1}.get(n.target, n.get("fill_value"))
    return ctx.broadcast_to(operand(ctx, value, n.out.dtype), n.out.shape)


@aten(
    "aten.empty.memory_format",
    "aten.empty_like.default",
    "aten.empty_permuted.default",
    "aten.empty_strided.default",
    "aten.new_empty.default",
    "aten.new_empty_strided.default",
)
def empty(ctx: Lowering, n: AtenNode) -> str:
    """Uninitialized memory, which a program writes before it reads (`p = torch.empty_like(q);
    p[q] = torch.arange(n)`, an inverse permutation): any values are right, and korch gives zeros
    so that every backend computes the same."""
    return ctx.broadcast_to(operand(ctx, 0, n.out.dtype), n.out.shape)


# ---------------------------------------------------------------------- pads


def _torch_pads(rank: int, pad) -> tuple[list[int], list[int]]:
    """torch lists (begin, end) pairs from the last axis backwards; korch wants begins then ends."""
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return begins, ends


def _pad(ctx: Lowering, x: str, pad, mode: str, value=0.0) -> str:
    begins, ends = _torch_pads(ctx.rank(x), pad)
    for axis, (b, e) in enumerate(zip(begins, ends)):
        if b < 0 or e < 0:  # negative pads crop
            lo, hi = max(-b, 0), max(-e, 0)
            x = ctx.slice_axis(x, axis, lo, ctx.shape(x)[axis] - lo - hi)
    pads = [max(p, 0) for p in begins + ends]
    if not any(pads):
        return x
    if not is_float(ctx.dtype(x)):
        value = int(value)
    return ctx.emit(Prim.PAD, x, pads=pads, mode=mode, value=float(value) if mode == "constant" else 0.0)


@aten("aten.constant_pad_nd.default")
def constant_pad(ctx: Lowering, n: AtenNode) -> str:
    return _pad(ctx, n["self"], n["pad"], "constant", n["value"])


for _nd in (1, 2, 3):
    aten(f"aten.reflection_pad{_nd}d.default")(lambda ctx, n: _pad(ctx, n["self"], n["padding"], "reflect"))
    aten(f"aten.replication_pad{_nd}d.default")(lambda ctx, n: _pad(ctx, n["self"], n["padding"], "edge"))


# --------------------------------------------------------------------- linear


def _batched_matmul(ctx: Lowering, a: str, b: str, out_shape) -> str:
    """A 2-D/3-D matmul whose operands were flattened from higher-rank tensors (view -> mm ->
    view) runs on the unflattened operands; the view back onto them then collapses."""
    if hasattr(ctx, "unmerged"):
        a_root = ctx.unmerged(a, 2 if ctx.rank(a) == 3 else 1)
        b_root = ctx.unmerged(b, 2) if ctx.rank(b) == 3 else b
        same_batch = ctx.rank(b) == 2 or ctx.shape(a_root)[:-2] == ctx.shape(b_root)[:-2]
        if a_root != a and same_batch:
            return ctx.reshape(ctx.emit(Prim.MATMUL, a_root, b_root), out_shape)
    return ctx.emit(Prim.MATMUL, a, b)


@aten("aten.mm.default", "aten.bmm.default")
def mm(ctx: Lowering, n: AtenNode) -> str:
    return _batched_matmul(ctx, n["self"], n["mat2"], n.out.shape)


@aten("aten.matmul.default")
def matmul_rule(ctx: Lowering, n: AtenNode) -> str:
    return matmul(ctx, n["self"], n["other"])


@aten("aten.addmm.default")
def addmm(ctx: Lowering, n: AtenNode) -> str:
    # on the rows before a flattening view: the bias is added before the view back, as in an
    # ONNX MatMul + Add
    rows = ctx.unmerged(n["mat1"], 1) if hasattr(ctx, "unmerged") else n["mat1"]
    y = ctx.emit(Prim.MATMUL, rows, n["mat2"])
    dtype = ctx.dtype(y)
    if n["alpha"] != 1:
        y = ctx.elementwise(Prim.MUL, y, ctx.scalar(n["alpha"], dtype))
    if n["beta"] != 0:
        bias = (
            n["self"]
            if n["beta"] == 1
            else ctx.elementwise(Prim.MUL, n["self"], ctx.scalar(n["beta"], dtype))
        )
        y = ctx.elementwise(Prim.ADD, y, bias)
    return ctx.reshape(y, n.out.shape)


def _scaled_sum(ctx: Lowering, n: AtenNode, product: str) -> str:
    """beta * self + alpha * product, as addmm, addmv and addbmm define it (beta 0 ignores self)."""
    dtype = ctx.dtype(product)
    y = product if n["alpha"] == 1 else ctx.elementwise(Prim.MUL, product, ctx.scalar(n["alpha"], dtype))
    if n["beta"] == 0:
        return ctx.broadcast_to(y, n.out.shape)
    bias = n["self"] if n["beta"] == 1 else ctx.elementwise(Prim.MUL, n["self"], ctx.scalar(n["beta"], dtype))
    return ctx.elementwise(Prim.ADD, y, bias)


@aten("aten.addmv.default")
def addmv(ctx: Lowering, n: AtenNode) -> str:
    vec = ctx.reshape(n["vec"], (ctx.shape(n["vec"])[0], 1))
    product = ctx.reshape(ctx.emit(Prim.MATMUL, n["mat"], vec), n.out.shape)
    return ctx.reshape(_scaled_sum(ctx, n, product), n.out.shape)


@aten("aten.addbmm.default")
def addbmm(ctx: Lowering, n: AtenNode) -> str:
    """The sum over the batch of batch1[b] @ batch2[b] is one matmul of [n, B*m] by [B*m, p]."""
    b, rows, inner = ctx.shape(n["batch1"])
    cols = ctx.shape(n["batch2"])[2]
    left = ctx.reshape(ctx.transpose(n["batch1"], (1, 0, 2)), (rows, b * inner))
    product = ctx.emit(Prim.MATMUL, left, ctx.reshape(n["batch2"], (b * inner, cols)))
    return ctx.reshape(_scaled_sum(ctx, n, product), n.out.shape)


@aten("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(ctx: Lowering, n: AtenNode) -> str:
    """torch's attention over [..., heads, seq, size]: a boolean mask says where to attend, a float
    one is added to the scores; is_causal keeps the top-left lower triangle; enable_gqa shares
    each key/value head among consecutive query heads. A query that the mask lets attend no key
    gets zeros, as in torch. (Kept whole by the export: torch's decomposition of it can give
    strides that a later view of the exported graph rejects, GPT-2 for one.)"""
    q, k, v, mask = n["query"], n["key"], n["value"], n.get("attn_mask")
    if n.get("dropout_p", 0.0):
        raise KorchError("scaled_dot_product_attention with dropout (random numbers) is not supported")
    dtype = ctx.dtype(q)
    bias = None
    if mask is not None:
        bias = allowed_bias(ctx, mask, dtype) if ctx.dtype(mask) == "bool" else ctx.cast(mask, dtype)
    if n.get("is_causal", False):  # (key j for query i where i - j >= 0)
        causal = band_bias(ctx, ctx.shape(q)[-2], ctx.shape(k)[-2], 0, 0, None, dtype)
        bias = causal if bias is None else ctx.elementwise(Prim.ADD, bias, causal)
    q_heads, kv_heads = ctx.shape(q)[-3], ctx.shape(k)[-3]
    if n.get("enable_gqa", False) and q_heads != kv_heads:
        if q_heads % kv_heads:
            raise KorchError(f"{q_heads} query heads do not share {kv_heads} key/value heads evenly")
        k, v = repeat_heads(ctx, k, q_heads // kv_heads), repeat_heads(ctx, v, q_heads // kv_heads)
    y, _ = attend(ctx, q, k, v, bias, mask is not None, n.get("scale"))
    return y


@aten("transformers.grouped_mm_fallback.default")
def grouped_mm(ctx: Lowering, n: AtenNode) -> str:
    """A mixture of experts' matmul, as Hugging Face transformers exports torch._grouped_mm for
    float32 (its custom op `transformers::grouped_mm_fallback`): x [S, K]'s rows sorted by
    expert, offs[e] the end of expert e's rows; one grouped_matmul primitive."""
    return ctx.emit(Prim.GROUPED_MATMUL, n["input"], n["weight"], n["offs"])


@aten("aten._grouped_mm.default")
def aten_grouped_mm(ctx: Lowering, n: AtenNode) -> str:
    """torch._grouped_mm (torch.nn.functional.grouped_mm), what transformers calls for bfloat16
    mixtures of experts: x [S, K] times mat2 [E, K, N] grouped by offs, one grouped_matmul (torch
    leaves the rows past the last offset uninitialized; they are zeros here); without offs, 3-d
    times 3-d is a batched matmul."""
    x, w, offs = n["self"], n["mat2"], n["offs"]
    if n["bias"] is not None:
        ctx.unsupported("_grouped_mm with a bias")
    if n["out_dtype"] is not None and torch_dtype_name(n["out_dtype"]) != ctx.dtype(x):
        ctx.unsupported("_grouped_mm with an out_dtype other than its inputs'")
    ranks = (ctx.rank(x), ctx.rank(w))
    if ranks == (2, 3) and offs is not None:
        return ctx.emit(Prim.GROUPED_MATMUL, x, w, offs)
    if ranks == (3, 3) and offs is None:
        return matmul(ctx, x, w)
    ctx.unsupported(
        f"_grouped_mm of rank-{ranks[0]} by rank-{ranks[1]} operands with{'out' * (offs is None)} offs"
    )


@aten("aten.convolution.default")
def convolution(ctx: Lowering, n: AtenNode) -> str:
    x, w = n["input"], n["weight"]
    nd = ctx.rank(w) - 2
    attrs = dict(
        strides=int_list(n["stride"], nd, 1),
        pads=int_list(n["padding"], nd, 0) * 2,
        dilations=int_list(n["dilation"], nd, 1),
        group=n["groups"],
    )
    if n["transposed"]:
        y = ctx.emit(Prim.CONV_TRANSPOSE, x, w, output_padding=int_list(n["output_padding"], nd, 0), **attrs)
        return add_bias(ctx, y, n["bias"])
    y = add_bias(ctx, ctx.emit(Prim.CONV, x, w, **attrs), n["bias"])
    if hasattr(ctx, "convs"):  # a batch norm after it may fold into its weights
        ctx.convs[y] = (x, w, n["bias"], attrs)
    return y
