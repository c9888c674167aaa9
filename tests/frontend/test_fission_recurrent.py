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


@pytest.mark.parametrize(
    "activations,alpha,beta",
    [
        (["Relu"], None, None),
        (["LeakyRelu"], None, None),  # (alpha 0.01, as the operator's)
        (["LeakyRelu"], [0.2], None),
        (["ThresholdedRelu"], [0.3], None),
        (["Affine"], [0.7], [0.1]),
        (["ScaledTanh"], [1.5], [0.6]),
        (["HardSigmoid"], None, None),
        (["Elu"], [0.5], None),
        (["Softsign"], None, None),
        (["Softplus"], None, None),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, list) else "",
)
def test_rnn_activations(activations, alpha, beta):
    attrs = {"activations": activations}
    attrs.update({k: v for k, v in (("activation_alpha", alpha), ("activation_beta", beta)) if v})
    _check("RNN", _inputs("RNN", 1, initial=True), attrs)


def test_activation_parameters_are_consumed_by_the_functions_that_take_them():
    """[Relu, LeakyRelu] with alpha [0.3]: LeakyRelu's 0.3 (Relu takes none); an LSTM's six
    functions over two directions take theirs in order, defaults after the list runs out."""
    _check("GRU", _inputs("GRU", 1), {"activations": ["Relu", "LeakyRelu"], "activation_alpha": [0.3]})
    lstm = ["HardSigmoid", "Affine", "Elu", "Sigmoid", "ScaledTanh", "LeakyRelu"]
    attrs = {"direction": "bidirectional", "activations": lstm, "activation_alpha": [0.3, 0.8, 0.9, 1.2]}
    attrs["activation_beta"] = [0.4, 0.05, 0.7]
    _check("LSTM", _inputs("LSTM", 2, initial=True, peepholes=True), attrs)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lengths_known_at_run_time(op, direction):
    """Past its length a batch entry's state holds and its output is zero; backwards, each entry
    starts at its own last step."""
    directions = 2 if direction == "bidirectional" else 1
    inputs = _inputs(op, directions, initial=True)
    inputs[4] = np.array([SEQ - 2, SEQ], "int32")
    _check(op, inputs, {"direction": direction})


@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm_coupling_its_input_and_forget_gates(peepholes):
    """input_forget: the forget gate is one minus the input gate (ONNX Runtime's meaning; the
    spec says only "couple"), its peephole unused."""
    _check(
        "LSTM",
        _inputs("LSTM", 2, initial=True, peepholes=peepholes),
        {"direction": "bidirectional", "input_forget": 1},
    )


def test_constant_sequence_lengths():
    inputs = _inputs("LSTM", 2, initial=True, peepholes=True)
    inputs[4] = Const(np.array([1, SEQ - 1], "int32"))
    _check("LSTM", inputs, {"direction": "bidirectional", "clip": 0.9})
    whole = _inputs("GRU", 1, initial=True)
    whole[4] = Const(np.array([SEQ, SEQ], "int32"))  # (every sequence whole: nothing to mask)
    _check("GRU", whole, {})


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("RNN", {"activations": ["ThresholdedRelu"]}),  # (ONNX Runtime's default alpha is 0, the spec's 1)
        ("RNN", {"activations": ["Affine"], "activation_alpha": [0.5]}),  # (no beta)
    ],
    ids=["thresholded-default", "affine-no-beta"],
)
def test_recurrent_cases_without_an_agreed_meaning_stay_opaque(op, attrs):
    n_out = 3 if op == "LSTM" else 2
    model, _ = one_node_model(
        op, _inputs(op, 1), {"hidden_size": HIDDEN, **attrs}, 14, n_out, ["float32"] * n_out
    )
    assert [op for op, _ in korch.fission(model).opaque] == [op]
