"""Convolutional zoo models written in plain PyTorch: Candy, ResNet-50, YOLOX-nano, YOLOv4."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# ------------------------------------------------------------------------ Candy (fast neural style)


class _ReflectConv(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1):
        super().__init__(nn.ReflectionPad2d(k // 2), nn.Conv2d(cin, cout, k, stride))


class _StyleResidual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(
            _ReflectConv(c, c, 3),
            nn.InstanceNorm2d(c, affine=True),
            nn.ReLU(),
            _ReflectConv(c, c, 3),
            nn.InstanceNorm2d(c, affine=True),
        )

    def forward(self, x):
        return x + self.body(x)


class _UpsampleConv(nn.Module):
    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = _ReflectConv(cin, cout, k)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


def candy() -> nn.Module:
    """Johnson et al.'s transformer net, the architecture of the ONNX zoo's Candy style model."""

    def block(cin, cout, k, stride=1):
        return [_ReflectConv(cin, cout, k, stride), nn.InstanceNorm2d(cout, affine=True), nn.ReLU()]

    return nn.Sequential(
        *block(3, 32, 9),
        *block(32, 64, 3, 2),
        *block(64, 128, 3, 2),
        *[_StyleResidual(128) for _ in range(5)],
        _UpsampleConv(128, 64, 3),
        nn.InstanceNorm2d(64, affine=True),
        nn.ReLU(),
        _UpsampleConv(64, 32, 3),
        nn.InstanceNorm2d(32, affine=True),
        nn.ReLU(),
        _ReflectConv(32, 3, 9),
    )


# ----------------------------------------------------------------------------------- ResNet-50


class _Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        return F.relu(self.body(x) + self.skip(x))


def resnet50() -> nn.Module:
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(_Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------------------- YOLOX-nano


class _BaseConv(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1, groups=1, act=nn.SiLU):
        super().__init__(
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            act(),
        )


class _DWConv(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1):
        super().__init__(_BaseConv(cin, cin, k, stride, groups=cin), _BaseConv(cin, cout, 1))


class _Bottle(nn.Module):
    def __init__(self, c, shortcut):
        super().__init__()
        self.conv1, self.conv2 = _BaseConv(c, c, 1), _DWConv(c, c, 3)
        self.shortcut = shortcut

    def forward(self, x):
        y = self.conv2(self.conv1(x))
        return x + y if self.shortcut else y


class _CSP(nn.Module):
    def __init__(self, cin, cout, n, shortcut=True):
        super().__init__()
        hidden = cout // 2
        self.conv1, self.conv2 = _BaseConv(cin, hidden, 1), _BaseConv(cin, hidden, 1)
        self.m = nn.Sequential(*[_Bottle(hidden, shortcut) for _ in range(n)])
        self.conv3 = _BaseConv(2 * hidden, cout, 1)

    def forward(self, x):
        return self.conv3(torch.cat([self.m(self.conv1(x)), self.conv2(x)], 1))


class _SPP(nn.Module):
    def __init__(self, cin, cout, act=nn.SiLU):
        super().__init__()
        hidden = cin // 2
        self.conv1 = _BaseConv(cin, hidden, 1, act=act)
        self.pools = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in (5, 9, 13))
        self.conv2 = _BaseConv(hidden * 4, cout, 1, act=act)

    def forward(self, x):
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [p(x) for p in self.pools], 1))


class YoloxNano(nn.Module):
    """CSPDarknet (depth 0.33, width 0.25, depthwise), PAFPN and the decoupled YOLOX head."""

    def __init__(self, classes=80):
        super().__init__()
        c = [16, 32, 64, 128, 256]
        self.stem = _BaseConv(12, c[0], 3)
        self.dark2 = nn.Sequential(_DWConv(c[0], c[1], 3, 2), _CSP(c[1], c[1], 1))
        self.dark3 = nn.Sequential(_DWConv(c[1], c[2], 3, 2), _CSP(c[2], c[2], 3))
        self.dark4 = nn.Sequential(_DWConv(c[2], c[3], 3, 2), _CSP(c[3], c[3], 3))
        self.dark5 = nn.Sequential(_DWConv(c[3], c[4], 3, 2), _SPP(c[4], c[4]), _CSP(c[4], c[4], 1, False))
        self.lateral0, self.c3_p4 = _BaseConv(c[4], c[3], 1), _CSP(2 * c[3], c[3], 1, False)
        self.reduce1, self.c3_p3 = _BaseConv(c[3], c[2], 1), _CSP(2 * c[2], c[2], 1, False)
        self.bu2, self.c3_n3 = _DWConv(c[2], c[2], 3, 2), _CSP(2 * c[2], c[3], 1, False)
        self.bu1, self.c3_n4 = _DWConv(c[3], c[3], 3, 2), _CSP(2 * c[3], c[4], 1, False)
        hid = c[2]
        self.stems = nn.ModuleList(_BaseConv(ch, hid, 1) for ch in (c[2], c[3], c[4]))
        self.cls = nn.ModuleList(nn.Sequential(_DWConv(hid, hid, 3), _DWConv(hid, hid, 3)) for _ in range(3))
        self.reg = nn.ModuleList(nn.Sequential(_DWConv(hid, hid, 3), _DWConv(hid, hid, 3)) for _ in range(3))
        self.cls_pred = nn.ModuleList(nn.Conv2d(hid, classes, 1) for _ in range(3))
        self.reg_pred = nn.ModuleList(nn.Conv2d(hid, 4, 1) for _ in range(3))
        self.obj_pred = nn.ModuleList(nn.Conv2d(hid, 1, 1) for _ in range(3))

    def forward(self, x):
        # Focus: space-to-depth by strided slicing
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
        x2 = self.dark2(self.stem(x))
        x3 = self.dark3(x2)
        x4 = self.dark4(x3)
        x5 = self.dark5(x4)
        f0 = self.lateral0(x5)
        f1 = self.c3_p4(torch.cat([F.interpolate(f0, scale_factor=2, mode="nearest"), x4], 1))
        f1r = self.reduce1(f1)
        p3 = self.c3_p3(torch.cat([F.interpolate(f1r, scale_factor=2, mode="nearest"), x3], 1))
        p4 = self.c3_n3(torch.cat([self.bu2(p3), f1r], 1))
        p5 = self.c3_n4(torch.cat([self.bu1(p4), f0], 1))
        outs = []
        for i, feat in enumerate((p3, p4, p5)):
            feat = self.stems[i](feat)
            c, r = self.cls[i](feat), self.reg[i](feat)
            out = torch.cat(
                [self.reg_pred[i](r), self.obj_pred[i](r).sigmoid(), self.cls_pred[i](c).sigmoid()], 1
            )
            outs.append(out.flatten(2))
        return torch.cat(outs, 2).permute(0, 2, 1)


# -------------------------------------------------------------------------------------- YOLOv4


def _cbm(cin, cout, k, stride=1):
    return _BaseConv(cin, cout, k, stride, act=nn.Mish)


def _cbl(cin, cout, k, stride=1):
    return _BaseConv(cin, cout, k, stride, act=lambda: nn.LeakyReLU(0.1))


class _DarkRes(nn.Module):
    def __init__(self, c, hidden):
        super().__init__()
        self.body = nn.Sequential(_cbm(c, hidden, 1), _cbm(hidden, c, 3))

    def forward(self, x):
        return x + self.body(x)


class _CSPStage(nn.Module):
    def __init__(self, cin, cout, blocks, first=False):
        super().__init__()
        half = cout if first else cout // 2
        self.down = _cbm(cin, cout, 3, 2)
        self.split0, self.split1 = _cbm(cout, half, 1), _cbm(cout, half, 1)
        self.blocks = nn.Sequential(
            *[_DarkRes(half, cout // 2 if first else half) for _ in range(blocks)], _cbm(half, half, 1)
        )
        self.merge = _cbm(2 * half, cout, 1)

    def forward(self, x):
        x = self.down(x)
        return self.merge(torch.cat([self.blocks(self.split1(x)), self.split0(x)], 1))


def _five(cin, c):
    return nn.Sequential(
        _cbl(cin, c, 1), _cbl(c, 2 * c, 3), _cbl(2 * c, c, 1), _cbl(c, 2 * c, 3), _cbl(2 * c, c, 1)
    )


class YoloV4(nn.Module):
    """CSPDarknet53 (Mish), SPP and PANet (leaky ReLU) with three YOLO head convolutions."""

    def __init__(self, classes=80):
        super().__init__()
        out = 3 * (5 + classes)
        self.stem = _cbm(3, 32, 3)
        self.s1, self.s2 = _CSPStage(32, 64, 1, first=True), _CSPStage(64, 128, 2)
        self.s3, self.s4, self.s5 = _CSPStage(128, 256, 8), _CSPStage(256, 512, 8), _CSPStage(512, 1024, 4)
        self.pre_spp = nn.Sequential(_cbl(1024, 512, 1), _cbl(512, 1024, 3), _cbl(1024, 512, 1))
        self.spp = _SPP(512, 512, act=lambda: nn.LeakyReLU(0.1))
        self.post_spp = nn.Sequential(_cbl(512, 1024, 3), _cbl(1024, 512, 1))
        self.up5, self.lat4, self.five4 = _cbl(512, 256, 1), _cbl(512, 256, 1), _five(512, 256)
        self.up4, self.lat3, self.five3 = _cbl(256, 128, 1), _cbl(256, 128, 1), _five(256, 128)
        self.head3 = nn.Sequential(_cbl(128, 256, 3), nn.Conv2d(256, out, 1))
        self.down3, self.five4b = _cbl(128, 256, 3, 2), _five(512, 256)
        self.head4 = nn.Sequential(_cbl(256, 512, 3), nn.Conv2d(512, out, 1))
        self.down4, self.five5b = _cbl(256, 512, 3, 2), _five(1024, 512)
        self.head5 = nn.Sequential(_cbl(512, 1024, 3), nn.Conv2d(1024, out, 1))

    def forward(self, x):
        x3 = self.s3(self.s2(self.s1(self.stem(x))))
        x4 = self.s4(x3)
        p5 = self.post_spp(self.spp(self.pre_spp(self.s5(x4))))
        up = F.interpolate(self.up5(p5), scale_factor=2, mode="nearest")
        p4 = self.five4(torch.cat([self.lat4(x4), up], 1))
        up = F.interpolate(self.up4(p4), scale_factor=2, mode="nearest")
        p3 = self.five3(torch.cat([self.lat3(x3), up], 1))
        n4 = self.five4b(torch.cat([self.down3(p3), p4], 1))
        n5 = self.five5b(torch.cat([self.down4(n4), p5], 1))
        return self.head3(p3), self.head4(n4), self.head5(n5)
