"""ONNX's own operator test cases (the node tests the onnx package ships, with their expected
outputs) through korch's import and the primitive graph's numpy reference: an oracle independent
of korch and of ONNX Runtime. A case korch cannot lower must fail with a one-line KorchError; one it
lowers must compute the expected outputs."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnxruntime as ort
import pytest

from korch.errors import KorchError
from korch.frontend.onnx.importer import import_onnx
from korch.ir import reference
from korch.ir.prims import BFLOAT16


@functools.cache
def _cases() -> list[tuple[str, object, list[np.ndarray], list[np.ndarray]]]:
    """(name, model, inputs, expected outputs) of every case whose inputs and outputs are tensors."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (some cases compute their expected values with overflows)
        cases = collect_testcases()
    out = []
    for case in cases:
        ins, want = case.data_sets[0]
        if all(isinstance(x, np.ndarray | np.generic) for x in (*ins, *want)):  # (scalars too)
            out.append((case.name, case.model, [np.asarray(x) for x in ins], [np.asarray(x) for x in want]))
    return out


def _disagreement(got: list[np.ndarray], want: list[np.ndarray]) -> str | None:
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if w.dtype == BFLOAT16:  # (a few of bfloat16's 2^-8 apart: korch rounds every primitive)
            g, w = g.astype(np.float32), w.astype(np.float32)
            if not np.allclose(g, w, rtol=2**-6, atol=1e-4, equal_nan=True):
                return f"output {i}: max abs diff {np.nanmax(np.abs(g - w)):.3g}"
        elif w.dtype.kind in "fc":
            if not np.allclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True):
                return f"output {i}: max abs diff {np.nanmax(np.abs(g.astype(np.float64) - w)):.3g}"
        elif not np.array_equal(g, w):
            return f"output {i}: differs in {np.mean(g != w):.1%} of its elements"
    return None


def _korch(model, ins: list[np.ndarray], strict: bool) -> list[np.ndarray]:
    names = [i.name for i in model.graph.input]
    fission = import_onnx(model, shapes={n: x.shape for n, x in zip(names, ins)}, strict=strict)
    got = reference.run(fission.graph, {n: x for n, x in zip(names, ins) if n in fission.graph.inputs})
    return [got[o.name] for o in model.graph.output]


def _outcomes(strict: bool):
    """(name, model, inputs, expected, korch's outputs, the crash) for each case korch does not
    refuse with a KorchError: its outputs, or else any other exception, the failure reported."""
    for name, model, ins, want in _cases():
        try:
            yield name, model, ins, want, _korch(model, ins, strict), None
        except KorchError:
            continue
        except Exception as e:
            yield name, model, ins, want, None, f"{type(e).__name__}: {str(e)[:100]}"


def test_every_onnx_node_case_korch_lowers_computes_the_expected_outputs():
    """Strict import (no opaque operators): Mod with fmod=0 on floats (opset 28) and SpaceToDepth's
    CRD mode (opset 28) once lowered to the older operators' results, and a Dropout whose
    training_mode is a run-time input to the identity; an attribute or input a rule does not look
    at is now an error, not a silent difference."""
    outcomes = list(_outcomes(strict=True))
    crashed = [f"{name}: {crash}" for name, *_, crash in outcomes if crash]
    wrong = [
        f"{name}: {_disagreement(got, want)}"
        for name, _, _, want, got, crash in outcomes
        if not crash and _disagreement(got, want)
    ]
    assert not crashed, crashed
    assert not wrong, wrong
    assert len(outcomes) >= 1140, len(outcomes)  # (1153 with onnx 1.23: most of the operator set)


@pytest.mark.e2e
def test_every_onnx_node_case_korch_imports_with_opaque_operators_computes_what_onnxruntime_does():
    """Without --strict an operator with no rule runs whole in ONNX Runtime, so the oracle is the
    expected outputs where ONNX Runtime computes them (it differs on a few: DFT's precision, cubic
    resizes with align_corners, random training dropout). An LSTM, GRU or RNN leaving its first
    output out once lost its second ('graph outputs [Y_h] are never computed')."""
    outcomes = list(_outcomes(strict=False))
    # an opaque operator that ONNX Runtime cannot run on these inputs fails in ONNX Runtime
    crashed = [
        f"{name}: {crash}" for name, model, ins, *_, crash in outcomes if crash and _onnxruntime(model, ins)
    ]
    wrong = [
        f"{name}: {_disagreement(got, want)}"
        for name, model, ins, want, got, crash in outcomes
        if not crash and _disagreement(got, want) and _disagreement(_onnxruntime(model, ins), want) is None
    ]
    assert not crashed, crashed
    assert not wrong, wrong
    # (1266 with onnx 1.23 and onnxruntime 1.32: NonZero, NonMaxSuppression and Unique on inputs,
    # whose output shapes depend on values, are refused)
    assert len(outcomes) >= 1255, len(outcomes)


