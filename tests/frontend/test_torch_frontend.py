"""The PyTorch front end: ATen ops lowered to primitives match eager PyTorch in the reference
executor, and korch.optimize(module, inputs) builds plans that match eager PyTorch."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import korch
from korch.errors import KorchError
from korch.frontend.torch.importer import import_torch
from korch.ir import reference
from korch.ir.prims import Prim
from korch.ir.tensors import to_numpy
from korch.measure import check


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def lower_and_compare(module, *inputs, tol=1e-4):
    """Import through torch.export, run the primitives in numpy, compare with eager PyTorch."""
    module = module.eval()
    result = import_torch(module, inputs)
    feeds = {name: to_numpy(x) for name, x in zip(result.graph.inputs, inputs)}
    got = reference.run(result.graph, feeds)
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for name, w in zip(result.graph.output_names, want):
        assert got[name].shape == tuple(w.shape), (name, got[name].shape, w.shape)
        assert str(got[name].dtype) == str(w.dtype).removeprefix("torch."), name
        err = check.rel_err(got[name], to_numpy(w))
        assert err <= tol, f"{name}: relative error {err:.3g}"
    return result


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


X = rand(2, 3, 6, 6)
V = rand(2, 5, 8)
EMBED = rand(10, 6, seed=1)  # an EmbeddingBag's weight
BILINEAR = rand(4, 8, 6, seed=2), rand(4, seed=3)  # F.bilinear's weight and bias


def _row_hidden(rows, cols):
    mask = torch.rand(rows, cols, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[1] = False
    return mask


HIDDEN = _row_hidden(5, 7)


def _inverse_permutation(perm):
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    return inverse


def _assigned(x, i):
    """Assignments through indices, masks and slices (index_put, slice_scatter, copy)."""
    y = x.clone()
    y[:, i] = 7.0  # (index tensors next to each other: the batch stays in place)
    y[1, i, 2:4] += 1.5
    y[i % 2, :, i] = -2.0  # (separated by a slice: the batch moves in front)
    y.index_put_((torch.tensor([1, 1, 0]),), x[0, 0] + 1.0, accumulate=True)
    y[x > 1] = 0.0
    y[x < -1] = x[0, 0, 0] * 3  # (a 0-d tensor value; += would read y[mask], of data-dependent shape)
    y[:, x[1] > 0.5] = x[:, 0, :1]  # (one value per leading index, broadcast over the masked ones)
    y.index_put_((x > 1.5,), torch.tensor(0.25), accumulate=True)
    y[:, 1:3] = 0.5
    y[..., ::3] = y[..., 1::3] * 2
    return y


# one entry per ATen op family: (id, function, inputs)
OPS = [
    ("add_sub_alpha", lambda x, y: torch.add(x, y, alpha=2) - torch.sub(y, 1.5, alpha=3), (V, V * 2)),
    ("mul_div_rsub", lambda x, y: (1 - x) * y / (y.abs() + 1) + 2 / (x.abs() + 1), (V, V + 1)),
    (
        "div_modes",
        lambda x: torch.div(x, 0.7, rounding_mode="floor") + torch.div(x, 0.7, rounding_mode="trunc"),
        (V,),
    ),
    ("pow_sqrt_rsqrt", lambda x: x.pow(2) + x.abs().pow(1.5) + x.abs().sqrt() + (x.abs() + 1).rsqrt(), (V,)),
    (
        "unary",
        lambda x: x.exp() + x.abs().log1p() + x.tanh() + x.sigmoid() + x.sin() + x.cos() + x.erf(),
        (V,),
    ),
    # every quadrant, and signed zeros (V * 0 holds -0.0 where V < 0): x = +-0, y = +-0, both
    (
        "atan2",
        lambda y, x: (torch.atan2(y, x), torch.atan2(y * (x > 0), x), torch.atan2(y * (x > 0), x * 0)),
        (V, V.flip(2)),
    ),
    (  # the polynomial's two ranges (tanh(3 V) reaches both), +-1, beyond 1, the normal quantile
        "erfinv_ndtri",
        lambda x, e: (
            torch.erfinv(torch.tanh(x * 3)),
            torch.erfinv(e),
            torch.special.ndtri(torch.sigmoid(x)),
        ),
        (V, torch.tensor([1.0, -1.0, 1.5, 0.0, 0.9999, -0.99999994, 1e-30])),
    ),
    ("inverse_trig", lambda x: torch.tanh(x).asin() + torch.tanh(x).acos() + (x * 9).atan(), (V,)),
    # tiny arguments: log(1 + x) and exp(x) - 1 would lose every digit (found by test_torch_opinfo.py)
    ("log1p_expm1_tiny", lambda x: (torch.log1p(x * 1e-7), torch.expm1(x * 3e-8), torch.expm1(x * 9)), (V,)),
    ("softplus_threshold", lambda x: F.softplus(x, beta=3, threshold=0.2) + F.softplus(x * 9), (V,)),
    ("softplus_tiny", lambda x: F.softplus(x.sum() * 0 - 30), (V,)),  # 9e-14, a 0-d output
    (
        "bool_arithmetic",
        lambda x: torch.isfinite(1 / x.round()) * (x > 0) + torch.isclose(x, x.round()),
        (V,),
    ),
    (
        "norms_and_scans",
        lambda x: (
            torch.linalg.vector_norm(x, dim=-1),
            x.norm(p=3, dim=1),
            torch.linalg.vector_norm(x, ord=float("inf")),
            (x * (x > 0)).norm(p=0, dim=(0, 2)),
            F.normalize(x, dim=-1),
            x.cumsum(1),
            *torch.var_mean(x, dim=1),
        ),
        (V,),
    ),
    (
        "gather_flip_predicates",
        lambda x: (
            torch.gather(x, 2, (torch.arange(12) * 5 % 8).reshape(1, 1, 12).expand(2, 4, 12)),
            x.flip(0, 2),
            x.unfold(2, 3, 2),
            x.unfold(0, 1, 1),
            (x > 1).any(1),
            (x > -3).all(),
            torch.isnan(x.log()),
            torch.fmod(x * 5, 1.5),
            x.round(decimals=2) + x.round(decimals=-1),
        ),
        (V,),
    ),
    (  # dim 0 of a 0-d tensor
        "scalar_dims",
        lambda x: (
            x.sum().mean(0, keepdim=True)
            + x.sum().softmax(0)
            + x.sum().argmax(0)
            + torch.index_select(x.sum(), 0, torch.tensor([0]))
            + x.sum().max(0).values
        ),
        (V,),
    ),
    (
        "rounding",
        lambda x: (x * 3).floor() + (x * 3).ceil() + (x * 3).round() + x.sign() + x.reciprocal(),
        (V,),
    ),
    ("relu_silu_gelu", lambda x: F.relu(x) + F.silu(x) + F.gelu(x) + F.gelu(x, approximate="tanh"), (V,)),
    ("hard_acts", lambda x: F.hardswish(x * 4) + F.hardsigmoid(x * 4) + F.hardtanh(x, -0.5, 0.5), (V,)),
    ("leaky_elu_mish", lambda x: F.leaky_relu(x, 0.1) + F.elu(x) + F.mish(x) + F.softplus(x, beta=2), (V,)),
    ("rrelu_in_eval", lambda x: F.rrelu(x * 3, 0.1, 0.3) + F.rrelu(x), (V,)),  # (the slopes' mean)
    ("clamp", lambda x: x.clamp(-0.5, 0.7) + x.clamp(min=0.1) + x.clamp(max=-0.1), (V,)),
    ("compare_where", lambda x, y: torch.where((x > y) | (x <= 0.2) & ~(x == y), x, y * 2), (V, V.flip(0))),
    (
        "masked_fill",
        lambda x: x.masked_fill(x < 0, -1.0) + (x >= 0).float() + (x != 0).to(torch.float32),
        (V,),
    ),
    ("max_min_pair", lambda x, y: torch.maximum(x, y) - torch.minimum(x, y * 0.5), (V, V.flip(1))),
    (
        "reductions",
        lambda x: x.sum(-1, keepdim=True) + x.mean((1, 2), keepdim=True) + x.amax(1, keepdim=True),
        (V,),
    ),
    ("reduce_all", lambda x: x.sum() + x.mean() + x.amin(-1).sum(), (V,)),
    ("max_dim_argmax", lambda x: (x.max(1).values, x.argmax(-1), x.min(-1).indices), (V,)),
    ("var", lambda x: x.var(-1, keepdim=True) + x.var((1, 2), unbiased=False, keepdim=True), (V,)),
    ("softmax", lambda x: torch.softmax(x * 30, -1) + torch.log_softmax(x, 1), (V,)),
    ("view_permute", lambda x: x.reshape(2, 40).t().reshape(8, 10).permute(1, 0).transpose(0, 1), (V,)),
    ("expand_repeat", lambda x: x[:, :1].expand(2, 4, 8) + x[:, :2].repeat(1, 2, 1), (V,)),
    ("cat_split", lambda x: torch.cat(list(x.split([3, 5], -1))[::-1] + [x[..., :1]], -1), (V,)),
    ("chunk_unbind", lambda x: x.chunk(2, 1)[1] + torch.stack(x.unbind(0), 0)[:, :2], (V[:, :4],)),
    ("slice_select", lambda x: x[:, 1:-1:2, ::3] + x[:, 0:1, -3:].sum() + x.select(1, -1)[:, None, :3], (V,)),
    ("squeeze_unsqueeze", lambda x: x.unsqueeze(1).squeeze(1).flatten(1).unsqueeze(-1).squeeze(), (V,)),
    (
        "index_gather",
        lambda x: x[:, torch.tensor([4, 0, -1])][..., :3] + x.index_select(2, torch.tensor([1, 1, 7]))[:, :3],
        (V,),
    ),
    ("index_2d", lambda x: x[:, :, torch.tensor([[0], [2]]), torch.tensor([1, 3, 5])], (X,)),
    ("bilinear", lambda x, y: F.bilinear(x, y, *BILINEAR), (V, V[..., :6] * 2)),  # (nn.Bilinear)
    (  # every mode; an empty bag (offsets 3, 3); padding rows; weights per index; a last offset
        "embedding_bag",
        lambda i, o, w: (
            F.embedding_bag(i, EMBED, o, mode="sum", per_sample_weights=w),
            F.embedding_bag(i, EMBED, o, mode="mean", padding_idx=2),
            F.embedding_bag(i, EMBED, o, mode="max", padding_idx=4),
            F.embedding_bag(
                i, EMBED, torch.cat([o, o.new_tensor([10])]), mode="sum", include_last_offset=True
            ),
            F.embedding_bag(i.view(2, 5), EMBED, mode="mean"),
        ),
        (torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 2]), torch.tensor([0, 3, 3, 7]), rand(10)),
    ),
    (  # index tensors known only at run time, negative ones too; separated by a slice (x[i, :, j])
        "index_runtime",
        lambda x, i, j: (x[i, j], x[:, i, j], x[i, :, j], x[torch.arange(2), (j + 1).flatten()]),
        (V, torch.tensor([1, 0, -1]), torch.tensor([[2], [-3]])),
    ),
    ("index_put", lambda x, i: _assigned(x, i), (V, torch.tensor([4, 0, -2]))),
    (
        "scatters",
        lambda x, i: (
            x.scatter(1, i.abs().view(1, 3, 1).expand(2, 3, 8), 2.0),
            x.scatter_add(2, (i.abs() * 3 % 8).view(1, 1, 3).expand(2, 5, 3), x[:, :, :3]),
            x.scatter(0, torch.tensor([[[1, 0, 1, 1, 0, 0, 1, 0]]]), x[:1] + 1, reduce="multiply"),
            *[
                x.scatter_reduce(
                    1,
                    torch.tensor([[[0, 1, 0, 1, 4, 4, 2, 0]]]).expand(2, 2, 8),
                    x[:, :2] * 3,
                    r,
                    include_self=s,
                )
                for r in ("sum", "prod", "mean", "amax", "amin")
                for s in (True, False)
            ],
            (x * 4)
            .int()
            .scatter_reduce(2, torch.tensor([[[1, 1, 5]]]).expand(2, 5, 3), (x[:, :, :3] * 9).int(), "mean"),
        ),
        (V, torch.tensor([4, 0, -2])),
    ),
    (
        "index_ops",
        lambda x, i: (
            x.index_add(1, i.abs(), x[:, :3] * 2, alpha=0.5),
            x.index_copy(2, torch.tensor([7, 0]), x[:, :, :2]),
            x.index_fill(1, i, -1.0),
            x.index_reduce(1, torch.tensor([1, 1, 3]), x[:, :3], "amax", include_self=False),
            x.index_reduce(2, torch.tensor([0, 6, 0]), x[:, :, 2:5], "mean"),
            x.put(torch.tensor([3, -1, 70]), torch.tensor([1.0, 2.0, 3.0])),
            x.put(torch.tensor([3, 3]), torch.tensor([1.0, 2.0]), accumulate=True),
            x.masked_scatter(x > 0, x * 10),
        ),
        (V, torch.tensor([4, 0, -2])),
    ),
    (
        "sort_topk_median",
        lambda x: (
            *torch.sort(x, 1),
            *torch.sort(x.round(), dim=0, descending=True, stable=True),
            *torch.topk(x, 2),
            *torch.topk(x, 3, 1, largest=False),
            *torch.kthvalue(x, 2, 2, keepdim=True),
            torch.argsort(x, -1),
            x.msort(),
            *torch.median(x, 1),
            *torch.nanmedian(x.log(), 2),
            torch.median(x),
        ),
        (V,),
    ),
    (
        "max_pool_indices_unpool",
        lambda x: (
            *F.max_pool2d(x, 3, 2, 1, return_indices=True),
            *F.max_pool2d(x.round(), 2, ceil_mode=True, return_indices=True),  # (ties: the first)
            *F.max_pool2d(x, 3, 1, 1, dilation=2, return_indices=True),
            F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
            # a kernel past the whole input (Hugging Face's EfficientNet: AvgPool2d(1280, ceil_mode=True))
            F.avg_pool2d(x, 40, ceil_mode=True),
            *F.max_pool2d(x, (40, 3), (40, 2), ceil_mode=True, return_indices=True),
        ),
        (X,),
    ),
    (
        "pools_3d_distances",
        lambda x: (
            F.avg_pool3d(x, 2, ceil_mode=True, divisor_override=3),
            F.max_pool3d(x, (1, 3, 3), 1, (0, 1, 1)),
            F.adaptive_avg_pool3d(x, (2, 4, 5)),
            F.adaptive_max_pool3d(x, 2),
            torch.dist(x, x.flip(0), 3),
            torch.cdist(x[0], x[1], p=1),
            torch.cdist(x[0], x[1]),
            torch.angle(x),
            x.narrow_copy(2, -4, 3),
        ),
        (X,),
    ),
    (
        "grid_sample",
        lambda x, g: [
            F.grid_sample(x, g, mode=m, padding_mode=p, align_corners=a)
            for m in ("bilinear", "nearest", "bicubic")
            for p in ("zeros", "border", "reflection")
            for a in (False, True)
        ],
        (X, rand(2, 4, 5, 2) * 1.5),
    ),
    (
        "grid_sample_3d",
        lambda v, g: [
            F.grid_sample(v, g, mode=m, padding_mode=p, align_corners=a)
            for m in ("bilinear", "nearest")
            for p in ("zeros", "border", "reflection")
            for a in (False, True)
        ],
        (rand(2, 3, 4, 5, 6), rand(2, 3, 4, 2, 3) * 1.5),
    ),
    (
        "math_library",
        lambda x: (
            torch.tan(x),
            torch.sinh(x) + torch.cosh(x) + torch.asinh(x * 1e4),
            torch.acosh(x.abs() + 1) + torch.atanh(x.clamp(-0.9, 0.9)),
            torch.log2(x.abs()) + torch.log10(x.abs()) + torch.exp2(x),
            torch.special.erfc(x * 3),
            torch.hypot(x, x * 2),
            torch.copysign(x, -x) + torch.copysign(x, torch.tensor(-0.0)),
            torch.signbit(x.round()),
            torch.fmax(x, x.log()) + torch.fmin(x.log(), x),
            torch.isinf(1 / x.round()),
            torch.trunc(x * 3),
            torch.ldexp(x, torch.tensor(3)),
            torch.lgamma(x * 4),
            torch.lgamma(torch.tensor([1.0, 2.0, 0.0, -3.0, float("inf")])),
            torch.digamma(x * 4),
            torch.prod(x[:, :2, :3] + 2),
        ),
        (V,),
    ),
    (
        "scans_buckets_strides",
        lambda x: (
            *torch.cummax(x.round(), 1),  # (ties: the last of them, as torch)
            *torch.cummin(x, -1),
            torch.logcumsumexp(x, 2),
            torch.bucketize(x, torch.tensor([-1.0, 0.0, 0.5])),
            torch.bucketize(x.round(), torch.tensor([-1.0, 0.0, 1.0]), right=True),
            torch.searchsorted(torch.tensor([-1.0, 0.0, 0.5]), x),
            torch.searchsorted(x[0].sort().values, x[1], side="right"),
            x.as_strided((2, 3), (4, 1), 1),
            torch.addmv(x[1, :, 0], x[0], x[1, 0], beta=0.5, alpha=2),
            torch.addbmm(x[0, :, :5], x, x.transpose(1, 2)),
        ),
        (V,),
    ),
    (
        "attention",
        lambda q, k, v: (
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),  # (top-left, 5 by 7)
            F.scaled_dot_product_attention(q, k, v, attn_mask=HIDDEN),  # (a query with no key: zeros)
            F.scaled_dot_product_attention(q, k, v, attn_mask=k[0, :1, :, 0] * 2 - 1),  # (added, broadcast)
            F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True),  # (one key/value head)
            F.scaled_dot_product_attention(q[0], k[0], v[0]),  # (no batch axis)
        ),
        (rand(2, 2, 5, 8), rand(2, 2, 7, 8, seed=1), rand(2, 2, 7, 6, seed=2)),
    ),
    (
        "histc_empty",
        lambda x: (
            torch.histc(x, bins=7),  # (the data's own range)
            torch.histc(x, bins=10, min=-1, max=1),  # (outside values not counted; 1 in the last bin)
            torch.histc(x.round(), bins=4),  # (values on the edges)
            torch.histc(x[0, 0].clamp(min=2), bins=3),  # (one value: the range widened by 1 each way)
            _inverse_permutation(x[0, 0].argsort()),  # (empty_like, then every element written)
        ),
        (V,),
    ),
    (
        "diagonals_cumprod",
        lambda x: (
            torch.diagonal(x),
            torch.diagonal(x, 1, 1, 2),
            torch.diagonal(x, -2, 2, 0),
            torch.diagonal_scatter(x, torch.ones(2, 5), 1, 1, 2),
            torch.diagonal_scatter(x, torch.ones(5, 2), -1, 2, 0),
            torch.diag(x[0]),
            x[0].diagonal(9),
            torch.cumprod(x, 1),
            torch.cumprod((x * 3).int(), -1),
        ),
        (V,),
    ),
    (
        "arange_full",
        lambda x: x + torch.arange(8.0) + torch.full((5, 8), 0.5) + torch.zeros_like(x) + 1,
        (V,),
    ),
    (
        "pad",
        lambda x: (
            F.pad(x, (1, 2, 0, 1), value=0.5)[..., :6, :6]
            + F.pad(x, (1, 1, 1, 1), mode="reflect")[..., 1:7, 2:8]
        ),
        (X,),
    ),
    (
        "pad_replicate_crop",
        lambda x: F.pad(x, (2, 0, 1, 1), mode="replicate")[..., 1:7, :6] + F.pad(x, (-1, 1)),
        (X,),
    ),
    (
        "mm_bmm_matmul",
        lambda x, y: x @ y.transpose(-1, -2) @ x + torch.bmm(x, y.transpose(1, 2)) @ y,
        (V, V * 0.5),
    ),
    (
        "linear_addmm",
        lambda x: (
            F.linear(x, torch.ones(3, 8) * 0.1, torch.arange(3.0))
            + torch.addmm(torch.ones(3), x[0], torch.ones(8, 3), beta=0.5, alpha=2)
        ),
        (V,),
    ),
    (
        "embedding",
        lambda i: F.embedding(i, torch.arange(40.0).reshape(10, 4)),
        (torch.tensor([[1, 9, 0], [3, 3, 2]]),),
    ),
    (
        "int_arith",
        lambda i: (i * 3 + 1) // 2 + i % 1 * 0 + (i - 5).abs(),
        (torch.tensor([[1, 9, 0], [3, -3, 2]]),),
    ),
    ("max_pool", lambda x: F.max_pool2d(x, 3, 2, 1) + F.max_pool2d(x, 2, ceil_mode=True)[..., :3, :3], (X,)),
    (
        "avg_pool",
        lambda x: (
            F.avg_pool2d(x, 3, 2, 1)
            + F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)[..., :3, :3]
        ),
        (X,),
    ),
    ("adaptive_pool", lambda x: F.adaptive_avg_pool2d(x, 1) + F.adaptive_avg_pool2d(x, (3, 4)).mean(), (X,)),
    (  # uneven windows: 6 -> 4 and 6 -> 5 overlap
        "adaptive_max_pool",
        lambda x: (
            F.adaptive_max_pool2d(x, 1)
            + F.adaptive_max_pool2d(x, (4, 5)).mean()
            + F.adaptive_max_pool2d(x, 3)
        ),
        (X,),
    ),
    ("upsample_nearest", lambda x: F.interpolate(x, scale_factor=2) + F.interpolate(x, size=(12, 12)), (X,)),
    (
        "upsample_bilinear",
        lambda x: (
            F.interpolate(x, scale_factor=2, mode="bilinear")
            + F.interpolate(x, size=(12, 12), mode="bilinear", align_corners=True)
        ),
        (X,),
    ),
    (
        "upsample_odd",
        lambda x: F.interpolate(x, size=(5, 9)) + F.interpolate(x, size=(5, 9), mode="bilinear"),
        (X,),
    ),
    (  # (cubic taps past the edge read the edge; half-pixel coordinates are not clamped)
        "upsample_bicubic",
        lambda x: (
            F.interpolate(x, scale_factor=2, mode="bicubic")
            + F.interpolate(x, size=(12, 12), mode="bicubic", align_corners=True)
            + F.interpolate(x, size=(5, 9), mode="bicubic").mean()
            + F.interpolate(x, scale_factor=1.5, mode="bicubic")[..., :12, :12].mean()
        ),
        (X,),
    ),
    (  # (PIL's filters, stretched when downsampling; taps outside the input dropped)
        "upsample_antialiased",
        lambda x: (
            F.interpolate(x, size=(3, 4), mode="bilinear", antialias=True)
            + F.interpolate(x, size=(3, 4), mode="bicubic", antialias=True)
            + F.interpolate(x, scale_factor=(0.4, 1.7), mode="bicubic", antialias=True).mean()
            + F.interpolate(x, size=(2, 9), mode="bilinear", antialias=True).mean()
        ),
        (X,),
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize("fn,inputs", [pytest.param(f, i, id=name) for name, f, i in OPS])
def test_aten_op_matches_eager(fn, inputs):
    result = lower_and_compare(Fn(fn), *inputs)
    assert result.source == "torch" and result.model is None


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(3, 6)
        self.inorm = nn.InstanceNorm2d(3, affine=True)
        self.bn = nn.BatchNorm2d(3)
        self.bn_plain = nn.BatchNorm2d(3, affine=False)
        for m in (self.ln, self.gn, self.inorm, self.bn):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, v, x):
        return self.ln(v), self.gn(torch.cat([x, x * 2], 1)), self.inorm(x), self.bn(x) + self.bn_plain(x)


def test_normalizations_match_eager():
    torch.manual_seed(0)
    lower_and_compare(Norms(), V, X)


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=3, bias=False)
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)
        self.conv1d = nn.Conv1d(3, 2, 3, padding=1)

    def forward(self, x):
        return self.up(self.depthwise(self.conv(x))), self.conv1d(x.flatten(2))


def test_convolutions_match_eager():
    torch.manual_seed(0)
    lower_and_compare(Convs(), X)


def test_composites_split_into_primitives():
    """Softmax subtracts the max, layer norm reduces, GELU uses erf: nothing stays whole."""
    result = lower_and_compare(Fn(lambda x: F.gelu(F.layer_norm(torch.softmax(x, -1), (8,)))), V)
    prims = [n.prim.value for n in result.graph.nodes]
    assert {"reduce_max", "exp", "reduce_sum", "erf", "sqrt"} <= set(prims)
    assert prims.index("reduce_max") < prims.index("exp")
    assert result.graph.by_kind()["opaque"] == 0


def test_batch_norm_folds_into_conv_and_view_chains_collapse():
    """What ONNX exporters do before korch sees a model, the PyTorch path does itself."""
    torch.manual_seed(0)
    graph = lower_and_compare(ConvBN(), rand(1, 3, 8, 8)).graph
    prims = [n.prim.value for n in graph.nodes]
    assert prims.count("conv") == 1
    assert graph.by_kind()["elementwise"] == 4  # conv bias, relu, mean's scale, residual
    fc1, fc2 = nn.Linear(8, 8), nn.Linear(8, 4)
    prims = [n.prim.value for n in lower_and_compare(Fn(lambda x: fc2(fc1(x))), V).graph.nodes]
    # view -> addmm -> view, twice: two rank-3 matmuls with their bias adds, no reshape left
    assert prims.count("reshape") == 0 and prims.count("matmul") == 2


def test_unsupported_op_names_the_aten_op():
    with pytest.raises(KorchError, match=r"aten\._fft_r2c"):
        import_torch(Fn(lambda x: torch.fft.rfft(x).real), (V,))


def test_a_generator_in_forward_is_refused_in_one_line():
    seeded = torch.Generator().manual_seed(0)
    with pytest.raises(KorchError, match=r"^forward uses a torch\.Generator: random numbers are not"):
        import_torch(Fn(lambda x: x + torch.rand(8, generator=seeded)), (V,))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, a, b):
        return self.fc(a), a + b


def test_inputs_parameters_and_outputs():
    result = import_torch(TwoInputs(), (V, V), output_names=["y", "s"])
    graph = result.graph
    assert graph.inputs == ("a", "b") and graph.output_names == ("y", "s")
    assert any(c.shape == (4, 8) or c.shape == (8, 4) for c in graph.constants.values())


class Block(nn.Module):
    """Softmax, layer norm, GELU and a residual: the shared test model of both torch paths."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return F.gelu(torch.softmax(self.fc(self.ln(x)), -1) * 4) + x


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))).mean(1, keepdim=True) + x


