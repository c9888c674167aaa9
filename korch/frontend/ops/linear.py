"""Linear builders: numpy's matmul on the MATMUL primitive, and a bias added per channel."""

from __future__ import annotations

from korch.frontend.lowering import Lowering
from korch.ir.prims import Prim


def matmul(ctx: Lowering, a: str, b: str) -> str:
    """numpy.matmul semantics, including 1-D operands, on the rank>=2 MATMUL primitive."""
    a_vec, b_vec = ctx.rank(a) == 1, ctx.rank(b) == 1
    if a_vec:
        a = ctx.reshape(a, (1, ctx.shape(a)[0]))
    if b_vec:
        b = ctx.reshape(b, (ctx.shape(b)[0], 1))
    y = ctx.emit(Prim.MATMUL, a, b)
    shape = list(ctx.shape(y))
    if b_vec:
        shape.pop(-1)
    if a_vec:
        shape.pop(-2 if not b_vec else -1)
    return ctx.reshape(y, shape)


def add_bias(ctx: Lowering, y: str, bias: str | None) -> str:
    if bias is None:
        return y
    rank = ctx.rank(y)
    return ctx.elementwise(Prim.ADD, y, ctx.reshape(bias, (ctx.shape(bias)[0],) + (1,) * (rank - 2)))
