"""Hostile models and tampered plans: external data is read only from inside a model file's own
folder, never for a plan or a model given as bytes; a plan is validated whole when it is loaded;
a plan replaced while it is being loaded comes back whole, old or new."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from adversarial_plans import (
    SECRET,
    add_model,
    chain_oracle,
    chain_plan,
    damaged_copy,
    external,
    hidden_external_models,
    hostile_plan_damage,
    inside_model,
    path_model_cases,
    plan_cases,
    source_plan,
    tampered_plan_damage,
    twice_written,
    write_secret,
)
from badinput import problem, run_main

import korch
from korch.errors import KorchError
from korch.plan.plan import Plan

HOSTILE = list(hostile_plan_damage(Path("/home")))
TAMPERED = list(tampered_plan_damage())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A home folder holding a 'private key', two good plans (a real optimized one with a kernel
    per primitive, one running its source model whole) and every hostile or tampered case."""
    root = tmp_path_factory.mktemp("adversarial")
    home = write_secret(root / "home")
    plans = {"chain": chain_plan(root), "source": source_plan(root)}
    cases = path_model_cases(root / "paths", root / "work") + plan_cases(plans, home, root / "plans")
    return {"root": root, "home": home, "plans": plans, "cases": {c.id: c for c in cases}}


def _problems(world, category: str, name: str, capsys) -> list[str]:
    cases = [c for c in world["cases"].values() if c.category == category and c.name.startswith(f"{name}-")]
    assert cases, name
    found = []
    for case in cases:
        code, _, err = run_main(case.argv, capsys)
        found.append(problem(case, code, err))
    return [p for p in found if p]


def test_the_corpus_is_large_and_covers_each_kind(world):
    by_category = Counter(c.category for c in world["cases"].values())
    assert set(by_category) == {"external-path", "external-plan", "tampered"}
    assert sum(by_category.values()) >= 50 and min(by_category.values()) >= 10, by_category


PATH_NAMES = (
    "dotdot",
    "absolute",
    "symlink-file",
    "symlink-dir",
    "home-relative",
    "missing-file",
    "a-directory",
    "empty-location",
    "constant-dotdot",
    "constant-absolute",
    "beyond-the-end",
)


@pytest.mark.parametrize("name", PATH_NAMES)
def test_a_model_file_reads_external_data_only_inside_its_folder(name, world, capsys, monkeypatch):
    """Each refused with one line naming the tensor, for every command that reads a model; from
    the home folder, where a relative path read against the current folder would find the key."""
    monkeypatch.chdir(world["home"])
    assert _problems(world, "external-path", name, capsys) == []


@pytest.mark.parametrize("name", HOSTILE)
def test_a_plan_whose_models_keep_data_outside_it_is_refused(name, world, capsys, monkeypatch):
    monkeypatch.chdir(world["home"])
    assert _problems(world, "external-plan", name, capsys) == []


def test_the_issue_repro_writes_no_outputs(world, capsys, monkeypatch):
    """`korch run` in a home folder put .ssh/id_rsa's bytes into the outputs."""
    monkeypatch.chdir(world["home"])
    plan = world["root"] / "plans" / "model-relative"
    code, _, err = run_main(["run", str(plan), "--output", "out.npz"], capsys)
    assert code == 2 and "'w'" in err and SECRET in err, err
    assert not (world["home"] / "out.npz").exists()


@pytest.mark.parametrize("name", TAMPERED)
def test_a_tampered_resealed_plan_is_refused_on_load(name, world, capsys):
    assert _problems(world, "tampered", name, capsys) == []


@pytest.mark.parametrize(
    "name,words",
    [
        ("kernel-order-swapped", ["kernel 0", "'t4'", "before"]),
        ("freed-too-early", ["kernel 1", "'t4'", "freed"]),
        ("weight-wrong-shape", ["kernel 0", "f32[2,4]"]),
        ("weight-wrong-dtype", ["kernel 0", "f64"]),
        ("input-wrong-shape", ["kernel 0", "'x'"]),
        ("output-value-renamed", ["'t9'"]),
        ("output-renamed", ["'z'"]),
        ("weight-key-missing", ["kernel 0", "'c1'"]),
        ("value-rewritten-as-another-type", ["kernel 3", "'t4'", "kernel 0"]),
    ],
)
def test_the_refusal_names_the_first_inconsistency(name, words, world):
    with pytest.raises(KorchError) as e:
        korch.load(world["root"] / "plans" / name)
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_the_good_plans_load_and_match_the_oracle(world):
    x = np.random.default_rng(5).standard_normal((64, 80)).astype("float32")
    chain = korch.load(world["plans"]["chain"])
    assert len(chain.kernels) >= 4
    np.testing.assert_allclose(chain.run({"x": x})["y"], chain_oracle(x), rtol=1e-4, atol=1e-4)
    source = korch.load(world["plans"]["source"])
    w = onnx.numpy_helper.to_array(add_model().graph.initializer[0])
    np.testing.assert_allclose(source.run({"x": x})["y"], x + w, rtol=1e-6)


