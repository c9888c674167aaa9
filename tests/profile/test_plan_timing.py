"""What the profile database keeps besides kernels, in a real SQLite file: plans' in-place
measurements and runoffs (korch.profile.plan_timing), kept once measured, measured again under
another version, device or graph, and when the row kept is damaged; the device's ceilings."""

import sqlite3

from helpers import onnx_model
from onnx import helper

from korch.frontend import import_onnx
from korch.profile.database import ProfileDB
from korch.profile.plan_timing import PlanTimings


def _graph(op="Relu"):
    x = helper.make_tensor_value_info("x", 1, [2, 3])
    y = helper.make_tensor_value_info("y", 1, [2, 3])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y])
    return import_onnx(onnx_model(graph)).graph


def _result(ms):
    return {"ms": ms, "min_ms": ms / 2, "kernels_ms": [ms], "disturbed": False}


def _measured(ms):
    """A measurement of `ms`, and the list of its calls."""
    calls = []

    def measure():
        calls.append(ms)
        return _result(ms)

    return measure, calls


def test_a_plan_measured_once_is_kept_under_its_graph_kernels_versions_and_device(tmp_path):
    db = ProfileDB(tmp_path / "p.sqlite")
    timings = PlanTimings(db, _graph(), {"korch": "1", "backend:inductor": "a"}, "cpu:x:2threads")
    key = timings.plan_key([("k1", "inductor"), ("k2", "onnxruntime")])
    assert key == timings.plan_key([("k2", "onnxruntime"), ("k1", "inductor")])  # (any order)
    measure, calls = _measured(3.0)
    assert timings.in_place(key, measure) == (_result(3.0), False)
    assert timings.in_place(key, measure) == (_result(3.0), True) and len(calls) == 1
    db.close()
    # a new process on the same file: still kept
    db = ProfileDB(tmp_path / "p.sqlite")
    timings = PlanTimings(db, _graph(), {"korch": "1", "backend:inductor": "a"}, "cpu:x:2threads")
    assert timings.in_place(key, _measured(9.0)[0])[1]
    # another backend version, thread count, graph, or set of kernels: measured anew
    for other in (
        PlanTimings(db, _graph(), {"korch": "1", "backend:inductor": "b"}, "cpu:x:2threads"),
        PlanTimings(db, _graph(), {"korch": "1", "backend:inductor": "a"}, "cpu:x:1threads"),
    ):
        assert other.in_place(key, _measured(9.0)[0]) == (_result(9.0), False)
    third = PlanTimings(db, _graph("Sigmoid"), {"korch": "1", "backend:inductor": "a"}, "cpu:x:2threads")
    assert third.plan_key([("k1", "inductor")]) != timings.plan_key([("k1", "inductor")])
    assert timings.plan_key([("k1", "inductor")]) != timings.plan_key([("k1", "vendor")])
    db.close()


def test_a_damaged_row_is_measured_again_and_replaced(tmp_path):
    path = tmp_path / "p.sqlite"
    db = ProfileDB(path)
    timings = PlanTimings(db, _graph(), {"korch": "1"}, "cpu")
    key = timings.plan_key([("k", "inductor")])
    timings.in_place(key, _measured(2.0)[0])
    for detail in ("{not json", '{"ms": 1.0}', "[1, 2]"):
        with sqlite3.connect(path) as raw:
            raw.execute("UPDATE plan_timings SET detail = ?", (detail,))
        assert timings.in_place(key, _measured(4.0)[0]) == (_result(4.0), False)
        assert timings.in_place(key, _measured(5.0)[0]) == (_result(4.0), True)
    db.close()


def test_a_runoff_is_kept_for_the_same_plans_in_the_same_order(tmp_path):
    db = ProfileDB(tmp_path / "p.sqlite")
    timings = PlanTimings(db, _graph(), {"korch": "1"}, "cpu")
    a, b = timings.plan_key([("a", "inductor")]), timings.plan_key([("b", "vendor")])
    report = {"min_ms": [1.0, 1.1], "medians_ms": [1.3, 1.2], "winner": 1}
    assert timings.runoff([a, b], lambda: report) == (report, False)
    assert timings.runoff([a, b], lambda: {}) == (report, True)
    assert timings.runoff([b, a], lambda: {**report, "winner": 0})[1] is False
    row = db.conn.execute("SELECT ms, min_ms FROM plan_timings WHERE key LIKE 'runoff:%' LIMIT 1").fetchone()
    assert row == (1.2, 1.1)  # the winner's median and minimum
    db.close()


def test_the_device_ceilings_kept_are_the_fastest_ever_measured(tmp_path):
    """The lower bounds' rate floors (korch.pipeline._ceilings): a slower measurement never lowers
    a kept ceiling, so a later run's bounds do not move with one run's noise."""
    db = ProfileDB(tmp_path / "p.sqlite")
    first = {"bandwidth_gbs": 20.0, "gflops": 100.0}
    assert db.raise_ceilings("cpu:x:2threads", "torch 1", first) == first
    slower = {"bandwidth_gbs": 18.0, "gflops": 110.0}
    assert db.raise_ceilings("cpu:x:2threads", "torch 1", slower) == {"bandwidth_gbs": 20.0, "gflops": 110.0}
    assert db.raise_ceilings("cpu:x:1threads", "torch 1", slower) == slower  # (another device)
    assert db.raise_ceilings("cpu:x:2threads", "torch 2", slower) == slower  # (another torch)
    db.close()
    db = ProfileDB(tmp_path / "p.sqlite")
    assert db.raise_ceilings("cpu:x:2threads", "torch 1", {"gflops": 1.0}) == {"gflops": 110.0}
    db.close()
