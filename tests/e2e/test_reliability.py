"""Crash safety of plan writing, concurrent optimizes on one database, faulty backends end to end,
and plans refused when the setup they were built for has changed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np
import onnx
import pytest
from badinput import good_model
from faulty_backends import HangBackend, RaiseBackend, SegfaultBackend, WrongBackend
from helpers import onnx_model

import korch
import korch.pipeline as optimize_module
from korch.backends import get_backends
from korch.errors import KorchError
from korch.pipeline import OptimizeOptions, optimize
from korch.plan.check import write_manifest
from korch.plan.meta import PlanMeta
from korch.plan.plan import Plan

SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    from korch.plan.meta import PlanMeta
    from korch.plan.plan import Plan
    from korch.ir.prims import TensorType
    target, n = sys.argv[1], 16 * 2**20
    plans = [
        Plan([("x", TensorType((4,), "float32"))], [("x", "y")], [],
             {"w": np.full(n, tag, "float32"), "v": np.full(4, tag, "float32")},
             meta=PlanMeta(seconds=tag))
        for tag in (1, 2)
    ]
    print("ready", flush=True)
    i = 0
    while True:
        plans[i % 2].save(target)
        print("saved", flush=True)
        i += 1
""")


def _consistent_or_refused(path) -> str:
    """A plan directory after a crash: a complete plan (every weight from one save) or refused."""
    try:
        plan = Plan.load(path)
    except KorchError:
        return "refused"
    tag = plan.meta.seconds
    assert tag in (1, 2)
    assert np.all(plan.weights["w"] == tag) and np.all(plan.weights["v"] == tag)
    return "loaded"