def test_a_value_written_twice_as_one_type_is_consistent(world, tmp_path):
    """Two chosen kernels may share an output; the plan loads, and computes what the model does."""
    plan = korch.load(damaged_copy(world["plans"]["chain"], tmp_path / "twice", twice_written))
    assert len(plan.kernels) == 5
    x = np.random.default_rng(8).standard_normal((64, 80)).astype("float32")
    np.testing.assert_allclose(plan.run({"x": x})["y"], chain_oracle(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", ["bytes", "proto"])
@pytest.mark.parametrize("where", ["relative", "inside-looking", "absolute"])
def test_a_model_given_as_bytes_may_hold_no_external_data(form, where, world, monkeypatch):
    """ONNX Runtime, given a model's bytes, reads external data against the current folder."""
    monkeypatch.chdir(world["home"])
    location = {"relative": SECRET, "inside-looking": "w.bin", "absolute": str(world["home"] / SECRET)}[where]
    (world["home"] / "w.bin").write_bytes((world["home"] / SECRET).read_bytes())
    model = external(add_model(), "w", location)
    source = model.SerializeToString() if form == "bytes" else model
    with pytest.raises(KorchError, match=f"'w'.*{location}") as e:
        korch.fission(source)
    assert "\n" not in str(e.value)
    with pytest.raises(KorchError, match="'w'"):
        korch.optimize(source, backends="onnxruntime", max_size=1, progress=False)


@pytest.mark.parametrize("where", ["sparse-initializer", "subgraph-initializer", "function-constant"])
def test_external_data_is_found_wherever_a_tensor_can_be(where, world, monkeypatch):
    monkeypatch.chdir(world["home"])
    with pytest.raises(KorchError, match=f"'hidden'.*{SECRET}"):
        korch.fission(hidden_external_models()[where].SerializeToString())


def test_external_data_inside_the_folder_still_works(world, tmp_path, capsys, monkeypatch):
    """Imported with its data, and the plan holds the data itself: it runs without the model's
    folder, from anywhere."""
    path = inside_model(tmp_path / "model")
    assert run_main(["fission", str(path), "--check", "--quiet"], capsys)[0] == 0
    plan = korch.optimize(
        path, backends="onnxruntime", max_size=2, min_time=0.002, measure=False,
        cache=world["root"] / "cache.sqlite", progress=False,
    )  # fmt: skip
    saved = plan.save(tmp_path / "plan")
    (path.parent / "data" / "w.bin").unlink()
    monkeypatch.chdir(world["home"])
    x = np.random.default_rng(6).standard_normal((64, 80)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x)
    argv = ["run", str(saved), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")]
    code, _, err = run_main(argv, capsys)
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], chain_oracle(x), rtol=1e-4, atol=1e-4)
    assert run_main(["verify", str(saved), "--quiet"], capsys)[0] == 0


# ------------------------------------------------------------------- concurrent saves


SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    from korch.plan.meta import PlanMeta
    from korch.plan.plan import Plan
    from korch.ir.prims import TensorType
    target = sys.argv[1]
    pad = [str(i) for i in range(60000)]  # a large plan.json: parsing it takes a while
    plans = [
        Plan([("x", TensorType((4,), "float32"))], [("x", "y")], [],
             {"w": np.full(2**18, tag, "float32"), "v": np.full(4, tag, "float32")},
             meta=PlanMeta(seconds=tag, rewrites=pad))
        for tag in (1, 2)
    ]
    plans[0].save(target)
    print("saved", flush=True)
    i = 1
    while True:
        plans[i % 2].save(target)
        i += 1
""")


def test_a_plan_replaced_while_loading_loads_whole_old_or_new(tmp_path):
    """Another process re-saves the directory, alternating two plans, while this one loads it:
    every load is one plan whole (its meta and its weights from one save) or a clean refusal."""
    (tmp_path / "saver.py").write_text(SAVER)
    target = tmp_path / "plan"
    saver = subprocess.Popen(
        [sys.executable, str(tmp_path / "saver.py"), str(target)], stdout=subprocess.PIPE, text=True
    )
    outcomes, odd = Counter(), []
    try:
        assert saver.stdout.readline().strip() == "saved"
        stop = time.monotonic() + 5
        while time.monotonic() < stop:
            try:
                plan = Plan.load(target)
            except KorchError:
                outcomes["refused"] += 1
                continue
            except Exception as e:  # noqa: BLE001 (the point: nothing but a KorchError)
                odd.append(repr(e))
                continue
            tag = plan.meta.seconds
            whole = all(np.all(a == tag) for a in plan.weights.values())
            outcomes[tag if whole else "mixed"] += 1
    finally:
        saver.kill()
        saver.wait()
        saver.stdout.close()
    assert odd == [] and outcomes["mixed"] == 0, (odd[:3], outcomes)
    assert outcomes[1] > 0 and outcomes[2] > 0, outcomes
    if _exchanges(tmp_path):  # the directory is replaced in one step: never even refused
        assert outcomes["refused"] == 0, outcomes


def _exchanges(tmp_path: Path) -> bool:
    """Whether this system and file system swap two directories atomically."""
    from korch.plan.store import exchange

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return exchange(tmp_path / "a", tmp_path / "b")
