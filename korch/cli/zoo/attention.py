"""Attention zoo models written in plain PyTorch: BERT-base, ViT-B/16, Segformer-b0, EfficientViT-B1."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# ------------------------------------------------------------------------- BERT-base and ViT-B/16


class _SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x, bias=None):
        b, n, d = x.shape
        h = self.heads

        def split(t):
            return t.view(b, n, h, d // h).transpose(1, 2)

        scores = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) / math.sqrt(d // h)
        if bias is not None:
            scores = scores + bias
        y = (scores.softmax(-1) @ split(self.v(x))).transpose(1, 2).reshape(b, n, d)
        return self.out(y)


class _PostNormLayer(nn.Module):
    """BERT's layer: attention and MLP, each followed by a residual add and LayerNorm."""

    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attn, self.ln1 = _SelfAttention(dim, heads), nn.LayerNorm(dim, eps=1e-12)
        self.fc1, self.fc2, self.ln2 = (
            nn.Linear(dim, hidden),
            nn.Linear(hidden, dim),
            nn.LayerNorm(dim, eps=1e-12),
        )

    def forward(self, x, bias):
        x = self.ln1(x + self.attn(x, bias))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class Bert(nn.Module):
    def __init__(self, vocab=30522, dim=768, layers=12, heads=12, max_len=512):
        super().__init__()
        self.word, self.pos, self.segment = (
            nn.Embedding(vocab, dim),
            nn.Embedding(max_len, dim),
            nn.Embedding(2, dim),
        )
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList(_PostNormLayer(dim, heads, 4 * dim) for _ in range(layers))
        self.pool = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask, token_type_ids):
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.ln(self.word(input_ids) + self.pos(positions) + self.segment(token_type_ids))
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x, torch.tanh(self.pool(x[:, 0]))