def fast_options(cache):
    return dict(
        backends=("onnxruntime",),
        max_size=3,
        time_budget=10,
        jobs=1,
        min_time=0.002,
        progress=False,
        cache=str(cache),
    )


@pytest.fixture(scope="session")
def torch_cache(tmp_path_factory):
    """One profile database for both torch test files: the same graphs are profiled once."""
    return tmp_path_factory.getbasetemp() / "torch_profiles.sqlite"


@pytest.mark.e2e
@pytest.mark.parametrize("make,shape", [(Block, (2, 5, 16)), (ConvBN, (1, 3, 8, 8))], ids=["block", "convbn"])
def test_optimize_module_matches_eager(make, shape, torch_cache, tmp_path):
    module = make().eval()
    x = rand(*shape)
    plan = korch.optimize(module, (x,), **fast_options(torch_cache))
    with torch.no_grad():
        want = module(x).numpy()
    assert check.rel_err(plan(x)[0].numpy(), want) <= 1e-4
    assert plan.model is None and plan.oracle == "the reference executor"
    assert plan.meta.fission["source"] == "torch"
    assert plan.verify() <= 1e-4
    loaded = korch.load(plan.save(tmp_path / "plan"))
    assert loaded.oracle == "the reference executor" and loaded.verify() <= 1e-4
    np.testing.assert_allclose(loaded(x.numpy())[0], want, rtol=1e-4, atol=1e-5)


