"""Typed plan metadata (korch.plan.meta.PlanMeta): every field saved and read back, and a plan of
an older format, or with metadata that is not PlanMeta's, refused with one line."""

import dataclasses
import json

import numpy as np
import pytest

from korch.cli import commands as cli
from korch.errors import KorchError
from korch.ir.prims import TensorType
from korch.measure.device import device_name
from korch.plan.check import current_versions, write_manifest
from korch.plan.meta import PlanMeta
from korch.plan.plan import FORMAT, OLDER_FORMATS, Plan, check_save_target

RERUN = "re-run `korch optimize`"


def every_field() -> PlanMeta:
    """A PlanMeta with a value other than the default in every field (as JSON holds it)."""
    return PlanMeta(
        versions=current_versions(set()),
        device_name=device_name("cpu"),
        python="3.0.1",
        fission={"source": "onnx", "onnx_nodes": 3, "primitives": 7, "opaque_ops": ["Foo"]},
        rewrites=["Conv+Mul: mix folded"],
        candidates={"candidates": 9, "pruned": {"not convex": 2}, "seeds": 1},
        profiling={"profiled": 4, "cache_hits": 1, "failed": 0, "skipped": 0, "retimed": 0, "disturbed": 0},
        solver={"status": "optimal", "gap": 0.0, "seconds": 0.01},
        greedy_ms=1.5,
        greedy_kernels=3,
        ceilings={"bandwidth_gbs": 31.5, "gflops": 174.0},
        input_bounds={"x": [0, 4], "ends": [0, 8, "sorted"]},
        index_limits={"x": 4},
        alternatives=[[{"what": "split", "backend": "vendor", "ms": 0.2}]],
        search={"measured": 4, "bounded": 0, "certified_gap": 0.0},
        decided_by="solver",
        seconds=2.25,
        measured={"ms": 1.0, "min_ms": 0.9, "kernels_ms": [1.0], "disturbed": False},
        refine=[{"kernels": 1, "predicted_ms": 1.2, "measured_ms": 1.0, "min_ms": 0.9}],
        runoff={"min_ms": [0.9, 1.0], "medians_ms": [0.95, 1.05]},
        extra_ms_per_kernel={"onnxruntime": 0.01},
    )


def small_plan(meta: PlanMeta | None = None) -> Plan:
    x = TensorType((4,), "float32")
    return Plan([("x", x)], [("x", "y")], [], {"w": np.ones(3, "float32")}, meta=meta or PlanMeta())


def edit_plan_json(directory, edit) -> None:
    """Edit plan.json and seal the plan again, as a korch of that format would have written it."""
    doc = json.loads((directory / "plan.json").read_text())
    edit(doc)
    (directory / "plan.json").write_text(json.dumps(doc))
    write_manifest(directory)


def test_every_field_round_trips(tmp_path):
    meta = every_field()
    default = PlanMeta()
    for f in dataclasses.fields(PlanMeta):  # (so the round trip covers every field)
        assert getattr(meta, f.name) != getattr(default, f.name), f.name
    small_plan(meta).save(tmp_path / "plan")
    loaded = Plan.load(tmp_path / "plan").meta
    assert isinstance(loaded, PlanMeta) and loaded == meta
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert doc["format"] == FORMAT and doc["meta"] == meta.to_json()
    assert list(doc["meta"]) == [f.name for f in dataclasses.fields(PlanMeta)]


def test_a_plan_made_by_hand_round_trips_its_defaults(tmp_path):
    small_plan().save(tmp_path / "plan")
    assert Plan.load(tmp_path / "plan").meta == PlanMeta()


@pytest.mark.parametrize("old", OLDER_FORMATS)
@pytest.mark.parametrize("command", ["run", "verify", "explain", "bench"])
def test_a_plan_of_the_previous_format_is_refused_with_one_line(old, command, tmp_path, capsys):
    """The previous format: plan.json's "meta" an untyped dict (here what a hand-made plan had)."""
    small_plan().save(tmp_path / "plan")

    def previous(doc):
        doc["format"] = old
        doc["meta"] = {"python": "3.11.7"}

    edit_plan_json(tmp_path / "plan", previous)
    with pytest.raises(KorchError, match=f"older korch.*{RERUN}"):
        Plan.load(tmp_path / "plan")
    assert cli.main([command, str(tmp_path / "plan")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("korch: error: ") and f"format '{old}'" in err and RERUN in err
    assert "Traceback" not in err
    assert cli.main([command, str(tmp_path / "plan"), "--json"]) == 2  # with --json: the error object
    assert RERUN in json.loads(capsys.readouterr().out)["error"]


def test_saving_over_a_plan_of_the_previous_format_replaces_it(tmp_path):
    small_plan().save(tmp_path / "plan")
    edit_plan_json(tmp_path / "plan", lambda doc: doc.__setitem__("format", OLDER_FORMATS[-1]))
    assert check_save_target(tmp_path / "plan") == "plan"
    small_plan(PlanMeta(seconds=4.0)).save(tmp_path / "plan")
    assert Plan.load(tmp_path / "plan").meta.seconds == 4.0


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda m: m.pop("measured"), "lacks measured"),
        (lambda m: m.update(tag=1), "has unknown fields tag"),
        (lambda m: m.update(greedy_ms="fast"), "greedy_ms is not of type float | None"),
        (lambda m: m.update(index_limits={"x": 1.5}), "index_limits is not of type dict[str, int]"),
        (lambda m: m.update(rewrites=[3]), "rewrites is not of type list[str]"),
        (lambda m: m.update(seconds=True), "seconds is not of type float | None"),
        (lambda m: m.clear(), "lacks versions, device_name"),
    ],
)
def test_metadata_with_missing_unknown_or_mistyped_fields_is_refused(damage, why, tmp_path, capsys):
    small_plan(every_field()).save(tmp_path / "plan")
    edit_plan_json(tmp_path / "plan", lambda doc: damage(doc["meta"]))
    with pytest.raises(KorchError, match=f"plan metadata .*{RERUN}") as info:
        Plan.load(tmp_path / "plan")
    assert why in str(info.value) and "\n" not in str(info.value)
    assert cli.main(["run", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and RERUN in err


@pytest.mark.parametrize("meta", [None, [], "meta"])
def test_metadata_that_is_no_object_is_refused(meta, tmp_path):
    small_plan().save(tmp_path / "plan")
    edit_plan_json(tmp_path / "plan", lambda doc: doc.__setitem__("meta", meta))
    with pytest.raises(KorchError, match=f"plan metadata is .*not an object; {RERUN}"):
        Plan.load(tmp_path / "plan")
