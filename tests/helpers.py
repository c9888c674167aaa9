"""Test helpers: one-node ONNX models checked in ONNX Runtime against the reference executor."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

import korch
from korch.frontend.onnx.tensor_types import to_onnx_dtype
from korch.ir import reference
from korch.measure import check

ROOT = Path(__file__).resolve().parents[1]  # the repository


def load_script(path: str):
    """A script of the repository that is no package module (e.g. "docs/make_operators.py"), loaded
    afresh by its path under ROOT."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Const:
    """A node input given as an initializer (so fission may treat it as a compile-time constant)."""

    value: np.ndarray


def rand(*shape, dtype="float32", seed=0, low=None, high=None):
    rng = np.random.default_rng(seed + 7 * len(shape) + sum(shape))
    if dtype.startswith("int"):
        return rng.integers(low or 0, high or 5, shape).astype(dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    x = rng.standard_normal(shape)
    if low is not None:
        x = rng.uniform(low, high, shape)
    return x.astype(dtype)


def linear_attention_case(rule, heads, kv_heads, past, key_heads=None, per_head_decay=False, steps=5):
    """A LinearAttention node's inputs (`steps` steps, d_k 4, d_v 3, a batch of 2) and attributes:
    the key with kv_heads (or key_heads) heads, a past state when `past`, decays per key dimension
    (or per head) for the gated rules, betas per head for the delta rules."""
    rng = np.random.default_rng(0)
    b, t, dk, dv = 2, steps, 4, 3
    inputs = [
        rand(b, t, heads * dk),
        rand(b, t, (key_heads or kv_heads) * dk, seed=1) * 0.5,
        rand(b, t, kv_heads * dv, seed=2),
        rand(b, kv_heads, dk, dv, seed=3) if past else None,
    ]
    decay = -rng.uniform(0.05, 1, (b, t, kv_heads * (1 if per_head_decay else dk))).astype("float32")
    inputs.append(decay if "gated" in rule else None)
    inputs.append(rng.uniform(0, 1, (b, t, kv_heads)).astype("float32") if "delta" in rule else None)
    return inputs, {"update_rule": rule, "q_num_heads": heads, "kv_num_heads": kv_heads}


def one_node_model(op_type, inputs, attrs=None, opset=17, n_outputs=1, out_dtypes=None, domain=""):
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(value, Const):
            inits.append(numpy_helper.from_array(np.asarray(value.value), name))
        else:
            value = np.asarray(value)
            graph_inputs.append(
                helper.make_tensor_value_info(name, to_onnx_dtype(str(value.dtype)), value.shape)
            )
            feeds[name] = value
    first = next(np.asarray(v.value if isinstance(v, Const) else v) for v in inputs if v is not None)
    out_dtypes = out_dtypes or [str(first.dtype)] * n_outputs
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node],
        "test",
        graph_inputs,
        [helper.make_tensor_value_info(o, to_onnx_dtype(d), None) for o, d in zip(outs, out_dtypes)],
        inits,
    )
    return onnx_model(graph, opset, [(domain, 1)] if domain else ()), feeds


def onnx_model(graph, opset=17, extra_opsets=()):
    """helper.make_model, stamped with an IR version every supported ONNX Runtime reads (onnx
    stamps its own newest, which an older onnxruntime refuses: onnx 1.23 with onnxruntime 1.30)."""
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)
    return model


def check_model(model, feeds, tol=1e-4, allow_opaque=False):
    """Fission the model, run it in the reference executor and in ONNX Runtime, compare outputs."""
    result = korch.fission(model)
    if not allow_opaque:
        assert not result.opaque, f"left opaque: {result.opaque}"
    want = check.onnxruntime_outputs(model, feeds)
    got = reference.run(result.graph, feeds)
    for name, w in want.items():
        assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
        assert got[name].dtype == w.dtype, (name, got[name].dtype, w.dtype)
        err = check.rel_err(got[name], w)
        assert err <= tol, f"{name}: relative error {err:.3g}"
    return result


def check_op(op_type, inputs, attrs=None, opset=17, n_outputs=1, out_dtypes=None, tol=1e-4):
    model, feeds = one_node_model(op_type, inputs, attrs, opset, n_outputs, out_dtypes)
    return check_model(model, feeds, tol)


def check_contrib_op(op_type, inputs, attrs=None, n_outputs=1, out_dtypes=None, tol=1e-4, outputs=None):
    """One ONNX Runtime (com.microsoft) node checked against ONNX Runtime; `outputs`: which of its
    n_outputs the model names (False: left out)."""
    model, feeds = one_node_model(op_type, inputs, attrs, 17, n_outputs, out_dtypes, domain="com.microsoft")
    if outputs is not None:
        node, graph = model.graph.node[0], model.graph
        kept = [o for o, want in zip(graph.output, outputs) if want]
        del node.output[:], graph.output[:]
        node.output.extend(f"out{i}" if want else "" for i, want in enumerate(outputs))
        graph.output.extend(kept)
    return check_model(model, feeds, tol)


@contextlib.contextmanager
def neighbours():
    """Other processes that keep every core busy (pure-Python loops) until the block ends."""
    spin = "import sys; sys.stdout.write('x'); sys.stdout.flush()\nwhile True: pass"
    procs = [
        subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
        for _ in range(min(os.cpu_count() or 1, 4))
    ]
    try:
        for proc in procs:
            proc.stdout.read(1)  # it runs
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def spin(seconds: float) -> None:
    """Keep this thread busy (not asleep) for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def inductor_compile_threads(job: dict) -> dict:
    """(A korch.profile.workers job.) The threads this process runs kernels and Inductor compiles with."""
    import torch
    from torch._inductor.async_compile import get_compile_threads

    return {"status": "ok", "compile": get_compile_threads(), "kernels": torch.get_num_threads()}


def exit_marker(job: dict) -> dict:
    """(A korch.profile.workers job.) Registers an exit handler that writes job["path"]: it runs only
    if the worker goes through the interpreter's teardown."""
    import atexit
    import pathlib

    atexit.register(pathlib.Path(job["path"]).write_text, "torn down")
    return {"status": "ok"}


def relu_model(path, opset: int = 17):
    """x -> Relu -> y over [2, 4] floats, saved at `path` (which is returned)."""
    import onnx

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, path)
    return path
