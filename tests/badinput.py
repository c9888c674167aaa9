"""The bad-input corpus: broken ONNX files, broken plan directories and bad flags, as CLI cases."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from korch.cli import commands as cli

F = TensorProto.FLOAT
MODEL_COMMANDS = ("fission", "candidates", "optimize", "bench")
PLAN_COMMANDS = ("run", "verify", "bench")
SEALED_DAMAGE = ("tampered-weights", "no-manifest", "no-model")  # only the manifest can tell


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    argv: tuple[str, ...]
    match: str | None = None  # a substring the error line must contain

    @property
    def id(self) -> str:
        return f"{self.category}-{self.name}"


def _model(nodes, inputs, outputs, inits=(), opset=17, ir_version=8, value_info=(), domains=()):
    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(inits), value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] if opset is not None else []
    opsets += [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    return model


def _vi(name, shape=(2, 4), elem=F):
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def _w(name="w", shape=(2, 4), dtype="float32"):
    return numpy_helper.from_array(np.ones(shape, dtype=dtype), name)


def good_model() -> onnx.ModelProto:
    """x -> Add(w) -> Relu -> Mul(w) -> y: small enough to optimize in a few seconds."""
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "w"], ["y"], name="mul"),
    ]
    return _model(nodes, [_vi("x")], [_vi("y")], [_w()])


def _one(op, ins, outs=("y",), inputs=None, outputs=None, inits=(), **kw):
    node = helper.make_node(op, list(ins), list(outs), name=op.lower(), domain=kw.pop("domain", ""))
    return _model([node], inputs or [_vi("x")], outputs or [_vi(o) for o in outs], inits, **kw)


def _structure_models() -> dict[str, onnx.ModelProto]:
    relu = helper.make_node
    return {
        "cycle": _model([relu("Add", ["x", "b"], ["a"]), relu("Relu", ["a"], ["b"])], [_vi("x")], [_vi("b")]),
        "missing-initializer": _one("Add", ["x", "w"]),
        "dangling-output": _one("Relu", ["x"], outputs=[_vi("y"), _vi("ghost")]),
        "untyped-input": _one("Relu", ["x"], inputs=[onnx.ValueInfoProto(name="x")]),
        "no-nodes-no-outputs": _model([], [_vi("x")], []),
        "duplicate-node-outputs": _model(
            [relu("Relu", ["x"], ["y"]), relu("Neg", ["x"], ["y"])], [_vi("x")], [_vi("y")]
        ),
        "duplicate-inputs": _one("Relu", ["x"], inputs=[_vi("x"), _vi("x")]),
        "duplicate-initializers": _one("Add", ["x", "w"], inits=[_w(), _w()]),
        "input-shadows-initializer-badly": _one(
            "Add", ["x", "x"], inputs=[_vi("x", (2, 4))], inits=[_w("x", (3,))]
        ),
        "missing-node-input-name": _one("Add", ["x", "nowhere"]),
        "control-flow": _model(
            [
                relu(
                    "If",
                    ["c"],
                    ["y"],
                    then_branch=helper.make_graph([], "t", [], [_vi("x")]),
                    else_branch=helper.make_graph([], "e", [], [_vi("x")]),
                )
            ],
            [_vi("c", (), TensorProto.BOOL), _vi("x")],
            [_vi("y")],
        ),
    }


def _dtype_models() -> dict[str, onnx.ModelProto]:
    bad_raw = numpy_helper.from_array(np.ones((2, 4), "float32"), "w")
    bad_raw.raw_data = bad_raw.raw_data[:5]
    return {
        "add-float-int64": _one("Add", ["x", "w"], inits=[_w(dtype="int64")]),
        "string-input": _one("Identity", ["x"], inputs=[_vi("x", elem=TensorProto.STRING)]),
        "undefined-elem-type": _one("Relu", ["x"], inputs=[_vi("x", elem=TensorProto.UNDEFINED)]),
        "complex-input": _one("Relu", ["x"], inputs=[_vi("x", elem=TensorProto.COMPLEX64)]),
        "initializer-raw-data-short": _one("Add", ["x", "w"], inits=[bad_raw]),
        "matmul-mismatched": _one("MatMul", ["x", "w"], inits=[_w(shape=(7, 3))]),
        "relu-on-int": _one("Relu", ["x"], inputs=[_vi("x", elem=TensorProto.BOOL)]),
    }


def _shape_models() -> dict[str, onnx.ModelProto]:
    huge = (100000, 100000, 100)
    expand_to = numpy_helper.from_array(np.array(huge, "int64"), "s")
    return {
        "huge-input": _one("Relu", ["x"], inputs=[_vi("x", huge)]),
        "huge-expand": _one("Expand", ["x", "s"], inputs=[_vi("x", (1,))], inits=[expand_to]),
        "huge-initializer-dims": _one("Add", ["x", "w"], inits=[_claims_huge()]),
        "symbolic-dim": _one("Relu", ["x"], inputs=[_vi("x", ("batch", 4))]),
        "unknown-rank": _one("Relu", ["x"], inputs=[_vi("x", None)]),
        "negative-dim": _one("Relu", ["x"], inputs=[_vi("x", (-3, 4))]),
        "reshape-impossible": _one(
            "Reshape", ["x", "s"], inits=[numpy_helper.from_array(np.array([3, 3], "int64"), "s")]
        ),
    }


def zero_size_model() -> onnx.ModelProto:
    """Not bad input: zero-size tensors are valid ONNX, and korch handles them."""
    return _one("Relu", ["x"], inputs=[_vi("x", (0, 4))])


def _claims_huge() -> TensorProto:
    """An initializer whose dims promise 10^10 elements and whose data holds 8."""
    t = numpy_helper.from_array(np.ones((2, 4), "float32"), "w")
    t.ClearField("dims")
    t.dims.extend([100000, 100000])
    return t


def _op_models() -> dict[str, onnx.ModelProto]:
    return {
        "unknown-op": _one("FrobnicateTensor", ["x"]),
        "unknown-domain": _one("Relu", ["x"], domain="com.acme"),
        "imported-unknown-domain": _one("Relu", ["x"], domain="com.acme", domains=["com.acme"]),
        "opset-too-new": _one("Relu", ["x"], opset=99),
        "opset-zero": _one("Relu", ["x"], opset=0),
        "op-newer-than-opset": _one("Gelu", ["x"], opset=9),  # (ONNX's Gelu is from opset 20)
        "no-default-opset": _one("Relu", ["x"], opset=None, domains=["com.acme"]),
        "ir-version-too-new": _one("Relu", ["x"], ir_version=99),
        "ir-version-zero": _one("Relu", ["x"], ir_version=0),
        "bad-attribute": _model([helper.make_node("Softmax", ["x"], ["y"], axis=9)], [_vi("x")], [_vi("y")]),
    }


def _byte_files(root: Path) -> dict[str, Path]:
    """Files that are not ONNX models at all, or are damaged ones."""
    blob = good_model().SerializeToString()
    rng = np.random.default_rng(0)
    files = {
        "empty": b"",
        "truncated-10": blob[: len(blob) // 10],
        "truncated-half": blob[: len(blob) // 2],
        "truncated-last-byte": blob[:-1],
        "random-bytes-small": rng.bytes(37),
        "random-bytes-large": rng.bytes(4096),
        "text": b"this is not an onnx model\n",
        "json": json.dumps({"graph": {"node": []}}).encode(),
        "png-header": b"\x89PNG\r\n\x1a\n" + rng.bytes(64),
        "zeros": bytes(1024),
    }
    out = {}
    for name, data in files.items():
        out[name] = root / f"{name}.onnx"
        out[name].write_bytes(data)
    npz = root / "weights-npz.onnx"
    np.savez(npz.with_suffix(""), a=np.ones(3))
    shutil.move(npz.with_suffix(".npz"), npz)
    out["npz-file"] = npz
    out["directory"] = root / "a-directory.onnx"
    out["directory"].mkdir()
    out["missing"] = root / "missing.onnx"
    return out


def _model_argv(command: str, path: Path, work: Path, extra=()) -> tuple[str, ...]:
    argv = [command, str(path), *extra]
    if command == "optimize":
        argv += ["-o", str(work / "plan"), "--backends", "onnxruntime", "--max-size", "2"]
    if command in ("optimize", "bench"):
        argv += ["--cache", str(work / "cache.sqlite")]
    return tuple(argv)


def model_cases(root: Path, work: Path) -> list[Case]:
    """Every broken model, for every command that reads a model."""
    root.mkdir(parents=True, exist_ok=True)
    paths: dict[tuple[str, str], Path] = {("bytes", n): p for n, p in _byte_files(root).items()}
    groups: dict[str, Callable[[], dict]] = {
        "structure": _structure_models,
        "dtype": _dtype_models,
        "shape": _shape_models,
        "op": _op_models,
    }
    for category, make in groups.items():
        for name, model in make().items():
            paths[(category, name)] = root / f"{category}-{name}.onnx"
            paths[(category, name)].write_bytes(model.SerializeToString())
    return [
        Case(category, f"{name}-{command}", _model_argv(command, path, work))
        for (category, name), path in paths.items()
        for command in MODEL_COMMANDS
    ]


def flag_cases(model: Path, plan: Path, work: Path) -> list[Case]:
    """Bad flags on a good model or plan."""
    m, p, o = str(model), str(plan), str(work / "flag-plan")
    opt = ("optimize", m, "-o", o, "--cache", str(work / "cache.sqlite"))
    cases = {
        "no-command": (),
        "unknown-command": ("frobnicate",),
        "unknown-flag": ("fission", m, "--frobnicate"),
        "optimize-without-output": ("optimize", m),
        "shape-no-equals": ("fission", m, "--shape", "x"),
        "shape-not-numbers": ("fission", m, "--shape", "x=ax4"),
        "shape-negative": ("fission", m, "--shape", "x=-2x4"),
        "shape-unknown-input": ("fission", m, "--shape", "nope=2x4"),
        "shape-wrong-rank": ("fission", m, "--shape", "x=2x4x1"),
        "shape-huge": ("fission", m, "--shape", "x=1000000x1000000"),
        "max-size-zero": ("candidates", m, "--max-size", "0"),
        "max-size-text": ("candidates", m, "--max-size", "big"),
        "optimize-max-size-negative": (*opt, "--max-size", "-1"),
        "time-budget-negative": (*opt, "--time-budget", "-5"),
        "time-budget-nan": (*opt, "--time-budget", "nan"),
        "jobs-zero": (*opt, "--jobs", "0"),
        "backends-unknown": (*opt, "--backends", "nope"),
        "backends-only-commas": (*opt, "--backends", ",,"),
        "device-tpu": (*opt, "--device", "tpu"),
        "output-is-a-file": ("optimize", m, "-o", m, "--cache", str(work / "cache.sqlite")),
        "cache-is-a-directory": ("optimize", m, "-o", o, "--cache", str(work)),
        "verify-tolerance-text": ("verify", p, "--tolerance", "tight"),
        "verify-tolerance-negative": ("verify", p, "--tolerance", "-1"),
        "bench-vs-unknown": ("bench", p, "--vs", "tensorflow"),
        "bench-rounds-zero": ("bench", p, "--rounds", "0"),
        "bench-time-budget-negative": ("bench", m, "--time-budget", "-1"),
        "bench-time-budget-nan": ("bench", m, "--time-budget", "nan"),
        "bench-plan-other-device": ("bench", p, "--device", "cuda"),
        "bench-plan-time-budget": ("bench", p, "--time-budget", "5"),
        "bench-plan-shape": ("bench", p, "--shape", "x=2x4"),
        "zoo-unknown-model": ("zoo", "nosuchmodel", "--dir", str(work / "zoo")),
        "run-output-in-missing-dir": ("run", p, "--output", str(work / "no" / "such" / "out.npz")),
        # an empty path (a shell variable left unset) was taken as "." or as no option at all
        "optimize-output-empty": ("optimize", m, "-o", "", "--cache", str(work / "cache.sqlite")),
        "optimize-cache-empty": (*opt, "--cache", ""),
        "run-inputs-empty": ("run", p, "--inputs", ""),
        "explain-html-empty": ("explain", p, "--html", ""),
        "zoo-dir-empty": ("zoo", "candy", "--dir", ""),
    }
    return [Case("flags", name, argv) for name, argv in cases.items()]


def _inputs_files(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    x = np.ones((2, 4), "float32")
    arrays = {
        "wrong-name": {"z": x},
        "wrong-shape": {"x": np.ones((3, 4), "float32")},
        "wrong-dtype": {"x": x.astype("float64")},
        "extra-input": {"x": x, "extra": x},
        "no-arrays": {},
    }
    out = {}
    for name, feeds in arrays.items():
        out[name] = root / f"{name}.npz"
        np.savez(out[name], **feeds)
    np.savez(root / "good.npz", x=x)
    good = (root / "good.npz").read_bytes()
    for name, data in {
        "truncated": good[: len(good) // 2],
        "random-bytes": np.random.default_rng(1).bytes(300),
        "empty": b"",
    }.items():
        out[name] = root / f"{name}.npz"
        out[name].write_bytes(data)
    out["npy-not-npz"] = root / "plain.npy"
    np.save(out["npy-not-npz"], x)
    out["object-array"] = root / "object.npz"
    np.savez(out["object-array"], x=np.array([{"a": 1}], dtype=object))
    out["missing"] = root / "missing.npz"
    return out


def inputs_cases(plan: Path, root: Path) -> list[Case]:
    """`korch run --inputs` with every kind of bad .npz."""
    return [
        Case("inputs", name, ("run", str(plan), "--inputs", str(path)))
        for name, path in _inputs_files(root).items()
    ]


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _plan_damage() -> dict[str, Callable[[Path], None]]:
    """Ways to damage a plan directory in place."""

    def rm(name):
        return lambda d: os.remove(d / name)

    def set_field(key, value):
        return lambda d: _edit_json(d / "plan.json", lambda doc: doc.__setitem__(key, value))

    def kernel_field(key, value):
        return lambda d: _edit_json(d / "plan.json", lambda doc: doc["kernels"][0].__setitem__(key, value))

    def versions(key, value):
        return lambda d: _edit_json(
            d / "plan.json", lambda doc: doc["meta"]["versions"].__setitem__(key, value)
        )

    return {
        "no-plan-json": rm("plan.json"),
        "no-weights": rm("weights.npz"),
        "no-model": rm("model.onnx"),
        "empty-plan-json": lambda d: (d / "plan.json").write_text(""),
        "truncated-plan-json": lambda d: _truncate(d / "plan.json"),
        "plan-json-a-list": lambda d: (d / "plan.json").write_text("[1, 2]"),
        "plan-json-binary": lambda d: (d / "plan.json").write_bytes(b"\xff\xfe\x00garbage"),
        "wrong-format": set_field("format", "korch.plan/999"),
        "no-format": lambda d: _edit_json(d / "plan.json", lambda doc: doc.pop("format")),
        "kernels-not-a-list": set_field("kernels", 7),
        "inputs-missing": lambda d: _edit_json(d / "plan.json", lambda doc: doc.pop("inputs")),
        "unknown-dtype": set_field("inputs", [{"name": "x", "shape": [2, 4], "dtype": "float7"}]),
        "unknown-backend": kernel_field("backend", "tensorflow"),
        "kernel-graph-garbage": kernel_field("graph", {"nodes": "nope"}),
        "weights-key-missing": set_field("weights", {"w": "w999"}),
        "truncated-weights": lambda d: _truncate(d / "weights.npz"),
        "random-weights": lambda d: (d / "weights.npz").write_bytes(np.random.default_rng(2).bytes(500)),
        "truncated-model": lambda d: _truncate(d / "model.onnx", 0.3),
        "truncated-graph": lambda d: _truncate(d / "graph.json") if (d / "graph.json").exists() else None,
        "tampered-weights": lambda d: _flip_byte(d / "weights.npz"),
        "no-manifest": rm("MANIFEST.json"),
        "korch-version-mismatch": versions("korch", "0.0.0-other"),
        "torch-version-mismatch": versions("torch", "1.0.0"),
        "backend-version-mismatch": versions("backend:onnxruntime", "stale"),
        "device-mismatch": lambda d: _edit_json(
            d / "plan.json", lambda doc: doc["meta"].__setitem__("device_name", "cpu:Another CPU")
        ),
        "cuda-plan-on-cpu": set_field("device", "cuda"),
        "plan-json-is-a-directory": lambda d: (os.remove(d / "plan.json"), (d / "plan.json").mkdir()),
    }


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def plan_cases(good_plan: Path, root: Path) -> list[Case]:
    """Damaged copies of a good plan directory, for every command that reads a plan: each damage
    as found (the manifest catches it) and resealed with a fresh manifest (as if edited by hand,
    so the deeper checks must catch it)."""
    from korch.plan.check import write_manifest

    root.mkdir(parents=True, exist_ok=True)
    dirs = {"missing-dir": root / "missing", "empty-dir": root / "empty", "a-file": root / "file"}
    dirs["empty-dir"].mkdir()
    dirs["a-file"].write_text("not a directory")
    for name, damage in _plan_damage().items():
        for resealed in (False, True) if name not in SEALED_DAMAGE else (False,):
            target = root / (f"{name}-resealed" if resealed else name)
            shutil.copytree(good_plan, target)
            damage(target)
            if resealed and (target / "plan.json").is_file():
                write_manifest(target)
            dirs[target.name] = target
    return [
        Case("plan", f"{name}-{command}", (command, str(path)))
        for name, path in dirs.items()
        for command in PLAN_COMMANDS
    ]


def run_main(argv, capsys) -> tuple[int, str, str]:
    """korch.cli.commands.main in this process: (exit code, stdout, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def problem(case: Case, code, err: str) -> str | None:
    """None when `err` is one foreseen `korch: error:` line and the exit code 2 (and the error
    holds the case's match); otherwise what is wrong."""
    lines = [line for line in err.splitlines() if line.strip()]
    if code != 2 or len(lines) != 1:
        return f"{case.id}: exit {code}, stderr {err!r}"
    if not lines[0].startswith("korch: error: ") or "error: unexpected " in lines[0]:
        return f"{case.id}: {lines[0]!r}"  # an unforeseen exception type is a bug too
    if case.match and case.match not in lines[0]:
        return f"{case.id}: {lines[0]!r} lacks {case.match!r}"
    return None
