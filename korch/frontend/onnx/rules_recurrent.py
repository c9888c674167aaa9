"""Fission rules for the recurrent operators (RNN, GRU, LSTM), unrolled over the static sequence:
the input projection of every step is one matmul up front; each step is a matmul by the recurrent
weights and the gates' elementwise work."""

from __future__ import annotations

from collections.abc import Callable

from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_elementwise import softsign_core, thresholded_relu_core
from korch.frontend.ops.elementwise import (
    clip_core,
    elu_core,
    hard_sigmoid_core,
    leaky_relu_core,
    softplus_core,
)
from korch.frontend.ops.linear import matmul
from korch.ir.prims import Prim

# each activation's (alpha, beta), as many as it takes, defaulting as the operator of its name
# does; None where ONNX Runtime's default is not the spec's (ThresholdedRelu: 0, not 1) or there
# is no operator (Affine, ScaledTanh): those must be given
_PARAMS = {
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "Softsign": (),
    "Softplus": (),
    "LeakyRelu": (0.01,),
    "ThresholdedRelu": (None,),
    "Elu": (1.0,),
    "HardSigmoid": (0.2, 0.5),
    "Affine": (None, None),
    "ScaledTanh": (None, None),
}
_DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}  # (ONNX's gate order: GRU z, r, h; LSTM i, o, f, c)


def _direction(ctx: Lowering, v: str, d: int) -> str:
    """The d-th slice along axis 0, that axis dropped."""
    return ctx.reshape(ctx.slice_axis(v, 0, d, 1), ctx.shape(v)[1:])


class _Cell:
    """One direction of one recurrent operator: its weights, activations and step."""

    def __init__(self, ctx: Lowering, n: OnnxNode, d: int, hidden: int, acts: list[Activation]):
        self.ctx, self.op, self.hidden, self.acts = ctx, n.op_type, hidden, acts
        self.clip = n.attr("clip", None)
        width = _GATES[self.op] * hidden
        self.r_t = ctx.transpose(_direction(ctx, n.inputs[2], d), (1, 0))  # [H, G*H]
        bias = n.input(3)
        self.rb = None if bias is None else ctx.slice_axis(_direction(ctx, bias, d), 0, width, width)
        self.coupled = self.op == "LSTM" and bool(n.attr("input_forget", 0))  # (forget gate = 1 - input gate)
        peepholes = n.input(7) if self.op == "LSTM" else None
        self.peep = None if peepholes is None else _direction(ctx, peepholes, d)
        self.before_reset = n.attr("linear_before_reset", 0) if self.op == "GRU" else 0

    def part(self, v: str, k: int) -> str:
        """The k-th gate's block of the last axis."""
        return self.ctx.slice_axis(v, self.ctx.rank(v) - 1, k * self.hidden, self.hidden)

    def act(self, i: int, v: str, gate: bool = True) -> str:
        """The i-th activation; a gate's input is clipped first ("applied to the input of
        activations", as ONNX Runtime does for the gates)."""
        ctx = self.ctx
        if gate and self.clip is not None:
            v = clip_core(ctx, v, ctx.scalar(-self.clip, ctx.dtype(v)), ctx.scalar(self.clip, ctx.dtype(v)))
        return self.acts[i](ctx, v)

    def recurrent(self, h: str, first: int, count: int) -> str:
        """h @ R^T + Rb for gates first .. first + count - 1: [batch, count * H]."""
        ctx, hidden = self.ctx, self.hidden
        r_t = ctx.slice_axis(self.r_t, 1, first * hidden, count * hidden)
        y = matmul(ctx, h, r_t)
        if self.rb is None:
            return y
        return ctx.elementwise(Prim.ADD, y, ctx.slice_axis(self.rb, 0, first * hidden, count * hidden))

    def step(self, x: str, h: str, c: str | None) -> tuple[str, str | None]:
        """x: this step's input projection (+ Wb), [batch, G*H]; returns the new (h, c)."""
        ctx = self.ctx

        def add(a: str, b: str) -> str:
            return ctx.elementwise(Prim.ADD, a, b)

        def mul(a: str, b: str) -> str:
            return ctx.elementwise(Prim.MUL, a, b)

        if self.op == "RNN":
            return self.act(0, add(x, self.recurrent(h, 0, 1))), None
        if self.op == "GRU":
            rec = self.recurrent(h, 0, 3 if self.before_reset else 2)
            z = self.act(0, add(self.part(x, 0), self.part(rec, 0)))
            r = self.act(0, add(self.part(x, 1), self.part(rec, 1)))
            # the reset gate scales h @ R^T + Rb (linear_before_reset), or h before the matmul
            candidate = mul(r, self.part(rec, 2)) if self.before_reset else self.recurrent(mul(r, h), 2, 1)
            new = self.act(1, add(self.part(x, 2), candidate))
            keep = ctx.elementwise(Prim.SUB, ctx.scalar(1, ctx.dtype(z)), z)
            return add(mul(keep, new), mul(z, h)), None
        rec = add(x, self.recurrent(h, 0, 4))
        pre = [self.part(rec, k) for k in range(4)]  # i, o, f, c
        if self.peep is not None:
            pre[0] = add(pre[0], mul(c, self.part(self.peep, 0)))
            pre[2] = add(pre[2], mul(c, self.part(self.peep, 2)))
        i = self.act(0, pre[0])
        f = ctx.elementwise(Prim.SUB, ctx.scalar(1, ctx.dtype(i)), i) if self.coupled else self.act(0, pre[2])
        c = add(mul(f, c), mul(i, self.act(1, pre[3])))
        if self.peep is not None:
            pre[1] = add(pre[1], mul(c, self.part(self.peep, 1)))
        return mul(self.act(0, pre[1]), self.act(2, c, gate=False)), c