def _onnxruntime(model, ins: list[np.ndarray]) -> list[np.ndarray] | None:
    """ONNX Runtime's outputs for the case, or None when it cannot run it."""
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {i.name: x for i, x in zip(model.graph.input, ins)})
    except Exception:  # any failure: ONNX Runtime does not run it
        return None


@pytest.mark.parametrize("opset", [13, 28])
def test_mod_on_floats_takes_the_divisors_sign_only_where_onnx_allows_it(opset):
    """fmod=0 on floats is Python's % from opset 28 (numpy's np.mod is the oracle, signed zeros
    and infinite divisors too); before it ONNX requires fmod=1 and korch says so."""
    from onnx import TensorProto, helper

    a = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0], np.float32)
    b = np.array([2.1, -3.4, 8.0, -2.1, 3.4, 5.0, -2.0, 2.0, np.inf, np.inf, -np.inf, -np.inf], np.float32)
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [len(a)]) for n in "abz"]
    node = helper.make_node("Mod", ["a", "b"], ["z"], fmod=0)
    model = helper.make_model(
        helper.make_graph([node], "mod", info[:2], info[2:]), opset_imports=[helper.make_opsetid("", opset)]
    )
    if opset < 28:
        with pytest.raises(KorchError, match="needs fmod=1 before opset 28"):
            _korch(model, [a, b], strict=True)
        return
    (got,) = _korch(model, [a, b], strict=True)
    want = np.mod(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def _constant_inputs(model, ins: list[np.ndarray], keep: int):
    """The model with its graph inputs after the first `keep` made initializers holding `ins`."""
    from onnx import numpy_helper

    frozen = type(model)()
    frozen.CopyFrom(model)
    graph = frozen.graph
    for value, x in zip(list(graph.input)[keep:], ins[keep:]):
        graph.initializer.append(numpy_helper.from_array(np.asarray(x), value.name))
    del graph.input[keep:]
    return frozen


@pytest.mark.parametrize(
    "prefix,keep,lowest",
    [
        ("test_resize_", 1, 37),
        ("test_center_crop_pad_", 1, 12),
        ("test_affine_grid_", 1, 4),
        ("test_dft", 1, 10),
        ("test_stft", 1, 2),
        ("test_hannwindow", 0, 4),
        ("test_hammingwindow", 0, 4),
        ("test_blackmanwindow", 0, 4),
        ("test_col2im", 1, 5),
        ("test_melweightmatrix", 0, 1),
    ],
)
def test_cases_with_their_shape_inputs_as_constants(prefix, keep, lowest):
    """ONNX's Resize, CenterCropPad, AffineGrid, DFT, STFT, window, Col2Im and MelWeightMatrix
    cases feed roi, scales, sizes, shapes, axes, lengths and steps as graph inputs (all inputs
    after the first `keep`), which korch needs as constants (they fix the output's shape): made
    initializers, every case korch lowers computes the expected outputs, or ONNX Runtime's where it
    differs from them (Resize downsampling by a scale with align_corners: ONNX's reference divides
    by the unrounded output size, ONNX Runtime by the output's). Resize: nearest, linear and cubic
    (with cubic_coeff_a and exclude_outside), tf_crop_and_resize, keep_aspect_ratio_policy and
    antialiased downsampling; the function-expanded forms of the others too."""
    lowered, wrong = [], []
    for name, model, ins, want in _cases():
        if not name.startswith(prefix):
            continue
        frozen = _constant_inputs(model, ins, keep)
        try:
            got = _korch(frozen, ins[:keep], strict=True)
        except KorchError:
            continue
        lowered.append(name)
        differs = _disagreement(got, want)
        theirs = _onnxruntime(frozen, ins[:keep])
        if differs and (theirs is None or _disagreement(got, theirs)):
            wrong.append(f"{name}: {differs}")
    assert not wrong, wrong
    assert len(lowered) >= lowest, (
        lowered
    )  # (all 39 Resize cases with onnx 1.23; all the others but 4 AffineGrid ones)
