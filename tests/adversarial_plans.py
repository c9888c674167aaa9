"""Hostile models and tampered plans: tensors kept as external data in every form, and plan
directories edited by hand and resealed with a fresh manifest, as CLI cases."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from badinput import Case
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

import korch
from korch.pipeline import original_model_seed
from korch.plan.check import write_manifest
from korch.plan.plan import Plan, PlanKernel, lifetimes

F = TensorProto.FLOAT
SHAPE = (64, 80)  # 5120 elements: more than the 4096 that the ONNX checker's skeleton keeps inline
SECRET = ".ssh/id_rsa"  # where a home folder keeps a private key
SECRET_BYTES = np.random.default_rng(7).standard_normal(SHAPE).astype("float32").tobytes()
PLAN_COMMANDS = ("run", "verify")


def _vi(name, shape):
    return helper.make_tensor_value_info(name, F, list(shape))


def _array(seed: int, shape=SHAPE) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def chain_model() -> onnx.ModelProto:
    """x -> Add(w) -> Relu -> Mul(v) -> MatMul(W) -> y: one kernel per primitive at max_size 1."""
    inits = [
        numpy_helper.from_array(_array(1), "w"),
        numpy_helper.from_array(_array(2), "v"),
        numpy_helper.from_array(_array(3, (SHAPE[1], 3)), "W"),
    ]
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "v"], ["m"], name="mul"),
        helper.make_node("MatMul", ["m", "W"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(nodes, "chain", [_vi("x", SHAPE)], [_vi("y", (SHAPE[0], 3))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def chain_oracle(x: np.ndarray) -> np.ndarray:
    """chain_model in numpy: the independent oracle for a plan made from it."""
    return (np.maximum(x + _array(1), 0) * _array(2)) @ _array(3, (SHAPE[1], 3))


def add_model(constant: bool = False) -> onnx.ModelProto:
    """x + w, with w an initializer or (constant=True) a Constant node's value."""
    w = numpy_helper.from_array(_array(1), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], name="const", value=w))
    graph = helper.make_graph(nodes, "add", [_vi("x", SHAPE)], [_vi("y", SHAPE)], [] if constant else [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _tensor(model: onnx.ModelProto, name: str) -> TensorProto:
    for t in model.graph.initializer:
        if t.name == name:
            return t
    for node in model.graph.node:
        for a in node.attribute:
            if a.HasField("t") and node.output[0] == name:
                return a.t
    raise KeyError(name)


def external(model: onnx.ModelProto, name: str, location: str, length: int | None = None):
    """A copy of `model` whose tensor `name` (an initializer or a Constant's value) keeps its bytes
    in the file `location`, as onnx.save_model(save_as_external_data=True) writes it."""
    out = copy.deepcopy(model)
    _make_external(_tensor(out, name), location, length)
    return out


def _make_external(t: TensorProto, location: str, length: int | None = None) -> TensorProto:
    set_external_data(t, location, offset=0, length=length)
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    return t


def hidden_external_models() -> dict[str, onnx.ModelProto]:
    """add_model with one more tensor kept at SECRET, where onnx's own loader does not look (a
    sparse initializer) or deep inside (a subgraph's initializer, a function's Constant)."""
    secret = _make_external(numpy_helper.from_array(_array(5), "hidden"), SECRET)
    sparse = copy.deepcopy(add_model())
    indices = numpy_helper.from_array(np.arange(SHAPE[0] * SHAPE[1], dtype="int64"), "hidden_indices")
    sparse.graph.sparse_initializer.append(helper.make_sparse_tensor(secret, indices, list(SHAPE)))
    branch = helper.make_graph(
        [helper.make_node("Identity", ["hidden"], ["b"])], "b", [], [_vi("b", SHAPE)], [secret]
    )
    nested = copy.deepcopy(add_model())
    flag = helper.make_tensor("flag", TensorProto.BOOL, [], [True])
    nested.graph.node.append(helper.make_node("Constant", [], ["c"], value=flag))
    nested.graph.node.append(helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch))
    function = copy.deepcopy(add_model())
    body = helper.make_node("Constant", [], ["k"], value=secret)
    function.functions.append(
        helper.make_function("local", "Hidden", [], ["k"], [body], [helper.make_opsetid("", 17)])
    )
    return {"sparse-initializer": sparse, "subgraph-initializer": nested, "function-constant": function}


def write_secret(home: Path) -> Path:
    """A home folder holding a 'private key' whose bytes are a valid weight for the models here."""
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / SECRET).write_bytes(SECRET_BYTES)
    return home