class _PreNormLayer(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim, eps=1e-6), _SelfAttention(dim, heads)
        self.ln2, self.fc1, self.fc2 = (
            nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, hidden),
            nn.Linear(hidden, dim),
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, image=224, patch=16, dim=768, layers=12, heads=12, classes=1000):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.layers = nn.Sequential(*[_PreNormLayer(dim, heads, 4 * dim) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.ln(self.layers(x))[:, 0])


# ----------------------------------------------------------------------------------- Segformer-b0


class _EfficientAttention(nn.Module):
    """Segformer's attention: keys and values from a spatially reduced (strided conv) sequence."""

    def __init__(self, dim, heads, sr):
        super().__init__()
        self.heads, self.sr = heads, sr
        self.q, self.kv, self.proj = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        if sr > 1:
            self.reduce, self.norm = nn.Conv2d(dim, dim, sr, sr), nn.LayerNorm(dim)

    def forward(self, x, hw):
        b, n, d = x.shape
        h = self.heads
        q = self.q(x).reshape(b, n, h, d // h).permute(0, 2, 1, 3)
        if self.sr > 1:
            x = x.permute(0, 2, 1).reshape(b, d, *hw)
            x = self.norm(self.reduce(x).reshape(b, d, -1).permute(0, 2, 1))
        kv = self.kv(x).reshape(b, -1, 2, h, d // h).permute(2, 0, 3, 1, 4)
        attn = (q @ kv[0].transpose(-2, -1)) * (d // h) ** -0.5
        y = (attn.softmax(-1) @ kv[1]).transpose(1, 2).reshape(b, n, d)
        return self.proj(y)


class _MixFFN(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dw = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)

    def forward(self, x, hw):
        x = self.fc1(x)
        b, n, c = x.shape
        x = self.dw(x.transpose(1, 2).reshape(b, c, *hw)).flatten(2).transpose(1, 2)
        return self.fc2(F.gelu(x))


class _SegBlock(nn.Module):
    def __init__(self, dim, heads, sr):
        super().__init__()
        self.n1, self.attn = nn.LayerNorm(dim), _EfficientAttention(dim, heads, sr)
        self.n2, self.ffn = nn.LayerNorm(dim), _MixFFN(dim, 4 * dim)

    def forward(self, x, hw):
        x = x + self.attn(self.n1(x), hw)
        return x + self.ffn(self.n2(x), hw)


class Segformer(nn.Module):
    """MiT-b0 encoder and the all-MLP decode head (150 classes, ADE20K-style)."""

    def __init__(
        self, dims=(32, 64, 160, 256), heads=(1, 2, 5, 8), srs=(8, 4, 2, 1), classes=150, decoder=256
    ):
        super().__init__()
        self.embeds = nn.ModuleList()
        self.blocks = nn.ModuleList()
        self.norms = nn.ModuleList()
        cin = 3
        for i, (d, h, sr) in enumerate(zip(dims, heads, srs)):
            k, s = (7, 4) if i == 0 else (3, 2)
            self.embeds.append(nn.ModuleList([nn.Conv2d(cin, d, k, s, k // 2), nn.LayerNorm(d)]))
            self.blocks.append(nn.ModuleList(_SegBlock(d, h, sr) for _ in range(2)))
            self.norms.append(nn.LayerNorm(d))
            cin = d
        self.mlps = nn.ModuleList(nn.Linear(d, decoder) for d in dims)
        self.fuse = nn.Sequential(
            nn.Conv2d(4 * decoder, decoder, 1, bias=False), nn.BatchNorm2d(decoder), nn.ReLU()
        )
        self.classify = nn.Conv2d(decoder, classes, 1)

    def forward(self, x):
        feats = []
        for (conv, ln), blocks, norm in zip(self.embeds, self.blocks, self.norms):
            x = conv(x)
            b, c, h, w = x.shape
            x = ln(x.flatten(2).transpose(1, 2))
            for blk in blocks:
                x = blk(x, (h, w))
            x = norm(x).reshape(b, h, w, c).permute(0, 3, 1, 2)
            feats.append(x)
        return decode_head(feats, self.mlps, self.fuse, self.classify)


def decode_head(feats, mlps, fuse, classify):
    """Segformer's all-MLP decode head: each stage's features through its linear layer, resized
    to the first stage's size, concatenated (last stage first) and fused by `fuse`, then classified
    (examples/make_segformer_head.py exports this head alone)."""
    size = feats[0].shape[2:]
    ups = []
    for f, mlp in zip(feats, mlps):
        b, c, h, w = f.shape
        y = mlp(f.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(b, -1, h, w)
        ups.append(F.interpolate(y, size=size, mode="bilinear", align_corners=False))
    return classify(fuse(torch.cat(ups[::-1], 1)))


# --------------------------------------------------------------------------------- EfficientViT-B1


class _ConvBN(nn.Sequential):
    def __init__(self, cin, cout, k=1, stride=1, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.Hardswish())
        super().__init__(*layers)


class _MBConv(nn.Module):
    def __init__(self, cin, cout, stride=1, expand=4, residual=True):
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(
            _ConvBN(cin, mid), _ConvBN(mid, mid, 3, stride, groups=mid), _ConvBN(mid, cout, act=False)
        )
        self.residual = residual and stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class _LiteMLA(nn.Module):
    """Multi-scale ReLU linear attention (the EfficientViT context module)."""

    def __init__(self, dim, head_dim=16, eps=1e-15):
        super().__init__()
        self.head_dim, self.eps = head_dim, eps
        heads = dim // head_dim
        self.qkv = nn.Conv2d(dim, 3 * dim, 1, bias=False)
        self.aggreg = nn.Sequential(
            nn.Conv2d(3 * dim, 3 * dim, 5, 1, 2, groups=3 * dim, bias=False),
            nn.Conv2d(3 * dim, 3 * dim, 1, groups=3 * heads, bias=False),
        )
        self.proj = _ConvBN(2 * dim, dim, act=False)

    def forward(self, x):
        b, _, h, w = x.shape
        qkv = self.qkv(x)
        qkv = torch.cat([qkv, self.aggreg(qkv)], 1)
        qkv = qkv.reshape(b, -1, 3 * self.head_dim, h * w).transpose(-1, -2)
        q, k, v = qkv.split(self.head_dim, -1)
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 1), mode="constant", value=1.0)
        out = q @ (k.transpose(-1, -2) @ v)
        out = out[..., :-1] / (out[..., -1:] + self.eps)
        return self.proj(out.transpose(-1, -2).reshape(b, -1, h, w))


class _EViTBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.context, self.local = _LiteMLA(dim), _MBConv(dim, dim)

    def forward(self, x):
        return self.local(x + self.context(x))


class EfficientViT(nn.Module):
    """EfficientViT-B1 classifier (MIT Han lab): MBConv stages, then linear-attention stages."""

    def __init__(self, widths=(16, 32, 64, 128, 256), depths=(1, 2, 3, 3, 4), classes=1000):
        super().__init__()
        stem = [_ConvBN(3, widths[0], 3, 2)]
        stem += [_MBConv(widths[0], widths[0], expand=1) for _ in range(depths[0])]
        stages = [nn.Sequential(*stem)]
        for i in (1, 2):
            stages.append(
                nn.Sequential(
                    _MBConv(widths[i - 1], widths[i], 2),
                    *[_MBConv(widths[i], widths[i]) for _ in range(depths[i] - 1)],
                )
            )
        for i in (3, 4):
            stages.append(
                nn.Sequential(
                    _MBConv(widths[i - 1], widths[i], 2, residual=False),
                    *[_EViTBlock(widths[i]) for _ in range(depths[i])],
                )
            )
        self.stages = nn.Sequential(*stages)
        self.head_conv = _ConvBN(widths[4], 1536)
        self.head = nn.Sequential(
            nn.Linear(1536, 1600, bias=False), nn.LayerNorm(1600), nn.Hardswish(), nn.Linear(1600, classes)
        )

    def forward(self, x):
        x = self.head_conv(self.stages(x))
        return self.head(x.mean((2, 3)))
