"""Primitive patterns written back as the ONNX operator they were split from (Relu, Clip,
HardSigmoid, HardSwish, LeakyRelu, MaxPool, AveragePool, Resize, Softmax, LayerNormalization,
InstanceNormalization, Split; for OpenVINO also Softplus and Mish, the latter in either of korch's
forms), or as a MatMul (a small linear resize along the last two axes), so that ONNX Runtime's and
OpenVINO's own kernels and fusions apply to a kernel graph as they do to the source model. ONNX
Runtime's NCHWc convolutions take Relu, Clip, HardSigmoid and HardSwish as fused activations but
not their primitives, and a Max or Min left between two convolutions costs two layout conversions
besides its own pass, so a kernel graph of such primitives runs slower than the source model. Its
Gather along an inner axis is slow: a bilinear resize runs many times faster as Resize than as
gathers and lerps."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from korch.backends.onnx_view import Fused, View, close
from korch.frontend.ops.sampling import COORDINATE_MODES, linear_taps, source_coords
from korch.ir.graph import Graph, Node
from korch.ir.prims import Prim, is_float, repeat_factor
from korch.rewrite.mish import CAPS


def _hard_sigmoid(view: View, i: int, node: Node) -> Fused | None:
    """min(max(x * alpha + beta, 0), 1) -> HardSigmoid(x)"""
    top = view.operand_and_scalar(node) if node.prim is Prim.MIN else None
    if not top or top[1] != 1.0 or not (low := view.inner(top[0], Prim.MAX)):
        return None
    clipped = view.operand_and_scalar(low[1])
    if not clipped or clipped[1] != 0.0 or not (shift := view.inner(clipped[0], Prim.ADD)):
        return None
    beta = view.operand_and_scalar(shift[1])
    if (
        not beta
        or not (scale := view.inner(beta[0], Prim.MUL))
        or not (alpha := view.operand_and_scalar(scale[1]))
    ):
        return None
    if not is_float(view.dtype(alpha[0])):
        return None
    absorbed = frozenset({i, low[0], shift[0], scale[0]})
    return Fused("HardSigmoid", (alpha[0],), absorbed, {"alpha": alpha[1], "beta": beta[1]})


def _hard_swish(view: View, i: int, node: Node) -> Fused | None:
    """x * HardSigmoid(x; 1/6, 0.5) -> HardSwish(x)"""
    if node.prim is not Prim.MUL:
        return None
    for x, gate in (node.inputs, node.inputs[::-1]):
        inner = view.inner(gate, Prim.MIN)
        sig = inner and _hard_sigmoid(view, *inner)
        if sig and sig.inputs == (x,) and close(sig.attrs["alpha"], 1 / 6) and close(sig.attrs["beta"], 0.5):
            return Fused("HardSwish", (x,), sig.absorbed | {i})
    return None


def _clip(view: View, i: int, node: Node) -> Fused | None:
    """min(max(x, lo), hi) -> Clip(x, lo, hi) with constant bounds"""
    top = view.operand_and_scalar(node) if node.prim is Prim.MIN else None
    low = top and view.inner(top[0], Prim.MAX)
    inner = low and view.operand_and_scalar(low[1])
    if not inner:
        return None
    dtype = view.dtype(inner[0])
    bounds = (np.array(inner[1], dtype), np.array(top[1], dtype))
    return Fused("Clip", (inner[0], *bounds), frozenset({i, low[0]}))


def _relu(view: View, i: int, node: Node) -> Fused | None:
    """max(x, 0) -> Relu(x)"""
    pair = view.operand_and_scalar(node) if node.prim is Prim.MAX else None
    return Fused("Relu", (pair[0],), frozenset({i})) if pair and pair[1] == 0.0 else None


def _leaky_relu(view: View, i: int, node: Node) -> Fused | None:
    """where(x < 0, x * alpha, x) -> LeakyRelu(x)"""
    if node.prim is not Prim.WHERE:
        return None
    cond, neg, x = node.inputs
    test = view.inner(cond, Prim.LT)
    scaled = view.inner(neg, Prim.MUL)
    if not test or not scaled or view.operand_and_scalar(test[1]) != (x, 0.0):
        return None
    alpha = view.operand_and_scalar(scaled[1])
    if not alpha or alpha[0] != x or not is_float(view.dtype(x)):
        return None
    return Fused("LeakyRelu", (x,), frozenset({i, test[0], scaled[0]}), {"alpha": alpha[1]})


def _chain(view: View, v: str, *prims: Prim) -> tuple[str, set[int]] | None:
    """(x, the nodes) for v = prims[0](prims[1](...(x))), each a unary primitive read once."""
    absorbed = set()
    for prim in prims:
        inner = view.inner(v, prim)
        if not inner:
            return None
        absorbed.add(inner[0])
        v = inner[1].inputs[0]
    return v, absorbed


def _softplus(view: View, i: int, node: Node) -> Fused | None:
    """max(x, 0) + log(exp(-|x|) + 1) -> Softplus(x) (korch.frontend.ops.elementwise.softplus_core,
    ONNX's form: log1p's error absolute, below an ulp of 1)"""
    if node.prim is not Prim.ADD:
        return None
    for relu_v, log_v in (node.inputs, node.inputs[::-1]):
        relu, log = view.inner(relu_v, Prim.MAX), view.inner(log_v, Prim.LOG)
        positive = relu and _relu(view, *relu)
        one = log and view.inner(log[1].inputs[0], Prim.ADD)
        tail = one and view.operand_and_scalar(one[1])  # (exp(-|x|), 1)
        if not positive or not tail or tail[1] != 1.0:
            continue
        x, found = positive.inputs[0], _chain(view, tail[0], Prim.EXP, Prim.NEG, Prim.ABS)
        if found and found[0] == x and is_float(view.dtype(x)):
            return Fused("Softplus", (x,), frozenset({i, relu[0], log[0], one[0], *found[1]}))
    return None


def _mish(view: View, i: int, node: Node) -> Fused | None:
    """x * tanh(softplus(x)) -> Mish(x): OpenVINO fuses Mish, not its primitives, into the
    convolution before it"""
    if node.prim is not Prim.MUL:
        return None
    for x, gate in (node.inputs, node.inputs[::-1]):
        tanh = view.inner(gate, Prim.TANH)
        inner = tanh and view.inner(tanh[1].inputs[0], Prim.ADD)
        soft = inner and _softplus(view, *inner)
        if soft and soft.inputs == (x,):
            return Fused("Mish", (x,), soft.absorbed | {i, tanh[0]})
    return None


def _mish_ratio(view: View, i: int, node: Node) -> Fused | None:
    """x * (m / (m + 2)), m = n * (n + 2), n = exp(min(x, cap)) -> Mish(x) (korch.rewrite.mish's
    form of it, at that dtype's cap)"""
    if node.prim is not Prim.MUL:
        return None
    for x, ratio in (node.inputs, node.inputs[::-1]):
        div = view.inner(ratio, Prim.DIV)
        m_v = div and div[1].inputs[0]
        den = div and view.inner(div[1].inputs[1], Prim.ADD)
        m = den and view.operand_and_scalar(den[1]) == (m_v, 2.0) and view.shared(m_v, Prim.MUL)
        if not m:
            continue
        for n_v, plus_v in (m[1].inputs, m[1].inputs[::-1]):
            plus = view.inner(plus_v, Prim.ADD)
            n = plus and view.operand_and_scalar(plus[1]) == (n_v, 2.0) and view.shared(n_v, Prim.EXP)
            low = n and view.inner(n[1].inputs[0], Prim.MIN)
            if low and view.operand_and_scalar(low[1]) == (x, CAPS.get(view.dtype(x))):
                return Fused("Mish", (x,), frozenset({i, div[0], den[0], m[0], plus[0], n[0], low[0]}))
    return None


def _pool_window(view: View, v: str, fill: float):
    """(x, absorbed, window attributes, pads) for window(pad(x, fill)) over x's spatial axes, when
    ONNX's pools can express it (kernel over every axis after N and C, pads below the kernel)."""
    win = view.inner(v, Prim.WINDOW)
    if not win:
        return None
    (i, node), a = win, win[1].a
    nd = len(a["kernel"])
    x, absorbed, pads = node.inputs[0], {i}, [0] * (2 * nd)
    padded = view.inner(x, Prim.PAD)
    if padded and padded[1].a["mode"] == "constant" and padded[1].a["value"] == fill:
        all_pads = padded[1].a["pads"]
        rank = len(all_pads) // 2
        if any(all_pads[: rank - nd]) or any(all_pads[rank : 2 * rank - nd]):
            return None
        x, pads = padded[1].inputs[0], [*all_pads[rank - nd : rank], *all_pads[2 * rank - nd :]]
        absorbed.add(padded[0])
    extents = [(k - 1) * d + 1 for k, d in zip(a["kernel"], a["dilations"])]
    if len(view.graph.types[x].shape) != nd + 2 or any(p >= e for p, e in zip(pads, extents * 2)):
        return None
    attrs = {"kernel_shape": list(a["kernel"]), "strides": list(a["strides"]), "pads": pads}
    return x, absorbed, attrs, list(a["dilations"])


def _pooled(view: View, reshape: Node, prim: Prim, fill: float):
    """window(pad(x)) reduced by `prim` over its kernel axes, then reshaped to the pool's output."""
    red = view.inner(reshape.inputs[0], prim)
    if not red:
        return None
    pooled_shape = view.graph.types[red[1].outputs[0]].shape
    nd = len(pooled_shape) // 2 - 1  # window: [N, C, *out, *kernel]
    if view.graph.types[reshape.outputs[0]].shape != pooled_shape[: len(pooled_shape) - nd]:
        return None
    found = _pool_window(view, red[1].inputs[0], fill)
    if not found:
        return None
    x, absorbed, attrs, dilations = found
    rank = len(pooled_shape)
    if len(attrs["kernel_shape"]) != nd or tuple(red[1].a["axes"]) != tuple(range(rank - nd, rank)):
        return None
    return x, absorbed | {red[0]}, attrs, dilations


def _max_pool(view: View, i: int, node: Node) -> Fused | None:
    """reshape(reduce_max(window(pad(x, -inf)))) -> MaxPool(x)"""
    found = _pooled(view, node, Prim.REDUCE_MAX, float("-inf")) if node.prim is Prim.RESHAPE else None
    if not found or not is_float(view.dtype(found[0])):
        return None
    x, absorbed, attrs, dilations = found
    return Fused("MaxPool", (x,), frozenset(absorbed | {i}), {**attrs, "dilations": dilations})


def _average_pool(view: View, i: int, node: Node) -> Fused | None:
    """reshape(reduce_sum(window(pad(x, 0)))) * (1 / kernel size) -> AveragePool(x), padding counted"""
    pair = view.operand_and_scalar(node) if node.prim is Prim.MUL else None
    shaped = pair and view.inner(pair[0], Prim.RESHAPE)
    found = shaped and _pooled(view, shaped[1], Prim.REDUCE_SUM, 0.0)
    if not found or not is_float(view.dtype(found[0])):
        return None
    x, absorbed, attrs, dilations = found
    if any(d != 1 for d in dilations) or not close(pair[1], 1.0 / np.prod(attrs["kernel_shape"])):
        return None
    return Fused("AveragePool", (x,), frozenset(absorbed | {i, shaped[0]}), {**attrs, "count_include_pad": 1})


def _nearest_factor(view: View, node: Node) -> tuple[str, int, int] | None:
    """(x, axis, s) when the gather repeats every index of x along axis s times (nearest upsampling
    by an integer factor)."""
    x, axis = node.inputs[0], node.a["axis"]
    factor = repeat_factor(view.graph.constants.get(node.inputs[1]), view.graph.types[x].shape[axis])
    return None if factor is None else (x, axis, factor)


def _nearest_resize(view: View, i: int, node: Node) -> Fused | None:
    """gathers repeating each index along some axes -> Resize(x, nearest, integer scales)"""
    step = _nearest_factor(view, node) if node.prim is Prim.GATHER else None
    if not step:
        return None
    x, scales, absorbed = node.inputs[0], {step[1]: step[2]}, {i}
    while (inner := view.inner(x, Prim.GATHER)) and (more := _nearest_factor(view, inner[1])):
        if more[1] in scales:
            break
        x, scales[more[1]] = more[0], more[2]
        absorbed.add(inner[0])
    if not is_float(view.dtype(x)):
        return None
    rank = len(view.graph.types[x].shape)
    factors = np.array([scales.get(a, 1) for a in range(rank)], "float32")
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return Fused("Resize", (x, "", factors), frozenset(absorbed), attrs)


def _linear_step(view: View, i: int, node: Node):
    """(x, axis, absorbed, lower index, upper index, weight vector) for one axis of a linear
    resize: g0 + (g1 - g0) * w, g0 and g1 gathers of x along that axis, w varying along it only."""
    if node.prim is not Prim.ADD:
        return None
    for low_v, step_v in (node.inputs, node.inputs[::-1]):
        low, step = view.shared(low_v, Prim.GATHER), view.inner(step_v, Prim.MUL)
        if not low or not step:
            continue
        x, axis = low[1].inputs[0], low[1].a["axis"]
        for diff_v, w_v in (step[1].inputs, step[1].inputs[::-1]):
            diff = view.inner(diff_v, Prim.SUB)
            high = diff and diff[1].inputs[1] == low_v and view.inner(diff[1].inputs[0], Prim.GATHER)
            if not high or high[1].inputs[0] != x or high[1].a["axis"] != axis:
                continue
            absorbed = {i, low[0], step[0], diff[0], high[0]}
            spread = view.inner(w_v, Prim.BROADCAST)
            if spread:
                absorbed.add(spread[0])
            weights = _along(
                view.value(spread[1].inputs[0] if spread else w_v), view.shape(node.outputs[0]), axis
            )
            lo, hi = view.value(low[1].inputs[1]), view.value(high[1].inputs[1])
            if weights is not None and lo is not None and hi is not None and lo.ndim == hi.ndim == 1:
                return x, axis, absorbed, lo, hi, weights
    return None


def _along(array: np.ndarray | None, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """The vector `array` holds along `axis` when, broadcast to `shape`, it varies along no other."""
    if array is None or array.ndim > len(shape):
        return None
    array = array.reshape((1,) * (len(shape) - array.ndim) + array.shape)
    first = array[tuple(slice(None) if k == axis else slice(0, 1) for k in range(len(shape)))]
    if not np.array_equal(np.broadcast_to(first, array.shape), array):
        return None
    return np.broadcast_to(first.reshape(-1), (shape[axis],))


# the coordinate transformation modes a linear Resize takes
_LINEAR_MODES = tuple(m for m in COORDINATE_MODES if m != "tf_half_pixel_for_nn")


def _linear_modes(in_len: int, out_len: int, lo, hi, weights) -> set[str]:
    """The coordinate transformation modes under which Resize (linear, output size out_len) reads
    these taps."""
    modes = set()
    for mode in _LINEAR_MODES:
        coords = source_coords(mode, out_len, in_len, out_len / in_len)
        want_lo, want_hi, want_w = linear_taps(coords, in_len, str(weights.dtype))
        if (
            np.array_equal(want_lo, lo)
            and np.array_equal(want_hi, hi)
            and np.allclose(want_w, weights, rtol=0, atol=1e-6)
        ):
            modes.add(mode)
    return modes


# A linear interpolation along one of the last two axes is a matmul by a constant matrix with two
# taps a row. ONNX Runtime's MatMul runs it faster than its Resize while the matmuls do little
# work per output element, and slower once they do much more (the crossover: BENCHMARKS.md).
MATMUL_RESIZE_FLOPS = 64  # per output element, at most


def _linear_resize(view: View, i: int, node: Node) -> Fused | None:
    """a linear interpolation along each of some spatial axes (two gathers and a lerp each) ->
    Resize(x, linear) to the output's size, unless it is cheaper as matmuls (`_lerp_matmul`)"""
    step = _linear_step(view, i, node)
    if not step:
        return None
    out_shape = view.shape(node.outputs[0])
    modes, axes, absorbed, flops, root = set(_LINEAR_MODES), set(), set(), 0, node
    while step:
        x, axis, more, lo, hi, weights = step
        if axis in axes:
            return None
        modes &= _linear_modes(view.shape(x)[axis], out_shape[axis], lo, hi, weights)
        axes.add(axis)
        absorbed |= more
        flops += 2 * view.shape(x)[axis] * math.prod(view.shape(root.outputs[0]))
        inner = view.shared(x, Prim.ADD)
        step = inner and _linear_step(view, *inner)
        root = inner and inner[1]
    rank = len(out_shape)
    # ONNX Runtime's CPU kernel interpolates the spatial axes of NCHW and NCDHW tensors
    if not modes or rank not in (4, 5) or not axes <= set(range(2, rank)) or not is_float(view.dtype(x)):
        return None
    if axes <= {rank - 2, rank - 1} and flops <= MATMUL_RESIZE_FLOPS * math.prod(out_shape):
        return None
    mode = next(m for m in _LINEAR_MODES if m in modes)
    attrs = {"mode": "linear", "coordinate_transformation_mode": mode}
    return Fused("Resize", (x, "", "", np.array(out_shape, "int64")), frozenset(absorbed), attrs)


def _lerp_matmul(view: View, i: int, node: Node) -> Fused | None:
    """a linear interpolation along one of the last two axes (two gathers and a lerp) -> MatMul
    by its constant matrix, from the right for the last axis, from the left for the one before"""
    step = _linear_step(view, i, node)
    if not step:
        return None
    x, axis, absorbed, lo, hi, weights = step
    rank = view.rank(x)
    if axis < rank - 2 or not is_float(view.dtype(x)):
        return None
    rows = np.arange(len(lo))
    matrix = np.zeros((len(lo), view.shape(x)[axis]), view.dtype(x))
    np.add.at(matrix, (rows, lo), 1 - weights)
    np.add.at(matrix, (rows, hi), weights)
    inputs = (x, np.ascontiguousarray(matrix.T)) if axis == rank - 1 else (matrix, x)
    return Fused("MatMul", inputs, frozenset(absorbed))


def _softmax(view: View, i: int, node: Node) -> Fused | None:
    """e / sum(e), e = exp(x - max(x)), over one axis -> Softmax(x)"""
    if node.prim is not Prim.DIV:
        return None
    e_v, total_v = node.inputs
    spread = view.inner(total_v, Prim.BROADCAST)
    total = spread and view.inner(spread[1].inputs[0], Prim.REDUCE_SUM)
    e = view.shared(e_v, Prim.EXP)
    if not total or not e or total[1].inputs[0] != e_v or len(total[1].a["axes"]) != 1:
        return None
    shifted = view.inner(e[1].inputs[0], Prim.SUB)
    top = shifted and view.inner(shifted[1].inputs[1], Prim.BROADCAST)
    peak = top and view.inner(top[1].inputs[0], Prim.REDUCE_MAX)
    x = shifted and shifted[1].inputs[0]
    if not peak or peak[1].inputs[0] != x or peak[1].a["axes"] != total[1].a["axes"]:
        return None
    if not is_float(view.dtype(x)):
        return None
    absorbed = frozenset({i, spread[0], total[0], e[0], shifted[0], top[0], peak[0]})
    return Fused("Softmax", (x,), absorbed, {"axis": total[1].a["axes"][0]})


def _mean_of(view: View, v: str):
    """(x, axes, absorbed) when v = reduce_sum(x) * (1 / the number of elements summed)."""
    scaled = view.inner(v, Prim.MUL)
    pair = scaled and view.operand_and_scalar(scaled[1])
    total = pair and view.inner(pair[0], Prim.REDUCE_SUM)
    if not total:
        return None
    x, axes = total[1].inputs[0], tuple(total[1].a["axes"])
    count = math.prod(view.shape(x)[a] for a in axes)
    return (x, axes, {scaled[0], total[0]}) if close(pair[1], 1.0 / count) else None


def _normalized(view: View, i: int, node: Node):
    """(x, axes, eps, absorbed) for (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps), written as a
    division by the root or a product with its reciprocal."""
    if node.prim not in (Prim.MUL, Prim.DIV):
        return None
    pairs = [node.inputs] if node.prim is Prim.DIV else [node.inputs, node.inputs[::-1]]
    for centered_v, spread_v in pairs:
        centered, spread = view.shared(centered_v, Prim.SUB), view.inner(spread_v, Prim.BROADCAST)
        root = spread
        if spread and node.prim is Prim.MUL:
            root = view.inner(spread[1].inputs[0], Prim.RECIPROCAL)
        root_v = root and (root[1].inputs[0] if node.prim is Prim.MUL else spread[1].inputs[0])
        sqrt = root and view.inner(root_v, Prim.SQRT)
        shifted = sqrt and view.inner(sqrt[1].inputs[0], Prim.ADD)
        eps = shifted and view.operand_and_scalar(shifted[1])
        var = eps and _mean_of(view, eps[0])
        square = var and view.inner(var[0], Prim.MUL)
        if not centered or not square or square[1].inputs != (centered_v, centered_v):
            continue
        x, mean_spread = centered[1].inputs
        spread_mean = view.inner(mean_spread, Prim.BROADCAST)
        mean = spread_mean and _mean_of(view, spread_mean[1].inputs[0])
        if not mean or mean[0] != x or mean[1] != var[1]:
            continue
        absorbed = {i, centered[0], spread[0], root[0], sqrt[0], shifted[0], square[0], spread_mean[0]}
        return x, var[1], eps[1], absorbed | var[2] | mean[2]
    return None


def _affine(view: View, i: int, node: Node, prim: Prim):
    """(inner value, parameter value, absorbed) for inner (*|+) broadcast(parameter), either order."""
    if node.prim is not prim:
        return None
    for inner_v, param_v in (node.inputs, node.inputs[::-1]):
        spread = view.inner(param_v, Prim.BROADCAST)
        if spread:
            return inner_v, spread[1].inputs[0], {i, spread[0]}
    return None


def _normalization(view: View, i: int, node: Node) -> Fused | None:
    """normalize(x) [* scale] [+ bias] over x's last axes -> LayerNormalization(x), over every
    axis after N and C -> InstanceNormalization(x)"""
    params, absorbed = {}, set()
    norm = _normalized(view, i, node)
    for name, prim in (("bias", Prim.ADD), ("scale", Prim.MUL)):
        found = None if norm else _affine(view, i, node, prim)
        if found:
            inner_v, params[name], more = found
            absorbed |= more
            chain = view.inner(inner_v, Prim.MUL, Prim.DIV)
            if chain is None:
                return None
            (i, node), norm = chain, _normalized(view, *chain)
    if not norm:
        return None
    x, axes, eps, more = norm
    shape, dtype = view.shape(x), view.dtype(x)
    rank = len(shape)
    if not is_float(dtype):
        return None
    absorbed = frozenset(absorbed | more)
    if axes == tuple(range(rank - len(axes), rank)):  # parameters per normalized element
        norm_shape = shape[rank - len(axes) :]
        scale = _parameter(view, params.get("scale"), norm_shape, np.ones(norm_shape, dtype))
        bias = _parameter(view, params.get("bias"), norm_shape, None)
        if scale is not None and (bias is not None or "bias" not in params):
            inputs = (x, scale) if bias is None else (x, scale, bias)
            return Fused("LayerNormalization", inputs, absorbed, {"axis": rank - len(axes), "epsilon": eps})
    if rank >= 3 and axes == tuple(range(2, rank)):  # parameters per channel
        channels = (shape[1],)
        scale = _parameter(view, params.get("scale"), channels, np.ones(channels, dtype))
        bias = _parameter(view, params.get("bias"), channels, np.zeros(channels, dtype))
        if scale is not None and bias is not None:
            return Fused("InstanceNormalization", (x, scale, bias), absorbed, {"epsilon": eps})
    return None


def _parameter(view: View, v: str | None, shape: tuple[int, ...], default):
    """A scale or bias as the operator takes it: the value itself when it has `shape`, else its
    known array reshaped to `shape` (when it holds one element per position), `default` when the
    pattern has none; None when neither works."""
    if v is None:
        return default
    if view.shape(v) == shape:
        return v
    array = view.value(v)
    if array is None or [d for d in array.shape if d != 1] != [d for d in shape if d != 1]:
        return None
    return array.reshape(shape)


# tried in order at each root, so a pattern that contains another comes first
PATTERNS: tuple[Callable[[View, int, Node], Fused | None], ...] = (
    _hard_swish,
    _hard_sigmoid,
    _clip,
    _relu,
    _leaky_relu,
    _max_pool,
    _average_pool,
    _nearest_resize,
    _linear_resize,
    _lerp_matmul,
    _softmax,
    _normalization,
)
# OpenVINO fuses Mish into the convolution before it; ONNX Runtime runs its Mish (an ONNX function
# of Softplus, Tanh and Mul) slower than the primitives (BENCHMARKS.md, design constants)
OPENVINO_PATTERNS = (_mish, _mish_ratio, _softplus, *PATTERNS)
POOLS = (_max_pool, _average_pool)  # (korch.backends.torch_ops writes these as aten's pools)


def fuse(graph: Graph, weights: Mapping[str, np.ndarray] | None = None, patterns=None) -> dict[int, Fused]:
    """Each pattern found (of `patterns`, default all), keyed by the index of its root (last) node.
    Roots are visited from the end, so the largest pattern ending at a node claims its primitives
    first. `weights` (known input values) let a linear resize's weights and a normalization's
    parameters be read."""
    view, found = View(graph, weights), {}
    for i in range(len(graph.nodes) - 1, -1, -1):
        if i in view.taken:
            continue
        for pattern in PATTERNS if patterns is None else patterns:
            fused = pattern(view, i, graph.nodes[i])
            if fused is not None and view.sealed(fused.absorbed, i):
                found[i] = fused
                view.taken |= fused.absorbed
                break
    return found


@dataclass(frozen=True)
class SplitGroup:
    """Slices of one value that tile it along one axis, written as one Split."""

    input: str
    axis: int
    sizes: tuple[int, ...]
    outputs: tuple[str, ...]  # in order along the axis
    absorbed: frozenset[int]


def split_groups(graph: Graph) -> dict[int, SplitGroup]:
    """Each group keyed by the index of its first slice (where the Split is written)."""
    pieces: dict[tuple[str, int], list[tuple[int, int, int]]] = {}  # (value, axis) -> (start, size, node)
    for i, node in enumerate(graph.nodes):
        if node.prim is not Prim.SLICE:
            continue
        a, dims = node.a, graph.types[node.inputs[0]].shape
        cut = [
            k
            for k, (start, size, dim) in enumerate(zip(a["starts"], a["sizes"], dims))
            if (start, size) != (0, dim)
        ]
        if len(cut) == 1 and all(step == 1 for step in a["steps"]) and a["sizes"][cut[0]] > 0:
            pieces.setdefault((node.inputs[0], cut[0]), []).append(
                (a["starts"][cut[0]], a["sizes"][cut[0]], i)
            )
    groups = {}
    for (value, axis), found in pieces.items():
        found.sort()
        ends = [start + size for start, size, _ in found]
        tiled = found[0][0] == 0 and ends[-1] == graph.types[value].shape[axis]
        if len(found) < 2 or not tiled or any(s != e for (s, _, _), e in zip(found[1:], ends)):
            continue
        nodes = [i for _, _, i in found]
        groups[min(nodes)] = SplitGroup(
            value,
            axis,
            tuple(size for _, size, _ in found),
            tuple(graph.nodes[i].outputs[0] for i in nodes),
            frozenset(nodes),
        )
    return groups