# ------------------------------------------------------------------ models given by path


def path_models(root: Path) -> dict[str, Path]:
    """A model file per way of keeping a tensor outside the model's folder (each refused), each in
    its own folder under root/models; root/secret/w.bin holds readable bytes of the right size."""
    secret = root / "secret"
    secret.mkdir(parents=True, exist_ok=True)
    (secret / "w.bin").write_bytes(SECRET_BYTES)
    layouts: dict[str, tuple[Callable[[Path], None], str, bool]] = {
        # name: (prepare the folder, location, in a Constant node)
        "dotdot": (_nothing, "../../secret/w.bin", False),
        "absolute": (_nothing, str(secret / "w.bin"), False),
        "symlink-file": (lambda d: (d / "w.bin").symlink_to(secret / "w.bin"), "w.bin", False),
        "symlink-dir": (lambda d: (d / "data").symlink_to(secret), "data/w.bin", False),
        "home-relative": (_nothing, SECRET, False),  # read from the current folder as bytes
        "missing-file": (_nothing, "nowhere.bin", False),
        "a-directory": (lambda d: (d / "data").mkdir(), "data", False),
        "empty-location": (_nothing, "", False),
        "constant-dotdot": (_nothing, "../../secret/w.bin", True),
        "constant-absolute": (_nothing, str(secret / "w.bin"), True),
    }
    out = {}
    for name, (prepare, location, constant) in layouts.items():
        folder = root / "models" / name
        folder.mkdir(parents=True)
        prepare(folder)
        out[name] = folder / "model.onnx"
        onnx.save(external(add_model(constant), "w", location), out[name])
    out["beyond-the-end"] = _inside_model(root / "models" / "beyond-the-end", length=len(SECRET_BYTES) * 4)
    return out


def _nothing(folder: Path) -> None:
    return None


def _inside_model(folder: Path, length: int | None = None) -> Path:
    """chain_model with w in data/w.bin inside its own folder: allowed (when `length` fits)."""
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "w.bin").write_bytes(_array(1).tobytes())
    onnx.save(external(chain_model(), "w", "data/w.bin", length), folder / "model.onnx")
    return folder / "model.onnx"


def inside_model(folder: Path) -> Path:
    return _inside_model(folder)


def path_model_cases(root: Path, work: Path) -> list[Case]:
    cases = []
    for name, path in path_models(root).items():
        for command in ("fission", "candidates", "optimize"):
            argv = [command, str(path)]
            if command == "optimize":
                argv += ["-o", str(work / f"plan-{name}"), "--cache", str(work / "cache.sqlite")]
                argv += ["--backends", "onnxruntime", "--max-size", "2"]
            cases.append(Case("external-path", f"{name}-{command}", tuple(argv), match="'w'"))
    return cases


# ------------------------------------------------------------------------- the plans


def chain_plan(root: Path) -> Path:
    """A real optimized plan of chain_model, one kernel per primitive (ordered, with lifetimes)."""
    onnx.save(chain_model(), root / "chain.onnx")
    plan = korch.optimize(
        root / "chain.onnx",
        backends="onnxruntime",
        max_size=1,
        seeds=False,
        measure=False,
        min_time=0.002,
        cache=root / "cache.sqlite",
        progress=False,
    )
    return plan.save(root / "chain-plan")