class TopKScatter(nn.Module):
    """Top scores written back by a scatter, an index input added in place, a running product of
    sorted values: plans with argsort and scatter kernels."""

    def forward(self, x, idx):
        scores = x.softmax(-1)
        top, where = scores.topk(4, dim=-1)
        y = torch.zeros_like(scores).scatter(-1, where, top)
        y[:, idx] += 1.0
        return y, torch.sort(x, dim=1, descending=True).values.cumprod(1)


@pytest.mark.e2e
@pytest.mark.parametrize("backends", [("onnxruntime",), ("inductor",)])
def test_optimize_sorts_and_scatters_with_an_index_input(backends, torch_cache):
    module = TopKScatter().eval()
    x, idx = rand(3, 10), torch.tensor([4, 0, 4, -1])
    plan = korch.optimize(module, (x, idx), **{**fast_options(torch_cache), "backends": backends})
    prims = {n.prim for k in plan.kernels for n in k.spec.graph.nodes}
    assert {Prim.ARGSORT, Prim.SCATTER} <= prims
    with torch.no_grad():
        want = module(x, idx)
    for got, w in zip(plan(x, idx), want):
        assert check.rel_err(got.numpy(), w.numpy()) <= 1e-5
    assert plan.verify() <= 1e-5  # (random indices, drawn inside the dimension they index)


