"""Each primitive's numpy reference: (operand arrays, attributes) -> result arrays, the values that
define the primitive. The table in korch.ir.prims names the reference of each primitive;
korch.ir.prims.Prim.ref runs one (and computes bfloat16 in float32)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from korch.ir.tensor_type import FLOAT_DTYPES

# ---------------------------------------------------------------- elementwise


def unary(fn: Callable):
    """fn on the one operand, the result in the operand's dtype."""
    return lambda xs, attrs: [np.asarray(fn(xs[0]), dtype=xs[0].dtype)]


def binary(fn: Callable):
    return lambda xs, attrs: [np.asarray(fn(xs[0], xs[1]))]


def _int_div(a, b):
    q = np.abs(a) // np.abs(b)
    return (q * np.sign(a) * np.sign(b)).astype(a.dtype)


def div(a, b):
    """Integers divide truncating towards zero (as in C and ONNX), not flooring (numpy's //)."""
    return _int_div(a, b) if a.dtype.kind in "iu" else np.divide(a, b)


def pow_(a, b):
    if a.dtype.kind in "iu":  # numpy refuses negative integer powers
        return np.trunc(np.power(a.astype("float64"), b.astype("float64"))).astype(a.dtype)
    return np.power(a, b).astype(a.dtype, copy=False)


def cast(xs, a):
    return [np.asarray(xs[0]).astype(a["to"])]


def where(xs, a):
    return [np.asarray(np.where(*xs))]


# ------------------------------------------------------------------ broadcast


def broadcast(xs, a):
    return [np.broadcast_to(xs[0], tuple(a["shape"]))]


# --------------------------------------------------------------------- reduce


def _reducing(fn: Callable):
    def ref(xs, attrs):
        x = xs[0]
        return [np.asarray(fn(x, axis=tuple(attrs["axes"]), keepdims=True), dtype=x.dtype)]

    return ref


def _extreme(dtype, lowest: bool):
    if str(dtype) in FLOAT_DTYPES:
        return -np.inf if lowest else np.inf
    info = np.iinfo(dtype)
    return info.min if lowest else info.max


reduce_sum = _reducing(lambda x, **kw: np.sum(x, dtype=x.dtype, **kw))
reduce_prod = _reducing(lambda x, **kw: np.prod(x, dtype=x.dtype, **kw))
# the initial value makes reductions over empty axes well defined (-inf for max, as in ONNX Runtime)
reduce_max = _reducing(lambda x, **kw: np.max(x, initial=_extreme(x.dtype, True), **kw))
reduce_min = _reducing(lambda x, **kw: np.min(x, initial=_extreme(x.dtype, False), **kw))


def argmax(xs, a):
    return [np.argmax(xs[0], axis=a["axis"], keepdims=True).astype("int64")]


def argmin(xs, a):
    return [np.argmin(xs[0], axis=a["axis"], keepdims=True).astype("int64")]


def argsort(xs, a):
    """Stable: equal values keep their order, descending too; NaN sorts as the largest value."""
    x, axis = xs[0], a["axis"]
    if not a["descending"]:
        return [np.argsort(x, axis=axis, kind="stable").astype("int64")]
    backwards = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return [np.flip(x.shape[axis] - 1 - backwards, axis).astype("int64")]


# --------------------------------------------------------------------- layout


def reshape(xs, a):
    return [np.reshape(xs[0], tuple(a["shape"]))]


def transpose(xs, a):
    return [np.transpose(xs[0], tuple(a["perm"]))]


def slice_(xs, a):
    index = []
    for start, step, size in zip(a["starts"], a["steps"], a["sizes"]):
        stop = start + size * step
        index.append(slice(start, stop if stop >= 0 else None, step))
    return [xs[0][tuple(index)]]


def concat(xs, a):
    return [np.concatenate(xs, axis=a["axis"])]


def pad(xs, a):
    x = xs[0]
    widths = list(zip(a["pads"][: x.ndim], a["pads"][x.ndim :]))
    if a["mode"] == "constant":
        return [np.pad(x, widths, mode="constant", constant_values=a["value"])]
    return [np.pad(x, widths, mode=a["mode"])]


def gather(xs, a):
    return [np.take(xs[0], xs[1], axis=a["axis"])]


def window(xs, a):
    x = xs[0]
    kernel, strides, dil = a["kernel"], a["strides"], a["dilations"]
    k = len(kernel)
    axes = tuple(range(x.ndim - k, x.ndim))
    extents = [(kk - 1) * d + 1 for kk, d in zip(kernel, dil)]
    v = sliding_window_view(x, extents, axis=axes)
    lead = (slice(None),) * (x.ndim - k)
    return [v[lead + tuple(slice(None, None, s) for s in strides) + tuple(slice(None, None, d) for d in dil)]]