def source_plan(root: Path) -> Path:
    """A plan whose one kernel runs the source model (model.onnx) whole in ONNX Runtime, as
    optimize makes when that is fastest; assembled here, so it holds that kernel for certain."""
    onnx.save(add_model(), root / "add.onnx")
    result = korch.fission(root / "add.onnx")
    _, spec = original_model_seed(result.graph, result.model)
    graph = result.graph
    kernels = [PlanKernel("onnxruntime", spec, 0.01)]
    lifetimes(kernels, list(graph.outputs))
    inputs = [(v, graph.types[v]) for v in graph.inputs]
    plan = Plan(inputs, list(zip(graph.outputs, graph.output_names)), kernels, {}, model=result.model)
    plan.graph = graph
    return plan.save(root / "source-plan")


def _doc(d: Path) -> dict:
    return json.loads((d / "plan.json").read_text())


def _put(d: Path, doc: dict) -> None:
    (d / "plan.json").write_text(json.dumps(doc))


def _edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        doc = _doc(d)
        edit(doc)
        _put(d, doc)

    return apply


def _replace_model(d: Path, model: onnx.ModelProto) -> None:
    """model.onnx replaced, and the kernels that run it pointed at the new bytes."""
    old = hashlib.sha256((d / "model.onnx").read_bytes()).hexdigest()
    blob = model.SerializeToString()
    (d / "model.onnx").write_bytes(blob)
    text = (d / "plan.json").read_text().replace(old, hashlib.sha256(blob).hexdigest())
    (d / "plan.json").write_text(text)


def _hostile_model(location: str, constant: bool = False) -> Callable[[Path], None]:
    return lambda d: _replace_model(d, external(add_model(constant), "w", location))


def _opaque_kernel(location: str) -> Callable[[Path], None]:
    """chain plan's kernel 1 (Relu) made an opaque kernel whose one-node model adds a weight kept
    at `location`."""
    t = {"shape": list(SHAPE), "dtype": "float32"}

    def edit(doc):
        w = numpy_helper.from_array(_array(4), "w")
        add = helper.make_node("Add", ["x", "w"], ["y"])
        inner = helper.make_graph([add], "k", [_vi("x", SHAPE)], [_vi("y", SHAPE)], [w])
        model = helper.make_model(inner, opset_imports=[helper.make_opsetid("", 17)])
        blob = external(model, "w", location).SerializeToString()
        graph = doc["kernels"][1]["graph"]
        graph["constants"] = []
        graph["inputs"] = [{"name": "in0", **t}]
        graph["outputs"] = [{"value": "t0_0", "name": "out0"}]
        attrs = {
            "model": {"base64": base64.b64encode(blob).decode()},
            "op_type": "Add",
            "in_types": [[list(SHAPE), "float32"]],
            "out_types": [[list(SHAPE), "float32"]],
        }
        node = {"prim": "opaque", "inputs": ["in0"], "outputs": [{"name": "t0_0", **t}], "attrs": attrs}
        graph["nodes"] = [node]
        doc["kernels"][1]["inputs"] = doc["kernels"][1]["inputs"][:1]

    return _edit(edit)


def hostile_plan_damage(home: Path) -> dict[str, tuple[str, Callable[[Path], None]]]:
    """name -> (which plan, damage): plans whose models keep tensors outside the plan."""
    return {
        "model-relative": ("source", _hostile_model(SECRET)),
        "model-absolute": ("source", _hostile_model(str(home / SECRET))),
        "model-dotdot": ("source", _hostile_model(f"../home/{SECRET}")),
        "model-constant": ("source", _hostile_model(SECRET, constant=True)),
        "opaque-kernel-relative": ("chain", _opaque_kernel(SECRET)),
        "opaque-kernel-absolute": ("chain", _opaque_kernel(str(home / SECRET))),
    }