class Recommender(nn.Module):
    """A recommendation model's lookups: an EmbeddingBag over index and offset inputs, and a
    table read at two index inputs (x[i, j], both known only at run time)."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 8, mode="mean", padding_idx=0)
        self.table, self.out = nn.Parameter(rand(6, 8)), nn.Linear(8, 4)

    def forward(self, idx, offsets, rows, cols):
        return self.out(self.bag(idx, offsets)).relu(), self.table[rows, cols]


@pytest.mark.e2e
@pytest.mark.parametrize("backends", [("onnxruntime",), ("inductor",)])
def test_optimize_embedding_bags_and_runtime_indices(backends, torch_cache):
    module = Recommender().eval()
    idx, offsets = torch.tensor([3, 0, 7, 7, 49, 1, 0, 12]), torch.tensor([0, 2, 2, 5])
    rows, cols = torch.tensor([[5], [-1], [0]]), torch.tensor([0, 7, -8, 3])
    plan = korch.optimize(
        module, (idx, offsets, rows, cols), **{**fast_options(torch_cache), "backends": backends}
    )
    with torch.no_grad():
        want = module(idx, offsets, rows, cols)
    for got, w in zip(plan(idx, offsets, rows, cols), want):
        assert check.rel_err(got.numpy(), w.numpy()) <= 1e-5
    assert plan.verify() <= 1e-5  # (random offsets too: a bag before the first offset is bag 0)


def _grouped_mm_op():
    """Hugging Face transformers' custom op for a float32 grouped matmul, registered here under
    its own name and schema where transformers is not installed (its eager loop is the oracle)."""
    if not hasattr(torch.ops.transformers, "grouped_mm_fallback"):

        @torch.library.custom_op("transformers::grouped_mm_fallback", mutates_args=())
        def grouped_mm_fallback(
            input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor
        ) -> torch.Tensor:
            output, start = torch.zeros(input.size(0), weight.size(2), dtype=input.dtype), 0
            for i, end in enumerate(offs.tolist()):
                output[start:end] = input[start:end] @ weight[i]
                start = end
            return output

        @grouped_mm_fallback.register_fake
        def _(input, weight, offs):
            return input.new_empty(input.size(0), weight.size(2))

    return torch.ops.transformers.grouped_mm_fallback.default


class Experts(nn.Module):
    """A mixture of experts as transformers 5 runs one in float32: tokens sorted by their top-k
    experts, histc counts per expert, two grouped matmuls, the order restored by an inverse
    permutation written into empty_like. In bfloat16 transformers calls torch._grouped_mm instead
    of its own op."""

    def __init__(self, dim=16, hidden=24, experts=4, k=2):
        super().__init__()
        self.k, self.experts = k, experts
        self.router = nn.Linear(dim, experts, bias=False)
        self.gate_up = nn.Parameter(torch.randn(experts, dim, 2 * hidden) * 0.2)
        self.down = nn.Parameter(torch.randn(experts, hidden, dim) * 0.2)

    def forward(self, x):
        grouped_mm = torch._grouped_mm if x.dtype == torch.bfloat16 else _grouped_mm_op()
        weights, chosen = self.router(x).softmax(-1).topk(self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        ids, perm = torch.sort(chosen.reshape(-1))
        rows = x[perm // self.k]
        counts = torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gate, up = grouped_mm(rows, self.gate_up, offsets).chunk(2, dim=-1)
        out = grouped_mm(F.silu(gate) * up, self.down, offsets) * weights.reshape(-1)[perm].unsqueeze(-1)
        return out[_inverse_permutation(perm)].view(x.shape[0], self.k, -1).sum(1)


class Gpt2Attention(nn.Module):
    """GPT-2's attention as transformers writes it: heads back into rows by a view, then addmm.
    torch's own decomposition of scaled_dot_product_attention gives the view strides it rejects
    at batch 2, so korch keeps the operator whole."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(16, 48), nn.Parameter(torch.randn(16, 16) * 0.3)

    def forward(self, x, mask):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, 4, 4).transpose(1, 2) for t in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, n, -1)
        return torch.addmm(self.proj[0], y.view(-1, d), self.proj)


