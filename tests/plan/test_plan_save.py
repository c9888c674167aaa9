"""Plan.save over existing paths: a korch plan is replaced, nothing korch did not write is lost."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from badinput import good_model

from korch.cli import commands as cli
from korch.errors import KorchError
from korch.ir.prims import TensorType
from korch.pipeline import OptimizeOptions, optimize
from korch.plan.meta import PlanMeta
from korch.plan.plan import Plan

FAST = dict(backends=("onnxruntime", "vendor"), min_time=0.002, progress=False)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(good_model(), path)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache") / "p.sqlite"


@pytest.fixture(scope="module")
def real_plan(model_path, cache):
    """An optimized plan with every file save writes (weights, graph, model, plan, manifest)."""
    return optimize(model_path, options=OptimizeOptions(cache=cache, max_size=2, **FAST))


def small_plan(tag: float) -> Plan:
    x = TensorType((4,), "float32")
    return Plan([("x", x)], [("x", "y")], [], {"w": np.full(3, tag, "float32")}, meta=PlanMeta(seconds=tag))


def snapshot(root) -> dict[str, str]:
    """Every path under `root` (relative) -> sha256 of a file, or "dir": the oracle on disk."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            path = Path(dirpath, f)
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def feeds(plan: Plan) -> dict[str, np.ndarray]:
    return plan.random_inputs(seed=3)


def test_resaving_a_plan_holding_a_user_file_is_refused_and_deletes_nothing(real_plan, tmp_path):
    target = real_plan.save(tmp_path / "plan")
    (target / "notes.txt").write_text("important")
    np.savez(target / "out.npz", y=np.arange(5))
    before = snapshot(tmp_path)
    with pytest.raises(KorchError, match=r"did not write \(notes.txt, out.npz\).*not overwriting") as e:
        real_plan.save(target)
    assert "\n" not in str(e.value)
    assert snapshot(tmp_path) == before  # the old plan and the user's files, byte for byte
    reloaded = Plan.load(target)  # the old plan still loads
    got, want = reloaded.run(feeds(real_plan)), real_plan.run(feeds(real_plan))
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_file_named_plan_json_does_not_make_a_directory_a_plan(tmp_path):
    """The reviewer's reproduction: `{}` in plan.json beside the user's notes."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "plan.json").write_text("{}")
    (tmp_path / "proj" / "notes.txt").write_text("important")
    before = snapshot(tmp_path)
    with pytest.raises(KorchError, match="not a korch plan directory.*not overwriting"):
        small_plan(1).save(tmp_path / "proj")
    assert snapshot(tmp_path) == before


def test_a_users_model_onnx_in_a_plan_without_a_model_is_not_korchs(tmp_path):
    """model.onnx is a name save writes, but this plan (no source model) never wrote one."""
    target = small_plan(1).save(tmp_path / "plan")
    (target / "model.onnx").write_bytes(b"the user's own model")
    before = snapshot(tmp_path)
    with pytest.raises(KorchError, match=r"did not write \(model.onnx\)"):
        small_plan(2).save(target)
    assert snapshot(tmp_path) == before


def test_a_users_dot_old_directory_beside_the_plan_survives(tmp_path):
    (tmp_path / ".plan.old").mkdir()
    (tmp_path / ".plan.old" / "thesis.tex").write_text("precious")
    small_plan(1).save(tmp_path / "plan")
    small_plan(2).save(tmp_path / "plan")  # replacing the plan: the old one goes aside, then away
    assert (tmp_path / ".plan.old" / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".plan.old", "plan"]
    assert Plan.load(tmp_path / "plan").meta.seconds == 2


def test_leftovers_of_a_killed_save_are_cleaned_but_user_files_in_them_are_kept(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = int(proc.stdout)  # a process that has exited
    ours = [tmp_path / f".plan.tmp{dead}-0123abcd", tmp_path / f".plan.old{dead}-0123abcd"]
    for path in ours:  # what a killed save leaves: korch's files only
        path.mkdir()
        (path / "weights.npz").write_bytes(b"half")
    theirs = tmp_path / f".plan.tmp{dead}-89abcdef"  # korch's name, but someone else's file
    theirs.mkdir()
    (theirs / "weights.npz").write_bytes(b"half")
    (theirs / "thesis.tex").write_text("precious")
    small_plan(1).save(tmp_path / "plan")
    assert sorted(p.name for p in tmp_path.iterdir()) == [theirs.name, "plan"]
    assert sorted(p.name for p in theirs.iterdir()) == ["thesis.tex"]
    assert (theirs / "thesis.tex").read_text() == "precious"


def test_resaving_over_a_plan_replaces_it_and_it_loads_back(real_plan, tmp_path):
    target = small_plan(1).save(tmp_path / "plan")
    real_plan.save(target)  # a different plan over it
    manifest = (target / "MANIFEST.json").read_bytes()
    real_plan.save(target)  # and the same plan again: the same files
    assert (target / "MANIFEST.json").read_bytes() == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # no temporaries left
    loaded = Plan.load(target)
    got, want = loaded.run(feeds(real_plan)), real_plan.run(feeds(real_plan))
    assert want and all(np.array_equal(got[k], want[k]) for k in want)
    assert loaded.verify() <= 1e-4


def test_an_empty_directory_and_the_current_one_are_targets(tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    inode = (tmp_path / "here").stat().st_ino
    monkeypatch.chdir(tmp_path / "here")
    small_plan(1).save(".")
    assert Plan.load(".").meta.seconds == 1
    small_plan(2).save(".")  # over the plan a shell is in: the directory itself stays
    assert Plan.load(tmp_path / "here").meta.seconds == 2
    assert (tmp_path / "here").stat().st_ino == inode and os.getcwd() == str(tmp_path / "here")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]
    (tmp_path / "empty").mkdir()
    small_plan(3).save(tmp_path / "empty")
    assert Plan.load(tmp_path / "empty").meta.seconds == 3


def test_saving_through_a_symlink_replaces_the_plan_it_points_at(tmp_path):
    small_plan(1).save(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    small_plan(2).save(tmp_path / "link")
    assert (tmp_path / "link").is_symlink()
    assert Plan.load(tmp_path / "real").meta.seconds == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


@pytest.mark.e2e
def test_optimize_over_a_plan_holding_a_run_output_exits_2_and_keeps_it(
    real_plan, model_path, cache, tmp_path, capsys
):
    target = real_plan.save(tmp_path / "plan")
    out = target / "out.npz"
    # korch run no longer writes inside a plan; an older korch did, and so may anything else
    assert cli.main(["run", str(target), "--output", str(out)]) == 2 and not out.exists()
    np.savez(out, y=np.zeros(3))
    before = snapshot(tmp_path)
    argv = ["optimize", str(model_path), "-o", str(target), "--cache", str(cache), "--quiet"]
    argv += ["--backends", "onnxruntime,vendor", "--max-size", "2"]  # profiled once, by real_plan
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "out.npz" in err, (code, err)
    after = snapshot(tmp_path)
    assert after == before
    assert Plan.load(target) is not None
    out.unlink()
    assert cli.main(argv) == 0  # a plan holding only its own files is replaced
    assert Plan.load(target).verify() <= 1e-4
