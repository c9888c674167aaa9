"""Every bad input (models, plan directories, --inputs files, flags) is one `korch: error:` line and
exit 2, with the profile database untouched; the ONNX loader survives fuzzing."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import pytest
from badinput import (
    MODEL_COMMANDS,
    PLAN_COMMANDS,
    flag_cases,
    good_model,
    inputs_cases,
    model_cases,
    plan_cases,
    problem,
    run_main,
    zero_size_model,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import korch
from korch.cli import commands as cli
from korch.errors import KorchError

CATEGORIES = ("bytes", "structure", "dtype", "shape", "op", "plan", "inputs", "flags")


def _db_state(path) -> tuple[str, list]:
    """The file's checksum and every row, in order."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT * FROM profiles ORDER BY key, backend, device").fetchall()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    return digest, rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A good model, a good plan optimized from it (filling the cache), and every bad case."""
    root = tmp_path_factory.mktemp("bad")
    work = root / "work"
    work.mkdir()
    onnx.save(good_model(), root / "good.onnx")
    argv = ["optimize", str(root / "good.onnx"), "-o", str(root / "plan"), "--quiet"]
    argv += ["--backends", "onnxruntime", "--max-size", "2", "--cache", str(work / "cache.sqlite")]
    assert cli.main(argv) == 0
    cases = model_cases(root / "models", work)
    cases += plan_cases(root / "plan", root / "plans")
    cases += inputs_cases(root / "plan", root / "inputs")
    cases += flag_cases(root / "good.onnx", root / "plan", work)
    return {"cases": cases, "db": work / "cache.sqlite", "plan": root / "plan", "root": root}


@pytest.mark.e2e
def test_the_corpus_is_large_and_covers_every_command(corpus):
    by_category = Counter(c.category for c in corpus["cases"])
    assert set(by_category) == set(CATEGORIES)
    assert sum(by_category.values()) >= 300, by_category
    commands = Counter(c.argv[0] for c in corpus["cases"] if c.argv)
    assert all(commands[c] >= 20 for c in (*MODEL_COMMANDS, *PLAN_COMMANDS)), commands


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_bad_input_is_one_line_and_exit_2(category, corpus, capsys):
    before = _db_state(corpus["db"])
    problems = []
    for case in (c for c in corpus["cases"] if c.category == category):
        code, _, err = run_main(case.argv, capsys)
        problems.append(problem(case, code, err))
    assert [p for p in problems if p] == []
    assert _db_state(corpus["db"]) == before, "a bad input changed the profile database"


def test_zero_size_inputs_are_not_bad_input(corpus, capsys):
    path = corpus["root"] / "zero.onnx"
    onnx.save(zero_size_model(), path)
    for argv in (
        ["fission", str(path)],
        ["candidates", str(path)],
        ["fission", str(path), "--shape", "x=0x4"],  # restates the model's 0x4 (3x0 would contradict it)
    ):
        code, out, err = run_main([*argv, "--json", "--quiet"], capsys)
        assert code == 0, (argv, err)
        assert json.loads(out)["primitives"] >= 1


def test_the_good_plan_still_runs_and_mismatches_can_be_overridden(corpus, capsys):
    """The corpus copies were damaged, not the original; an explicit override loads a stale plan."""
    assert run_main(["verify", str(corpus["plan"]), "--quiet"], capsys)[0] == 0
    stale = corpus["root"] / "plans" / "torch-version-mismatch-resealed"
    code, out, err = run_main(["verify", str(stale), "--allow-version-mismatch", "--json"], capsys)
    assert code == 0 and '"ok": true' in out, err
    with pytest.raises(KorchError, match="torch 1.0.0"):
        korch.load(stale)
    assert korch.load(stale, allow_mismatch=True).meta.versions["torch"] == "1.0.0"


@pytest.mark.parametrize(
    "argv_of",
    [
        lambda c: ["optimize", str(c["root"] / "models" / "random-bytes-large.onnx"), "-o", "p"],
        lambda c: ["verify", str(c["root"] / "plans" / "truncated-weights-resealed")],
        lambda c: ["run", str(c["plan"]), "--inputs", str(c["root"] / "inputs" / "plain.npy")],
    ],
    ids=["model", "plan", "inputs"],
)
def test_a_real_process_prints_no_traceback(argv_of, corpus):
    proc = subprocess.run(
        [sys.executable, "-m", "korch.cli.commands", *argv_of(corpus)], capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("korch: error: ")


# ----------------------------------------------------------------------------------- fuzzing
BLOB = good_model().SerializeToString()
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _loads_or_korch_error(source) -> None:
    try:
        korch.fission(source)
    except KorchError as e:
        assert str(e).strip() and "\n" not in str(e).strip(), repr(e)


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, len(BLOB) - 1), st.integers(0, 255)), max_size=6),
    cut=st.integers(1, len(BLOB)),
    junk=st.binary(max_size=16),
)
@example(edits=[(69, 128)], cut=165, junk=b"")  # the graph's name no longer UTF-8 (found in CI)
def test_fuzz_mutated_bytes(edits, cut, junk, tmp_path_factory):
    data = bytearray(BLOB)
    for at, byte in edits:
        data[at] = byte
    path = tmp_path_factory.getbasetemp() / "fuzz.onnx"
    path.write_bytes(bytes(data[:cut]) + junk)
    _loads_or_korch_error(path)


OPS = ["Add", "Relu", "Mul", "MatMul", "Softmax", "Reshape", "Transpose", "Gemm", "Frob", "Concat"]
NAMES = ["x", "w", "a", "r", "y", "", "zz"]


@st.composite
def mutated_models(draw):
    model = good_model()
    graph = model.graph
    node = graph.node[draw(st.integers(0, len(graph.node) - 1))]
    choice = draw(st.integers(0, 7))
    if choice == 0:
        node.op_type = draw(st.sampled_from(OPS))
    elif choice == 1:
        node.input[draw(st.integers(0, len(node.input) - 1))] = draw(st.sampled_from(NAMES))
    elif choice == 2:
        graph.input[0].type.tensor_type.elem_type = draw(st.integers(0, 25))
    elif choice == 3:
        dim = graph.input[0].type.tensor_type.shape.dim[draw(st.integers(0, 1))]
        dim.dim_value = draw(st.integers(-3, 2**40))
    elif choice == 4:
        model.opset_import[0].version = draw(st.integers(0, 30))
    elif choice == 5:
        model.ir_version = draw(st.integers(0, 15))
    elif choice == 6:
        init = graph.initializer[0]
        init.data_type = draw(st.integers(0, 25))
        init.dims[draw(st.integers(0, 1))] = draw(st.integers(-2, 9))
    else:
        node.attribute.extend([onnx.helper.make_attribute(draw(st.sampled_from(["axis", "perm"])), 9)])
    node.domain = draw(st.sampled_from(["", "", "", "ai.onnx", "com.acme"]))
    return model


@FUZZ
@given(model=mutated_models())
def test_fuzz_mutated_fields(model):
    _loads_or_korch_error(model)


def test_fuzz_baseline_loads():
    """The unmutated model loads, so the fuzz tests exercise both outcomes."""
    result = korch.fission(good_model())
    assert len(result.graph.nodes) >= 2 and not result.opaque
    assert np.asarray(result.graph.constants[next(iter(result.graph.constants))]).size >= 1
