"""RNN, GRU and LSTM unrolled into primitives, checked against ONNX Runtime."""

import numpy as np
import pytest
from helpers import Const, check_op, one_node_model, rand

import korch

SEQ, BATCH, INPUT, HIDDEN = 5, 2, 3, 4
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _inputs(op, directions, bias=True, initial=False, peepholes=False):
    g = GATES[op]
    x = rand(SEQ, BATCH, INPUT)
    inputs = [
        x,
        Const(rand(directions, g * HIDDEN, INPUT, seed=1) * 0.5),
        Const(rand(directions, g * HIDDEN, HIDDEN, seed=2) * 0.5),
        Const(rand(directions, 2 * g * HIDDEN, seed=3) * 0.2) if bias else None,
    ]
    if initial or peepholes:
        state = (directions, BATCH, HIDDEN)
        inputs += [None, rand(*state, seed=4) if initial else None]
        if op == "LSTM":
            inputs += [rand(*state, seed=5) if initial else None]
            if peepholes:
                inputs += [Const(rand(directions, 3 * HIDDEN, seed=6) * 0.3)]
    return inputs


def _check(op, inputs, attrs, opset=14):
    n_out = 3 if op == "LSTM" else 2
    attrs = {"hidden_size": HIDDEN, **attrs}
    return check_op(op, inputs, attrs, opset, n_outputs=n_out, out_dtypes=["float32"] * n_out, tol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_directions(op, direction):
    directions = 2 if direction == "bidirectional" else 1
    _check(op, _inputs(op, directions), {"direction": direction})


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_initial_state_clip_and_no_bias(op):
    """(layout 1, batch first, is in ONNX's own cases, test_*_batchwise: ONNX Runtime refuses it)"""
    _check(op, _inputs(op, 2, initial=True), {"direction": "bidirectional", "clip": 0.7})
    _check(op, _inputs(op, 1, bias=False), {}, opset=7)


def test_lstm_peepholes_and_gru_linear_before_reset():
    _check("LSTM", _inputs("LSTM", 2, initial=True, peepholes=True), {"direction": "bidirectional"})
    _check("GRU", _inputs("GRU", 1), {"linear_before_reset": 1})
    _check("RNN", _inputs("RNN", 1), {"activations": ["Sigmoid"]})


def test_recurrent_with_other_activations_or_sequence_lengths_stays_opaque():
    inputs = _inputs("GRU", 1, initial=True)
    inputs[4] = np.array([SEQ, SEQ - 2], "int32")  # (lengths known only at run time)
    model, feeds = one_node_model("GRU", inputs, {"hidden_size": HIDDEN}, 14, 2, ["float32"] * 2)
    assert [op for op, _ in korch.fission(model).opaque] == ["GRU"]
    model, _ = one_node_model(
        "RNN", _inputs("RNN", 1), {"hidden_size": HIDDEN, "activations": ["Relu"]}, 14, 2, ["float32"] * 2
    )
    assert [op for op, _ in korch.fission(model).opaque] == ["RNN"]