def _kernel(i: int, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    return _edit(lambda doc: edit(doc["kernels"][i]))


def _swap_kernels(doc):
    doc["kernels"][0], doc["kernels"][1] = doc["kernels"][1], doc["kernels"][0]


def _weight(key_of: Callable[[dict], str], array: np.ndarray) -> Callable[[Path], None]:
    """The npz array behind one weight replaced by `array`."""

    def apply(d: Path) -> None:
        key = key_of(_doc(d))
        with np.load(d / "weights.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
        arrays[key] = array
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        (d / "weights.npz").write_bytes(buffer.getvalue())

    return apply


def _first_weight(doc: dict) -> str:
    return doc["weights"][doc["kernels"][0]["inputs"][1]]


def _graph_json(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        doc = json.loads((d / "graph.json").read_text())
        edit(doc)
        (d / "graph.json").write_text(json.dumps(doc))

    return apply


def _model_edit(edit: Callable[[onnx.ModelProto], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        model = onnx.load_from_string((d / "model.onnx").read_bytes())
        edit(model)
        _replace_model(d, model)

    return apply


def _set(key, value):
    return lambda obj: obj.__setitem__(key, value)


def _pop(key):
    return lambda obj: obj.pop(key)


def tampered_plan_damage() -> dict[str, Callable[[Path], None]]:
    """Edits of the chain plan (kernels in0 + c -> t4 -> t6 -> t7 -> t8 = y) that leave every file
    readable and, resealed, the manifest whole: only a check of the plan itself can refuse them."""
    kernel = _kernel
    return {
        "kernel-order-swapped": _edit(_swap_kernels),
        "value-used-before-produced": kernel(0, lambda k: k["inputs"].__setitem__(0, "t7")),
        "value-never-produced": kernel(2, lambda k: k["inputs"].__setitem__(0, "ghost")),
        "freed-too-early": kernel(0, lambda k: k["free_after"].append(k["outputs"][0])),
        "freed-before-a-later-reader": kernel(1, lambda k: k["free_after"].append(k["outputs"][0])),
        "output-freed": kernel(-1, lambda k: k["free_after"].append(k["outputs"][0])),
        "kernel-dropped": _edit(lambda doc: doc["kernels"].pop(1)),
        "kernel-duplicated": _edit(lambda doc: doc["kernels"].insert(1, doc["kernels"][0])),
        "no-kernels": _edit(_set("kernels", [])),
        "value-rewritten-as-another-type": kernel(3, lambda k: k["outputs"].__setitem__(0, "t4")),
        "kernel-writes-an-input": kernel(0, lambda k: k["outputs"].__setitem__(0, "x")),
        "weight-wrong-shape": _weight(_first_weight, np.ones((2, 4), "float32")),
        "weight-wrong-dtype": _weight(_first_weight, np.ones(SHAPE, "float64")),
        "weight-wrong-rank": _weight(_first_weight, np.ones(SHAPE[0] * SHAPE[1], "float32")),
        "weight-int": _weight(_first_weight, np.ones(SHAPE, "int32")),
        "weight-points-at-another": _edit(
            lambda doc: doc["weights"].__setitem__(
                doc["kernels"][0]["inputs"][1], doc["weights"][doc["kernels"][3]["inputs"][1]]
            )
        ),
        "weight-key-missing": _edit(lambda doc: doc["weights"].pop(doc["kernels"][0]["inputs"][1])),
        "input-wrong-shape": _edit(lambda doc: doc["inputs"][0].__setitem__("shape", [3, SHAPE[1]])),
        "input-wrong-dtype": _edit(lambda doc: doc["inputs"][0].__setitem__("dtype", "float64")),
        "input-renamed": _edit(lambda doc: doc["inputs"][0].__setitem__("name", "z")),
        "input-removed": _edit(_set("inputs", [])),
        "input-duplicated": _edit(lambda doc: doc["inputs"].append(doc["inputs"][0])),
        "output-value-renamed": _edit(lambda doc: doc["outputs"][0].__setitem__("value", "t9")),
        "output-renamed": _edit(lambda doc: doc["outputs"][0].__setitem__("name", "z")),
        "output-removed": _edit(_set("outputs", [])),
        "output-added": _edit(lambda doc: doc["outputs"].append({"value": "t4", "name": "extra"})),
        "kernel-missing-free-after": kernel(0, _pop("free_after")),
        "kernel-missing-inputs": kernel(0, _pop("inputs")),
        "kernel-missing-graph": kernel(0, _pop("graph")),
        "kernel-missing-backend": kernel(0, _pop("backend")),
        "kernel-missing-cost": kernel(0, _pop("cost_ms")),
        "kernel-cost-text": kernel(0, _set("cost_ms", "fast")),
        "kernel-inputs-a-string": kernel(1, _set("inputs", "t4")),
        "kernel-input-dropped": kernel(0, lambda k: k["inputs"].pop()),
        "kernel-output-added": kernel(0, lambda k: k["outputs"].append("t99")),
        "kernel-graph-input-shape": kernel(
            1, lambda k: k["graph"]["inputs"][0].__setitem__("shape", [SHAPE[0]])
        ),
        "kernel-graph-output-dtype": kernel(
            0,
            lambda k: (
                k["graph"]["nodes"][-1]["outputs"][0].__setitem__("dtype", "float64"),
                k["graph"]["inputs"][0].__setitem__("dtype", "float64"),
                k["graph"]["inputs"][1].__setitem__("dtype", "float64"),
            ),
        ),
        "free-after-a-number": kernel(0, _set("free_after", 3)),
        "weights-a-list": _edit(_set("weights", ["w0"])),
        "graph-output-renamed": _graph_json(lambda g: g["outputs"][0].__setitem__("name", "q")),
        "graph-input-shape": _graph_json(lambda g: g["inputs"][0].__setitem__("shape", [1, 1])),
        "model-output-renamed": _model_edit(lambda m: _rename_output(m, "y2")),
        "model-input-renamed": _model_edit(_rename_input),
        "weights-a-symlink-out": _link_out("weights.npz"),
    }


def _link_out(name: str) -> Callable[[Path], None]:
    """The plan's file moved out of it, a symbolic link left in its place (the manifest, resealed,
    hashes what the link points at)."""

    def apply(d: Path) -> None:
        outside = d.parent / f"{d.name}-{name}"
        (d / name).rename(outside)
        (d / name).symlink_to(outside)

    return apply


def _rename_output(model: onnx.ModelProto, name: str) -> None:
    old = model.graph.output[0].name
    model.graph.output[0].name = name
    for node in model.graph.node:
        node.output[:] = [name if o == old else o for o in node.output]


def _rename_input(model: onnx.ModelProto) -> None:
    model.graph.input[0].name = "z"
    for node in model.graph.node:
        node.input[:] = ["z" if i == "x" else i for i in node.input]


def twice_written(d: Path) -> None:
    """Not damage: kernel 0 run twice, both writing t4 (as two chosen multi-output kernels that
    share an output do), the input freed after the second."""
    doc = _doc(d)
    first = doc["kernels"][0]
    again = {**first, "free_after": list(first["free_after"])}
    first["free_after"] = []
    doc["kernels"].insert(1, again)
    _put(d, doc)


def damaged_copy(good: Path, target: Path, damage: Callable[[Path], None]) -> Path:
    """A copy of the plan `good`, damaged, then resealed as if edited by hand."""
    shutil.copytree(good, target)
    damage(target)
    write_manifest(target)
    return target


def plan_cases(plans: dict[str, Path], home: Path, root: Path) -> list[Case]:
    """Hostile and tampered copies of the good plans, for `korch run` and `korch verify`."""
    root.mkdir(parents=True, exist_ok=True)
    dirs = {}
    for name, (which, damage) in hostile_plan_damage(home).items():
        dirs[("external-plan", name)] = damaged_copy(plans[which], root / name, damage)
    for name, damage in tampered_plan_damage().items():
        dirs[("tampered", name)] = damaged_copy(plans["chain"], root / name, damage)
    return [
        Case(category, f"{name}-{command}", (command, str(path)))
        for (category, name), path in dirs.items()
        for command in PLAN_COMMANDS
    ]