_SCATTER_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter(xs, a):
    data, idx, upd = xs
    out = data.copy()
    if a["reduction"] == "none":
        out[idx] = upd  # (a repeated index: the last update wins, as in ONNX Runtime on CPU)
    else:
        _SCATTER_UFUNCS[a["reduction"]].at(out, idx, upd)
    return [out]


# --------------------------------------------------------------------- linear


def matmul(xs, a):
    return [np.matmul(xs[0], xs[1])]


def _grouped_rows(ends: np.ndarray, rows: int) -> np.ndarray:
    """Each row's group: how many ends are <= the row (E, past the last end: no group)."""
    return (ends.reshape(-1, 1) <= np.arange(rows)).sum(0)


def grouped_matmul(xs, a):
    """A mixture of experts' matmul: row s of x times w[g(s)], g(s) = how many ends are <= s (rows
    past the last end are zero); with sorted ends, the rows of group e are ends[e-1] .. ends[e] - 1."""
    x, w, ends = xs
    group = _grouped_rows(ends, x.shape[0])
    out = np.zeros((x.shape[0], w.shape[2]), dtype=x.dtype)
    for e in range(w.shape[0]):
        mine = group == e
        out[mine] = x[mine] @ w[e]
    return [out]


def conv(xs, a):
    x, w = xs
    nd = w.ndim - 2
    g = a["group"]
    pads = a["pads"]
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    win = window([x], {"kernel": w.shape[2:], "strides": a["strides"], "dilations": a["dilations"]})[0]
    n, c = x.shape[:2]
    out_sp = win.shape[2 : 2 + nd]
    if g == 1:
        # im2col then one BLAS call: [N, *out, C*K] @ [C*K, M]
        cols = np.moveaxis(win, 1, 1 + nd).reshape(n, *out_sp, -1)
        y = cols @ w.reshape(w.shape[0], -1).T
        return [np.ascontiguousarray(np.moveaxis(y, -1, 1))]
    letters = "hijkl"[:nd]
    kl = "pqrst"[:nd]
    win = win.reshape(n, g, c // g, *out_sp, *w.shape[2:])
    wg = w.reshape(g, w.shape[0] // g, c // g, *w.shape[2:])
    y = np.einsum(f"ngc{letters}{kl},gmc{kl}->ngm{letters}", win, wg, optimize=True)
    return [np.ascontiguousarray(y.reshape(n, w.shape[0], *out_sp), dtype=x.dtype)]


def conv_transpose(xs, a):
    """Scatter-add one matmul per kernel offset into the full output, then crop the pads."""
    x, w = xs
    nd = w.ndim - 2
    g, s, d, pads, opad = a["group"], a["strides"], a["dilations"], a["pads"], a["output_padding"]
    n, c = x.shape[:2]
    m_g = w.shape[1]
    in_sp = x.shape[2:]
    full = [(in_sp[i] - 1) * s[i] + (w.shape[2 + i] - 1) * d[i] + 1 + opad[i] for i in range(nd)]
    y = np.zeros((n, g, m_g, *full), dtype=x.dtype)
    xg = x.reshape(n, g, c // g, -1)
    wg = w.reshape(g, c // g, m_g, *w.shape[2:])
    for offset in np.ndindex(*w.shape[2:]):
        wk = wg[(slice(None),) * 3 + offset]  # [g, c/g, m/g]
        contrib = np.einsum("ngcp,gcm->ngmp", xg, wk).reshape(n, g, m_g, *in_sp)
        index = tuple(
            slice(offset[i] * d[i], offset[i] * d[i] + (in_sp[i] - 1) * s[i] + 1, s[i]) for i in range(nd)
        )
        y[(slice(None),) * 3 + index] += contrib
    crop = tuple(slice(pads[i], full[i] - pads[nd + i]) for i in range(nd))
    y = y.reshape(n, g * m_g, *full)[(slice(None), slice(None)) + crop]
    return [np.ascontiguousarray(y)]


# --------------------------------------------------------------------- opaque


@functools.lru_cache(maxsize=64)
def _opaque_session(model: bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def opaque(xs, a):
    """The embedded one-operator model, run by ONNX Runtime on the CPU."""
    sess = _opaque_session(a["model"])
    feeds = {i.name: x for i, x in zip(sess.get_inputs(), xs)}
    return sess.run(None, feeds)
