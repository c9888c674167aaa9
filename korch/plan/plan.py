"""The executable plan: chosen kernels in order, buffer lifetimes, weights and provenance; saved
as a self-contained directory (written to a temporary name, then renamed) and loaded back."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from korch.config import LOAD_TRIES
from korch.errors import KorchError
from korch.ir.graph import Graph
from korch.ir.prims import TensorType, from_npy
from korch.ir.serialize import graph_to_json, load_graph_json
from korch.plan.check import MANIFEST, check_graph, check_plan, check_versions, write_manifest
from korch.plan.meta import RERUN, PlanMeta
from korch.plan.store import PlanFiles, PlanReplaced, exchange
from korch.profile.scratch import process_gone
from korch.search.kernel import SOURCE_MODEL_PREFIX, WHOLE_GRAPH_PREFIX, KernelSpec, kernel_graph_json

FORMAT = "korch.plan/2"  # /2: typed metadata (korch.plan.meta)
# refused with advice to optimize again ("korch.plan.plan/1": the untyped metadata of "korch.plan/1",
# under the name that the package's move to korch/plan/ wrote by mistake)
OLDER_FORMATS = ("korch.plan/1", "korch.plan.plan/1")
_FORMAT_PREFIXES = ("korch.plan/", "korch.plan.plan/")  # a directory save may replace
PLAN_FILES = ("plan.json", "weights.npz", "graph.json", "model.onnx", MANIFEST)  # all save writes

log = logging.getLogger("korch")


@dataclass(repr=False)
class PlanKernel:
    backend: str
    spec: KernelSpec  # spec.inputs / spec.outputs name values of the model graph
    cost_ms: float
    nodes: tuple[int, ...] = ()  # primitive indices in the model graph, for reports
    free_after: tuple[str, ...] = ()  # values no later kernel reads: released after this kernel

    def __repr__(self) -> str:
        # the spec's graph may hold the whole source model's bytes
        return (
            f"PlanKernel(backend={self.backend!r}, key={self.spec.key!r}, "
            f"primitives={len(self.nodes)}, cost_ms={self.cost_ms:.4g})"
        )


@dataclass(repr=False)
class Plan:
    inputs: list[tuple[str, TensorType]]
    outputs: list[tuple[str, str]]  # (value, output name)
    kernels: list[PlanKernel]
    weights: dict[str, np.ndarray]  # constants the kernels read, by value name
    device: str = "cpu"
    predicted_ms: float = 0.0
    meta: PlanMeta = field(default_factory=PlanMeta)
    model: object = field(default=None, repr=False)  # the pinned ONNX model, for `korch verify`
    graph: Graph | None = field(default=None, repr=False)  # the whole primitive graph, for reports
    _executable: object = field(default=None, repr=False)

    def __repr__(self) -> str:
        # a summary: the fields hold the weights, kernel graphs and the source model's bytes
        inputs = ", ".join(f"{name}: {t}" for name, t in self.inputs)
        outputs = ", ".join(name for _, name in self.outputs)
        return (
            f"Plan(device={self.device!r}, kernels={len(self.kernels)}, inputs=[{inputs}], "
            f"outputs=[{outputs}], predicted_ms={self.predicted_ms:.4g})"
        )

    @property
    def prediction_checked(self) -> bool:
        """Whether predicted_ms sums kernels timed alone, so that timing the plan checks it: not
        where refining priced the plan by its kernels' in-place timings (korch.plan.refine leaves
        PlanMeta.measured's "predicted_over_measured" empty then)."""
        measured = self.meta.measured
        return measured is None or measured.get("predicted_over_measured") is not None

    # -------------------------------------------------------------- execution
    def executable(self):
        if self._executable is None:
            from korch.plan.runtime import Executable

            self._executable = Executable(self)
        return self._executable

    def __call__(self, *inputs, **named):
        return self.executable()(*inputs, **named)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.executable().run_numpy(feeds)

    # ------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the plan atomically: a half-written directory is never loadable as a plan. Saving
        over a korch plan replaces it; nothing korch did not write is ever removed (see
        `check_save_target`). An empty directory is filled in place, so `save(".")` works."""
        given = Path(directory)
        state = check_save_target(given)  # refuse before writing anything
        target = Path(os.path.realpath(given))  # through a symlink: the link keeps pointing at it
        if state == "empty" or (state == "plan" and _is_cwd(target)):
            self._write_in_place(target, state)  # keeps the directory (a shell may be inside it)
            return given
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_temporaries(target)
        tmp = _fresh_sibling(target, "tmp")
        try:
            self._write_files(tmp)
            if check_save_target(given) == "plan":  # again: it may have changed meanwhile
                _swap(tmp, target)
            else:
                os.replace(tmp, target)  # fails if a non-empty directory appeared there
            tmp = None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)  # ours: made by _fresh_sibling
        return given

    def _write_in_place(self, target: Path, state: str) -> None:
        """Fill `target` itself; its manifest goes first and comes back last, so until the new plan
        is complete the directory is refused as a plan, never half-loaded."""
        if state == "plan":
            _remove_plan_files(target, keep_directory=True)
        try:
            self._write_files(target)
        except BaseException:
            _remove_plan_files(target, keep_directory=True)
            raise

    def _write_files(self, out: Path) -> None:
        """The plan's files (PLAN_FILES), the manifest last."""
        arrays = dict(self.weights)  # one copy of each large array, shared with the graph
        graph_doc = None
        if self.graph is not None:
            graph_doc, big = graph_to_json(self.graph)
            arrays.update((v, a) for v, a in big.items() if v not in arrays)
        keys = {name: f"w{i}" for i, name in enumerate(arrays)}
        np.savez(out / "weights.npz", **{keys[n]: a for n, a in arrays.items()})
        if graph_doc is not None:
            graph_doc["arrays"] = {v: keys[v] for v in big}
            (out / "graph.json").write_text(json.dumps(graph_doc))
        model_bytes = self.model.SerializeToString() if self.model is not None else b""
        digest = hashlib.sha256(model_bytes).hexdigest() if model_bytes else ""
        source = {digest: model_bytes} if model_bytes else {}  # what kernels refer to
        doc = {
            "format": FORMAT,
            "device": self.device,
            "predicted_ms": self.predicted_ms,
            "meta": self.meta.to_json(),
            "inputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in self.inputs],
            "outputs": [{"value": v, "name": n} for v, n in self.outputs],
            "weights": {name: keys[name] for name in self.weights},
            "kernels": [_kernel_to_json(k, source) for k in self.kernels],
        }
        if model_bytes:
            (out / "model.onnx").write_bytes(model_bytes)  # what onnx.save writes, serialized once
        (out / "plan.json").write_text(json.dumps(doc, indent=1))
        write_manifest(out, {"model.onnx": digest} if digest else None)  # last

    @staticmethod
    def load(directory: str | os.PathLike, allow_mismatch: bool = False) -> Plan:
        """Load a plan; damaged or inconsistent plans and plans built with other versions (korch,
        torch, onnxruntime, the kernels' backends, the device) are refused unless
        `allow_mismatch` (versions only). Every file is read once, checked against the manifest,
        and parsed from the bytes checked; a plan replaced meanwhile is read again, whole."""
        directory = Path(directory)
        for _ in range(LOAD_TRIES):
            try:
                with PlanFiles(directory) as files:
                    text = files.read("plan.json")
                    doc = _plan_doc(directory, text)  # (a directory that is no plan says so first)
                    data, digests = files.sealed({"plan.json": text})
                break
            except PlanReplaced:
                continue
        else:
            raise KorchError(f"{directory}: replaced again and again while it was read; load it again")
        return _plan_from(directory, doc, data, digests, allow_mismatch)

    # ------------------------------------------------------------- checking
    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs like `korch fission --check` uses (integer inputs inside gather ranges)."""
        from korch.measure import check

        return check.random_feeds(self.inputs, self.meta.input_bounds, seed)

    @property
    def oracle(self) -> str | None:
        """What verify() compares against: the source ONNX model in ONNX Runtime (a bfloat16
        model's float32 twin: ONNX Runtime has no bfloat16 kernels on a CPU), else the primitive
        graph in the numpy reference executor (plans made from PyTorch modules)."""
        from korch.measure import check

        if self.model is not None:
            return "ONNX Runtime (the float32 twin)" if check.has_bfloat16(self.model) else "ONNX Runtime"
        return "the reference executor" if self.graph is not None else None

    def verify(self, seed: int = 0) -> float:
        """Largest relative error of the plan against its oracle (see `oracle`)."""
        from korch.ir import reference
        from korch.measure import check

        if self.oracle is None:
            raise KorchError("this plan has no source model or primitive graph to verify against")
        feeds = self.random_inputs(seed)
        if self.model is not None:
            want = check.onnxruntime_outputs(self.model, feeds)
        else:
            want = reference.run(self.graph, feeds)
        return check.compare_outputs(self.run(feeds), want)


def check_save_target(directory: str | os.PathLike) -> str:
    """What `Plan.save` finds at `directory`: "absent", "empty", or "plan" (a korch plan holding
    only files korch wrote, which save replaces). Anything else is refused with a KorchError naming
    what is in the way: save never deletes what korch did not write."""
    path = Path(directory)
    if not path.exists():
        return "absent"
    if not path.is_dir():
        raise KorchError(f"{path} exists and is not a directory; not overwriting it")
    names = sorted(p.name for p in path.iterdir())
    if not names:
        return "empty"
    if not is_korch_plan(path):
        raise KorchError(
            f"{path} exists and is not a korch plan directory (it holds {_listing(names)}); "
            "not overwriting it"
        )
    foreign = [name for name in names if name not in _plan_files_of(path)]
    if foreign:
        raise KorchError(
            f"{path} holds files korch did not write ({_listing(foreign)}); move them or save "
            "elsewhere; not overwriting it"
        )
    return "plan"


def is_korch_plan(path: Path) -> bool:
    try:
        doc = json.loads((path / "plan.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("format", "")).startswith(_FORMAT_PREFIXES)


def _plan_files_of(path: Path) -> set[str]:
    """The regular files in `path` that save wrote: PLAN_FILES, and where the plan has its manifest,
    only those it lists (a model.onnx put into a plan made from a PyTorch module is not korch's)."""
    names = set(PLAN_FILES)
    try:
        listed = json.loads((path / MANIFEST).read_text())["files"]
        names &= {*listed, MANIFEST}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # interrupted while written in place: its files are still korch's
    return {n for n in names if (path / n).is_file() and not (path / n).is_symlink()}


def _listing(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _is_cwd(path: Path) -> bool:
    try:
        return Path.cwd().samefile(path)
    except OSError:
        return False


def _swap(tmp: Path, target: Path) -> None:
    """Put the plan written in `tmp` where the plan `target` is, then remove the old one's files.
    In one step where the system can: `target` then always names a whole plan, old or new."""
    if exchange(tmp, target):
        _remove_plan_files(tmp)  # the old plan, now under the temporary name
        return
    old = _fresh_sibling(target, "old")  # reserved: the rename replaces only this empty directory
    try:
        os.replace(target, old)
    except OSError:
        old.rmdir()
        raise
    try:
        os.replace(tmp, target)
    except OSError:
        os.replace(old, target)  # put the old plan back
        raise
    _remove_plan_files(old)


def _remove_plan_files(directory: Path, keep_directory: bool = False) -> None:
    """Delete the files save writes, then the directory if that empties it: whatever else is there
    (a file someone put in meanwhile) is kept, with the directory, and a warning."""
    for name in (MANIFEST, *PLAN_FILES):  # the manifest first: an incomplete plan is refused
        path = directory / name
        if not path.is_symlink() and path.is_file():
            path.unlink(missing_ok=True)
    if keep_directory:
        return
    try:
        directory.rmdir()
    except OSError:
        log.warning("warning: kept %s: it holds files korch did not write", directory)


def _fresh_sibling(directory: Path, kind: str) -> Path:
    """A new directory beside `directory` (named with this process's id, so a later save can tell
    it is dead). Not tempfile.mkdtemp: that makes it 0700 whatever the umask, the rename keeps that
    mode, and other users could not read a plan shared with them. mkdir applies the umask."""
    while True:
        tmp = directory.parent / f".{directory.name}.{kind}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:  # another save drew the same name
            continue


def _remove_dead_temporaries(directory: Path) -> None:
    """Half-written plans and old plans left by saves that were killed (their process is gone):
    only their korch files are removed, and the directory if that empties it."""
    pattern = re.compile(rf"\.{re.escape(directory.name)}\.(?:tmp|old)(\d+)-[0-9a-f]{{8}}")
    try:
        siblings = list(directory.parent.iterdir())
    except OSError:
        return
    for path in siblings:
        match = pattern.fullmatch(path.name)
        if match is None or path.is_symlink() or not path.is_dir():
            continue
        if process_gone(int(match[1])):
            _remove_plan_files(path)


def _plan_doc(directory: Path, text: bytes | None) -> dict:
    """plan.json's document, refused unless it is a korch plan's."""
    if text is None:
        raise KorchError(f"{directory}: not a plan directory (no plan.json)")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise KorchError(f"{directory}: unreadable plan ({e})") from None
    found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
    if found in OLDER_FORMATS:
        raise KorchError(f"{directory}: a plan of an older korch (format {found!r}, now {FORMAT!r}); {RERUN}")
    if found != FORMAT:
        raise KorchError(f"{directory}: not a korch plan (format {found!r})")
    return doc


def _plan_from(directory: Path, doc: dict, data: dict, digests: dict, allow_mismatch: bool) -> Plan:
    """The plan the checked files describe, refused where its parts disagree (plan_check.check_plan)."""
    model_bytes = data.get("model.onnx", b"")
    try:
        with np.load(io.BytesIO(data["weights.npz"])) as npz:  # each array read once, shared
            arrays = {key: from_npy(npz[key]) for key in npz.files}
        weights = {name: np.asarray(arrays[key]) for name, key in doc["weights"].items()}
        model = _load_model(model_bytes) if model_bytes else None
        blobs = {digests["model.onnx"]: model_bytes} if model_bytes else {}
        kernels = [_kernel_from_json(i, k, blobs) for i, k in enumerate(doc["kernels"])]
        inputs = [(i["name"], TensorType(tuple(i["shape"]), i["dtype"])) for i in doc["inputs"]]
        outputs = [(o["value"], o["name"]) for o in doc["outputs"]]
        device, predicted_ms = str(doc["device"]), float(doc["predicted_ms"])
    except KorchError as e:
        raise KorchError(f"{directory}: corrupt plan ({e})") from None
    except Exception as e:
        raise KorchError(f"{directory}: corrupt plan ({type(e).__name__}: {e})") from None
    try:
        meta = PlanMeta.from_json(doc.get("meta"))
    except KorchError as e:
        raise KorchError(f"{directory}: {e}") from None
    plan = Plan(inputs, outputs, kernels, weights, device, predicted_ms, meta)
    check_versions(
        directory, meta.versions, meta.device_name, device, {k.backend for k in kernels}, allow_mismatch
    )
    plan.model = model
    _consistent(directory, check_plan, plan, model_bytes)  # before the graph: a kernel names it best
    if "graph.json" in data:
        plan.graph = _load_graph(directory / "graph.json", data["graph.json"], arrays)
        _consistent(directory, check_graph, plan, plan.graph)
    return plan


def _consistent(directory: Path, check, *args) -> None:
    try:
        check(*args)
    except KorchError as e:
        raise KorchError(f"{directory}: inconsistent plan: {e}") from None


def _load_model(data: bytes):
    from korch.frontend.onnx.importer import load_model

    return load_model(data, "model.onnx")


def _load_graph(path: Path, text: bytes, arrays) -> Graph:
    try:
        doc = json.loads(text)
        return load_graph_json(doc, {v: arrays[key] for v, key in doc.pop("arrays", {}).items()})
    except KorchError as e:
        raise KorchError(f"{path}: {e}") from None
    except Exception as e:
        raise KorchError(f"{path}: corrupt primitive graph ({type(e).__name__}: {e})") from None


def _kernel_to_json(k: PlanKernel, source: dict[str, bytes]) -> dict:
    """`source`: sha256 -> bytes of model.onnx; a kernel running the source model refers to it."""
    doc = kernel_graph_json(k.spec.graph, by_reference=source)
    return {
        "backend": k.backend,
        "key": k.spec.key,
        "graph": doc,
        "inputs": list(k.spec.inputs),
        "outputs": list(k.spec.outputs),
        "cost_ms": k.cost_ms,
        "nodes": list(k.nodes),
        "free_after": list(k.free_after),
    }


def _kernel_from_json(i: int, d: dict, blobs: dict[str, bytes]) -> PlanKernel:
    try:
        graph = load_graph_json(d["graph"], blobs=blobs)
        spec = KernelSpec(str(d["key"]), graph, _names(d, "inputs"), _names(d, "outputs"))
        nodes = tuple(int(n) for n in d["nodes"])
        return PlanKernel(str(d["backend"]), spec, float(d["cost_ms"]), nodes, _names(d, "free_after"))
    except KeyError as e:
        raise KorchError(f"kernel {i} has no {e.args[0]!r}") from None
    except KorchError as e:
        raise KorchError(f"kernel {i}: {e}") from None
    except Exception as e:
        raise KorchError(f"kernel {i}: {type(e).__name__}: {e}") from None


def _names(d: dict, key: str) -> tuple[str, ...]:
    names = d[key]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise KorchError(f"its {key} is not a list of value names")
    return tuple(names)


def lifetimes(kernels: list[PlanKernel], outputs: list[str]) -> None:
    """Set each kernel's free_after: the values it is the last reader (or writer) of."""
    keep = set(outputs)
    last: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for v in (*k.spec.inputs, *k.spec.outputs):
            last[v] = i
    for i, k in enumerate(kernels):
        k.free_after = tuple(
            sorted(v for v in {*k.spec.inputs, *k.spec.outputs} if last[v] == i and v not in keep)
        )


def build_plan(
    graph: Graph, solution, device: str, meta: PlanMeta | None = None, specs: dict | None = None
) -> Plan:
    from korch.search.kernel import kernel_spec

    kernels = [
        PlanKernel(
            choice.backend,
            (specs or {}).get(choice.candidate.key) or kernel_spec(graph, choice.candidate),
            choice.cost_ms,
            choice.candidate.nodes,
        )
        for choice in solution.chosen
    ]
    lifetimes(kernels, list(graph.outputs))
    weights = {
        v: np.asarray(graph.constants[v]) for k in kernels for v in k.spec.inputs if v in graph.constants
    }
    for v in graph.outputs:  # outputs that are plain constants
        if v in graph.constants:
            weights[v] = np.asarray(graph.constants[v])
    return Plan(
        inputs=[(v, graph.types[v]) for v in graph.inputs],
        outputs=list(zip(graph.outputs, graph.output_names)),
        kernels=kernels,
        weights=weights,
        device=device,
        predicted_ms=sum(k.cost_ms for k in kernels),
        meta=dataclasses.replace(meta) if meta is not None else PlanMeta(),  # each plan its own
        graph=graph,
    )


def decided_by(plan: Plan) -> str:
    """What the chosen plan is: the source model run whole, one kernel of the whole primitive
    graph, or the solver's selection."""
    if is_source_model(plan):
        return "source-model"
    if len(plan.kernels) == 1 and plan.kernels[0].spec.key.startswith(WHOLE_GRAPH_PREFIX):
        return "whole-graph"
    return "solver"


def is_source_model(plan: Plan) -> bool:
    return len(plan.kernels) == 1 and plan.kernels[0].spec.key.startswith(SOURCE_MODEL_PREFIX)