def test_attention_kept_whole_where_its_decomposition_breaks_the_graph():
    torch.manual_seed(0)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    mask[1, :, :, 4:] = False  # (padding)
    lower_and_compare(Gpt2Attention(), rand(2, 6, 16), mask)


def test_mixture_of_experts_as_transformers_exports_it():
    torch.manual_seed(0)
    module, x = Experts().eval(), rand(12, 16)
    result = lower_and_compare(module, x, tol=1e-5)
    assert {Prim.ARGSORT, Prim.SCATTER, Prim.GROUPED_MATMUL} <= {n.prim for n in result.graph.nodes}
    same = x[:1].expand(12, 16).contiguous()  # (every token to the same two experts: two get no rows)
    lower_and_compare(module, same, tol=1e-5)


def test_mixture_of_experts_in_bfloat16_through_torchs_grouped_mm():
    torch.manual_seed(0)
    module, x = Experts().eval().to(torch.bfloat16), rand(12, 16).to(torch.bfloat16)
    result = lower_and_compare(module, x, tol=3e-2)
    assert Prim.GROUPED_MATMUL in {n.prim for n in result.graph.nodes}


def test_grouped_mm_of_two_batches_is_a_batched_matmul():
    class Batched(nn.Module):
        def forward(self, a, b):
            return torch._grouped_mm(a, b)

    a, b = (t.to(torch.bfloat16) for t in (rand(3, 5, 8), rand(3, 8, 16)))
    result = lower_and_compare(Batched(), a, b, tol=1e-2)
    assert [n.prim for n in result.graph.nodes] == [Prim.MATMUL]