Activation = Callable[[Lowering, str], str]


def _activations(ctx: Lowering, n: OnnxNode, directions: int) -> list[list[Activation]]:
    """Each direction's activation functions. activation_alpha and activation_beta are consumed
    in order by the functions that take them (as ONNX Runtime reads them)."""
    per = len(_DEFAULTS[n.op_type])
    names = n.attr("activations", None) or _DEFAULTS[n.op_type] * directions
    if len(names) != per * directions or any(a not in _PARAMS for a in names):
        ctx.unsupported(f"{n.op_type} activations {names}")
    alphas, betas = iter(n.attr("activation_alpha", None) or ()), iter(n.attr("activation_beta", None) or ())
    fns = []
    for name in names:
        params = [next(given, default) for given, default in zip((alphas, betas), _PARAMS[name])]
        if None in params:
            ctx.unsupported(f"{n.op_type} activation {name} without its alpha and beta")
        fns.append(activation(name, *params))
    return [fns[d * per : (d + 1) * per] for d in range(directions)]


def activation(name: str, alpha: float = 0.0, beta: float = 0.0) -> Activation:
    """ONNX's recurrent activation functions (the RNN operator's list), and the two more that ONNX
    Runtime's FusedGemm takes (Selu: alpha, gamma as beta; ParametricSoftplus)."""

    def apply(ctx: Lowering, v: str) -> str:
        def s(value: float) -> str:
            return ctx.scalar(value, ctx.dtype(v))

        if name in ("Tanh", "Sigmoid"):
            return ctx.unary(Prim.TANH if name == "Tanh" else Prim.SIGMOID, v)
        if name == "Relu":
            return ctx.elementwise(Prim.MAX, v, s(0))
        if name == "Affine":
            return ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, v, s(alpha)), s(beta))
        if name == "LeakyRelu":
            return leaky_relu_core(ctx, v, alpha)
        if name == "ThresholdedRelu":
            return thresholded_relu_core(ctx, v, alpha)
        if name == "ScaledTanh":
            return ctx.elementwise(
                Prim.MUL, ctx.unary(Prim.TANH, ctx.elementwise(Prim.MUL, v, s(beta))), s(alpha)
            )
        if name == "HardSigmoid":
            return hard_sigmoid_core(ctx, v, alpha, beta)
        if name == "Elu":
            return elu_core(ctx, v, alpha)
        if name == "Selu":
            return ctx.elementwise(Prim.MUL, elu_core(ctx, v, alpha), s(beta))
        if name == "Softsign":
            return softsign_core(ctx, v)
        if name == "ParametricSoftplus":
            inner = softplus_core(ctx, ctx.elementwise(Prim.MUL, v, s(beta)))
            return ctx.elementwise(Prim.MUL, inner, s(alpha))
        return softplus_core(ctx, v)  # (Softplus)

    return apply


