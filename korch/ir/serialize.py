"""Saving and loading primitive graphs: structure as JSON, large constants in a sibling .npz."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from korch.errors import KorchError, cannot_create
from korch.ir.graph import Graph, Node, freeze_attr, verify
from korch.ir.prims import Prim, TensorType, from_npy

FORMAT = "korch.primgraph/1"
INLINE_LIMIT = 16  # constants up to this many elements are written into the JSON itself


BLOB_REF = "blob_sha256"  # a large bytes attribute (a whole source model) stored elsewhere


def _attr_to_json(value: Any, by_reference: Mapping[str, bytes]) -> Any:
    if isinstance(value, bytes):
        for digest, blob in by_reference.items():
            if value == blob:  # a comparison (identity first), not a hash of hundreds of MB
                return {BLOB_REF: digest}
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, tuple):
        return [_attr_to_json(v, by_reference) for v in value]
    return value


def _attr_from_json(value: Any, blobs: Mapping[str, bytes]) -> Any:
    if isinstance(value, dict) and set(value) == {"base64"}:
        return base64.b64decode(value["base64"])
    if isinstance(value, dict) and set(value) == {BLOB_REF}:
        if value[BLOB_REF] not in blobs:
            raise KorchError(
                f"an attribute refers to data that is not here (sha256 {value[BLOB_REF][:12]}...)"
            )
        return blobs[value[BLOB_REF]]
    if isinstance(value, list):
        return tuple(_attr_from_json(v, blobs) for v in value)
    return value


def graph_to_json(
    graph: Graph, by_reference: Mapping[str, bytes] = MappingProxyType({}), inline_limit: int = INLINE_LIMIT
) -> tuple[dict, dict[str, np.ndarray]]:
    """The JSON document and the arrays too large to inline. Bytes attributes equal to one of
    `by_reference`'s blobs (sha256 -> bytes: a whole source model) are written as that digest:
    the caller keeps the bytes and hands them back to load_graph_json."""
    big: dict[str, np.ndarray] = {}
    consts = []
    for name, array in graph.constants.items():
        entry = {"name": name, "shape": list(array.shape), "dtype": str(array.dtype)}
        if array.size <= inline_limit:
            entry["data"] = array.reshape(-1).tolist()
        else:
            big[name] = array
        consts.append(entry)
    doc = {
        "format": FORMAT,
        "name": graph.name,
        "inputs": [
            {"name": v, "shape": list(graph.types[v].shape), "dtype": graph.types[v].dtype}
            for v in graph.inputs
        ],
        "outputs": [{"value": v, "name": n} for v, n in zip(graph.outputs, graph.output_names)],
        "constants": consts,
        "nodes": [
            {
                "prim": node.prim.value,
                "inputs": list(node.inputs),
                "outputs": [
                    {"name": v, "shape": list(graph.types[v].shape), "dtype": graph.types[v].dtype}
                    for v in node.outputs
                ],
                "attrs": {k: _attr_to_json(v, by_reference) for k, v in node.attrs},
                "origin": node.origin,
            }
            for node in graph.nodes
        ],
    }
    return doc, big


def save_graph(graph: Graph, path: str | os.PathLike) -> list[Path]:
    """Write PATH (JSON) and, when needed, PATH with suffix .npz; each file appears atomically.
    A path that cannot be written is a KorchError saying why."""
    path = Path(path)
    check_graph_target(path)
    doc, big = graph_to_json(graph)
    written = []
    try:
        if big:
            npz = path.with_suffix(".npz")
            doc["arrays"] = npz.name
            atomic_write(npz, lambda f: np.savez(f, **big))
            written.append(npz)
        atomic_write(path, lambda f: f.write(json.dumps(doc, indent=1).encode()))
    except OSError as e:
        raise KorchError(f"cannot write {path} ({cannot_create(path.parent, e)})") from None
    written.insert(0, path)
    return written


def check_graph_target(path: Path) -> None:
    """Refuse a path save_graph could never write (before the work that makes the graph)."""
    if path.is_dir():
        raise KorchError(f"{path}: is a directory; name the .json file to write")
    if path.suffix == ".npz":  # (the JSON would replace its own constants)
        raise KorchError(f"{path}: the graph is written as JSON, its large constants beside it as .npz")


def new_file_mode() -> int:
    """The mode open() gives a new file under this process's umask (mkstemp's files are 0600
    whatever the umask, and a rename keeps that: others could not read what korch wrote)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path, write) -> None:
    """Call write(f) on a new file beside `path`, then rename it over `path`: a failure (or a
    crash) leaves whatever was there, and a file hard-linked there is replaced, not changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.chmod(tmp, new_file_mode())
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # (the data is on disk before the name points at it)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_graph(path: str | os.PathLike) -> Graph:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise KorchError("not a korch primitive graph")
        arrays = np.load(path.parent / doc["arrays"]) if "arrays" in doc else {}
        return load_graph_json(doc, arrays)
    except KorchError as e:
        raise KorchError(f"{path}: {e}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KorchError(f"{path}: cannot read primitive graph ({type(e).__name__}: {e})") from None


def load_graph_json(doc: dict, arrays=None, blobs: Mapping[str, bytes] | None = None) -> Graph:
    """A graph from its JSON document; constants not inlined come from `arrays` (name -> array),
    bytes attributes stored by reference from `blobs` (sha256 -> bytes)."""
    if doc.get("format") != FORMAT:
        raise KorchError(f"not a korch primitive graph (format {doc.get('format')!r})")
    arrays = arrays or {}
    types, constants = {}, {}
    for c in doc["constants"]:
        if "data" in c:
            array = np.array(c["data"], dtype=c["dtype"]).reshape(c["shape"])
        else:
            array = from_npy(np.asarray(arrays[c["name"]]))
        array.setflags(write=False)
        constants[c["name"]] = array
        types[c["name"]] = TensorType.of(array)
    for i in doc["inputs"]:
        types[i["name"]] = TensorType(tuple(i["shape"]), i["dtype"])
    nodes = []
    for nd in doc["nodes"]:
        for o in nd["outputs"]:
            types[o["name"]] = TensorType(tuple(o["shape"]), o["dtype"])
        attrs = tuple(
            sorted((k, freeze_attr(_attr_from_json(v, blobs or {}))) for k, v in nd["attrs"].items())
        )
        outputs = tuple(o["name"] for o in nd["outputs"])
        nodes.append(Node(Prim(nd["prim"]), tuple(nd["inputs"]), outputs, attrs, nd.get("origin", "")))
    graph = Graph(
        inputs=tuple(i["name"] for i in doc["inputs"]),
        outputs=tuple(o["value"] for o in doc["outputs"]),
        output_names=tuple(o["name"] for o in doc["outputs"]),
        types=MappingProxyType(types),
        constants=MappingProxyType(constants),
        nodes=tuple(nodes),
        name=doc.get("name", "main"),
    )
    verify(graph)
    return graph