@pytest.mark.e2e
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("backends", [("vendor", "eager"), ("inductor",)], ids=["vendor", "inductor"])
def test_optimize_mixture_of_experts(torch_cache, backends, dtype, tol):
    """A grouped matmul runs alone in a vendor or eager kernel, or in an Inductor kernel with its
    neighbours (Inductor calls it as korch::grouped_matmul amid its fused code); with Inductor the
    seeds are no longer cut at each grouped matmul."""
    from korch.pipeline import unfused

    torch.manual_seed(0)
    module, x = Experts().eval().to(dtype), rand(12, 16).to(dtype)
    plan = korch.optimize(module, (x,), **{**fast_options(torch_cache), "backends": backends})
    grouped = [k for k in plan.kernels if any(n.prim is Prim.GROUPED_MATMUL for n in k.spec.graph.nodes)]
    if backends == ("inductor",):
        assert grouped and all(len(k.spec.graph.nodes) > 1 for k in grouped)
    else:
        assert [len(k.spec.graph.nodes) for k in grouped] == [1, 1]
    with torch.no_grad():
        want = module(x).float().numpy()
    assert check.rel_err(plan(x)[0].float().numpy(), want) <= tol
    assert plan.verify() <= tol
    graph = import_torch(module, (x,)).graph
    cut = {i for i, n in enumerate(graph.nodes) if n.prim is Prim.GROUPED_MATMUL}
    assert len(cut) == 2 and unfused(graph, backends) == (set() if "inductor" in backends else cut)