@fission("RNN", 7, 14)
@fission("GRU", 7, 14)
@fission("LSTM", 7, 14)
def recurrent(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Y [seq, directions, batch, H], Y_h [directions, batch, H] (LSTM: Y_c too); layout 1 puts
    the batch first. A reverse direction runs its steps backwards. With sequence_lens, a batch
    entry's steps past its length keep its state and output zeros."""
    x, w = n.inputs[0], n.inputs[1]
    if n.attr("layout", 0):
        x = ctx.transpose(x, (1, 0, 2))
    seq, batch, _ = ctx.shape(x)
    direction = n.attr("direction", "forward")
    directions = 2 if direction == "bidirectional" else 1
    hidden = ctx.shape(w)[1] // _GATES[n.op_type]
    n.attr("hidden_size", hidden)
    lengths = n.input(4)  # (per batch entry: past it the state holds and the output is zero)
    known = ctx.const_value(lengths)
    if lengths is not None and known is not None and (known == seq).all():
        lengths = None
    acts = _activations(ctx, n, directions)
    ys, hs, cs = [], [], []
    for d in range(directions):
        cell = _Cell(ctx, n, d, hidden, acts[d])
        width = _GATES[n.op_type] * hidden
        projected = matmul(
            ctx, ctx.reshape(x, (seq * batch, ctx.shape(x)[2])), ctx.transpose(_direction(ctx, w, d), (1, 0))
        )
        if n.input(3) is not None:
            projected = ctx.elementwise(
                Prim.ADD, projected, ctx.slice_axis(_direction(ctx, n.inputs[3], d), 0, 0, width)
            )
        projected = ctx.reshape(projected, (seq, batch, width))
        h = _initial(ctx, n, 5, d, (batch, hidden), ctx.dtype(x))
        c = _initial(ctx, n, 6, d, (batch, hidden), ctx.dtype(x)) if n.op_type == "LSTM" else None
        outs = {}
        backwards = direction == "reverse" or d == 1
        for t in reversed(range(seq)) if backwards else range(seq):
            new_h, new_c = cell.step(ctx.reshape(ctx.slice_axis(projected, 0, t, 1), (batch, width)), h, c)
            if lengths is None:
                h, c, y = new_h, new_c, new_h
            else:  # (backwards, each sequence starts at its own last step)
                live = ctx.reshape(
                    ctx.elementwise(Prim.LT, ctx.scalar(t, "int64"), ctx.cast(lengths, "int64")), (batch, 1)
                )
                h = ctx.elementwise(Prim.WHERE, live, new_h, h)
                c = None if c is None else ctx.elementwise(Prim.WHERE, live, new_c, c)
                y = ctx.elementwise(Prim.WHERE, live, new_h, ctx.scalar(0, ctx.dtype(new_h)))
            outs[t] = ctx.reshape(y, (1, 1, batch, hidden))
        ys.append(ctx.concat([outs[t] for t in range(seq)], 0))
        hs.append(ctx.reshape(h, (1, batch, hidden)))
        cs.append(None if c is None else ctx.reshape(c, (1, batch, hidden)))
    y, y_h = ctx.concat(ys, 1), ctx.concat(hs, 0)
    results = [y, y_h] + ([ctx.concat(cs, 0)] if n.op_type == "LSTM" else [])
    if n.attr("layout", 0):
        results = [ctx.transpose(results[0], (2, 0, 1, 3))] + [
            ctx.transpose(v, (1, 0, 2)) for v in results[1:]
        ]
    return results


def _initial(ctx: Lowering, n: OnnxNode, i: int, d: int, shape, dtype: str) -> str:
    """The d-th direction's initial state (input i), [batch, H], or zeros."""
    v = n.input(i)
    if v is None:
        return ctx.broadcast_to(ctx.scalar(0, dtype), shape)
    if n.attr("layout", 0):
        v = ctx.transpose(v, (1, 0, 2))
    return _direction(ctx, v, d)