def test_sigkill_during_plan_writing_never_leaves_a_loadable_partial_plan(tmp_path):
    (tmp_path / "saver.py").write_text(SAVER)
    target = tmp_path / "plan"
    outcomes, partial = [], 0
    for delay in (0.05, 0.2, 0.45, 0.8):
        proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "saver.py"), str(target)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "ready"
        assert proc.stdout.readline().strip() == "saved"  # a whole plan exists, however slow the disk
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        outcomes.append(_consistent_or_refused(target))
        for leftover in tmp_path.glob(".plan.*"):  # half-written temporaries and the old plan
            partial += 1
            _consistent_or_refused(leftover)
    assert "loaded" in outcomes, outcomes  # the old or the new plan survives almost every kill
    assert partial > 0, "no kill landed mid-write"
    Plan([], [], [], {"w": np.zeros(3, "float32")}, meta=PlanMeta(seconds=1)).save(target)  # and recovers
    assert Plan.load(target).meta.seconds == 1 and not list(tmp_path.glob(".plan.*"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(good_model(), path)
    return path


def test_two_optimizes_on_one_database_at_once(tiny_model, tmp_path):
    db = tmp_path / "shared.sqlite"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "korch.cli.commands",
                "optimize",
                str(tiny_model),
                "-o",
                str(tmp_path / f"plan{i}"),
                "--cache",
                str(db),
                "--backends",
                "onnxruntime,vendor",
                "--max-size",
                "2",
                "--jobs",
                "1",
                "--json",
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
        assert json.loads(out)["solver"]["status"] == "optimal"
    for i in range(2):
        assert korch.load(tmp_path / f"plan{i}").verify() <= 1e-4
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = conn.execute("SELECT COUNT(*), COUNT(DISTINCT key || backend) FROM profiles").fetchone()
    conn.close()
    assert rows[0] == rows[1] > 0


@pytest.mark.parametrize("how", ["stdin", "unguarded file"])
def test_a_script_profiles_in_worker_processes_however_it_is_run(how, tiny_model, tmp_path):
    """Spawned workers re-ran the parent's main script: one read from stdin has no path, and a
    file that calls korch outside `if __name__ == "__main__":` started korch again in every
    worker, which Python stops; either way every worker died before its first job (all kernels
    'failed'). Workers now start without the main script."""
    db = tmp_path / "p.sqlite"
    script = textwrap.dedent(f"""
        from korch.pipeline import OptimizeOptions, optimize
        options = OptimizeOptions(
            backends=("onnxruntime", "vendor"), max_size=2, jobs=1, min_time=0.002, progress=False,
            cache={str(db)!r},
        )
        assert optimize({str(tiny_model)!r}, options=options).verify() <= 1e-4
    """)
    if how == "stdin":
        run = dict(args=[sys.executable, "-"], input=script)
    else:
        (tmp_path / "script.py").write_text(script)
        run = dict(args=[sys.executable, str(tmp_path / "script.py")])
    proc = subprocess.run(**run, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    conn = sqlite3.connect(db)
    failed = conn.execute("SELECT COUNT(*) FROM profiles WHERE status != 'ok'").fetchone()[0]
    conn.close()
    assert failed == 0


def test_faulty_backends_are_excluded_and_the_plan_verifies(tmp_path, monkeypatch):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    relu = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(onnx_model(relu), tmp_path / "m.onnx")
    faulty = [SegfaultBackend(), HangBackend(), WrongBackend(), RaiseBackend()]
    monkeypatch.setattr(optimize_module, "get_backends", lambda *args: faulty + get_backends(*args))
    quick = dataclasses.replace  # a hang costs one compile timeout, not five minutes
    real_options = optimize_module.ProfileOptions
    monkeypatch.setattr(
        optimize_module,
        "ProfileOptions",
        lambda **kw: quick(real_options(**kw), compile_timeout=4, jobs=2),
    )
    options = OptimizeOptions(
        backends=("onnxruntime",),
        cache=tmp_path / "p.sqlite",
        progress=False,
        min_time=0.002,
        seeds=False,
    )
    plan = optimize(tmp_path / "m.onnx", options=options)
    assert {k.backend for k in plan.kernels} == {"onnxruntime"}
    profiling = plan.meta.profiling
    assert profiling["failed"] >= 4 * plan.meta.candidates["unique_candidates"], profiling
    plan.save(tmp_path / "plan")
    assert korch.load(tmp_path / "plan").verify() <= 1e-4


def test_when_every_backend_fails_the_error_says_why(tmp_path, monkeypatch):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    relu = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(onnx_model(relu), tmp_path / "m.onnx")
    monkeypatch.setattr(optimize_module, "get_backends", lambda *args: [RaiseBackend()])
    options = OptimizeOptions(cache=tmp_path / "p.sqlite", progress=False, min_time=0.002, seeds=False)
    why = "commonest profiling failure: 'raise: RuntimeError: no kernel for you'"
    with pytest.raises(KorchError, match=why):
        optimize(tmp_path / "m.onnx", options=options)


def _reseal(path, edit) -> None:
    doc = json.loads((path / "plan.json").read_text())
    edit(doc)
    (path / "plan.json").write_text(json.dumps(doc))
    write_manifest(path)


def test_only_versions_the_plan_depends_on_are_compared(tiny_model, tmp_path):
    options = OptimizeOptions(
        backends=("onnxruntime", "vendor"),
        cache=tmp_path / "p.sqlite",
        progress=False,
        min_time=0.002,
        max_size=2,
        seeds=False,
    )
    plan = optimize(tiny_model, options=options)
    used = {k.backend for k in plan.kernels}
    unused = {"onnxruntime", "vendor"} - used
    versions = plan.meta.versions
    assert {"korch", "torch", "onnxruntime", *(f"backend:{b}" for b in used)} <= set(versions)
    assert plan.meta.device_name
    plan.save(tmp_path / "plan")
    stale_unused = {f"backend:{name}": "x" for name in unused}  # unused backends may change freely
    _reseal(tmp_path / "plan", lambda d: d["meta"]["versions"].update(stale_unused))
    assert korch.load(tmp_path / "plan").verify() <= 1e-4
    used_key = f"backend:{sorted(used)[0]}"
    _reseal(tmp_path / "plan", lambda d: d["meta"]["versions"].__setitem__(used_key, "stale"))
    with pytest.raises(KorchError, match=f"{used_key} stale"):
        korch.load(tmp_path / "plan")
    assert korch.load(tmp_path / "plan", allow_mismatch=True).verify() <= 1e-4


def test_the_manifest_is_written_last_and_covers_every_file(tmp_path):
    plan = Plan([], [], [], {"w": np.arange(5, dtype="float32")}, meta=PlanMeta(seconds=3))
    plan.save(tmp_path / "p")
    manifest = json.loads((tmp_path / "p" / "MANIFEST.json").read_text())
    files = sorted(p.name for p in (tmp_path / "p").iterdir() if p.name != "MANIFEST.json")
    assert sorted(manifest["files"]) == files
    newest = max(os.stat(tmp_path / "p" / f).st_mtime_ns for f in files)
    assert os.stat(tmp_path / "p" / "MANIFEST.json").st_mtime_ns >= newest
    (tmp_path / "p" / "extra.txt").write_text("not part of the plan")  # additions are harmless
    assert Plan.load(tmp_path / "p").meta.seconds == 3
    with open(tmp_path / "p" / "plan.json", "a") as f:
        f.write(" ")
    with pytest.raises(KorchError, match="plan.json"):
        Plan.load(tmp_path / "p")