def test_optimize_module_needs_example_inputs():
    with pytest.raises(KorchError, match="example_inputs"):
        korch.optimize(Block())


# ----------------------------------------------------------------- training mode, writes, outputs


@pytest.mark.parametrize(
    "layer",
    [nn.Dropout(0.5), nn.BatchNorm1d(5), nn.Dropout1d(0.5), nn.RReLU()],
    ids=["dropout", "batchnorm", "dropout1d", "rrelu"],
)
def test_training_mode_says_call_eval(layer):
    module = nn.Sequential(nn.Linear(8, 8), layer).train()
    with pytest.raises(KorchError, match=r"training mode .*call module\.eval\(\) first") as info:
        import_torch(module, (V,))
    assert "\n" not in str(info.value)
    import_torch(module.eval(), (V,))  # the fix works


def test_functional_training_flag_in_eval_module_is_explained():
    with pytest.raises(KorchError, match=r"dropout runs in training mode .*training=True"):
        import_torch(Fn(lambda x: F.dropout(x, 0.5, training=True)).eval(), (V,))


def test_training_mode_that_changes_nothing_still_works():
    """Training mode changes nothing for Linear/ReLU (nor for a batch norm without running
    statistics, which uses batch statistics in both modes): no refusal, same values as eager."""
    module = nn.Sequential(
        nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4), nn.BatchNorm1d(5, track_running_stats=False)
    )
    module.train()
    graph = import_torch(module, (V,)).graph
    got = reference.run(graph, {graph.inputs[0]: V.numpy()})[graph.output_names[0]]
    with torch.no_grad():
        want = module(V).numpy()
    assert module.training and check.rel_err(got, want) <= 1e-4


class WritesBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros(1))

    def forward(self, x):
        self.n.add_(1)
        return x + self.n


def test_writes_to_buffer_or_input_name_them():
    pure = r"writes to its buffer 'n' during forward \(a plan is a pure function\): compile it with "
    with pytest.raises(KorchError, match=pure + r"torch.compile\(module, backend='korch'\)"):
        import_torch(WritesBuffer(), (V,))
    with pytest.raises(KorchError, match=r"writes to its input 'xs_0' in place"):
        import_torch(Fn(lambda x: x.mul_(2) + 1), (V.clone(),))


class Nested(nn.Module):
    def forward(self, x):
        # dict keys deliberately not sorted: pytree keeps insertion order
        return (x + 1, (x * 2, [x - 3])), {"z": x.exp(), "a": {"y": x.abs(), "b": x * x}}


def test_nested_outputs_come_back_flat_in_pytree_order(torch_cache):
    from torch.utils import _pytree as pytree

    module = Nested().eval()
    x = rand(2, 3)
    plan = korch.optimize(module, (x,), **fast_options(torch_cache))
    got = plan(x)
    with torch.no_grad():
        want = pytree.tree_flatten(module(x))[0]
    assert isinstance(got, list) and len(got) == len(want) == 6
    for g, w in zip(got, want):
        assert check.rel_err(g.numpy(), w.numpy()) <= 1e-4
    # the order spelled out: tuples and lists in order, dicts in insertion order, depth first
    spelled = [x + 1, x * 2, x - 3, x.exp(), x.abs(), x * x]
    for g, w in zip(got, spelled):
        assert check.rel_err(g.numpy(), w.numpy()) <= 1e-4


def test_a_bfloat16_normalization_exported_for_cuda_keeps_torchs_float32_statistics():
    """On a GPU torch computes native_layer_norm's mean and inverse std-dev in float32 and returns
    them so (a CPU rounds them to bfloat16): the lowering follows the export's types, and the
    normalized output still matches eager float32 PyTorch rounded once. Exported with fake CUDA
    tensors, so this runs without a GPU (the H200 run found the mismatch)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from korch.frontend.torch.importer import export, import_exported

    module = Fn(lambda x: (F.layer_norm(x, (32,)), F.group_norm(x, 4)))
    with FakeTensorMode(allow_non_fake_inputs=True):
        ep = export(module, (torch.empty(2, 8, 32, dtype=torch.bfloat16, device="cuda"),))
    stats = [n.meta["val"][1].dtype for n in ep.graph.nodes if "native_layer_norm" in str(n.target)]
    assert stats == [torch.float32]  # (the premise: torch's CUDA type)
    result = import_exported(ep, {})
    x = torch.randn(2, 8, 32).to(torch.bfloat16)
    got = reference.run(result.graph, {result.graph.inputs[0]: to_numpy(x)})
    want = [F.layer_norm(x.float(), (32,)), F.group_norm(x.float(), 4)]
    for name, w in zip(result.graph.output_names, want):
        assert str(got[name].dtype) == "bfloat16"
        assert check.rel_err(got[name].astype(np.float32), w.numpy()) <= 1e-2
