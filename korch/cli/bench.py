"""Side-by-side timing of a plan and its peers on the same inputs, interleaved (A B A B ...)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from korch.errors import KorchError, error_line
from korch.measure import placement
from korch.plan.plan import Plan
from korch.plan.runtime import interleave

NO_MODULE = (
    "torch peers need the PyTorch module: models built by `korch zoo` carry it; for other models "
    "pass module= to korch.cli.bench.bench"
)
TORCH_MODES = {  # peer name -> (torch.compile mode, freezing); mode None: eager PyTorch
    "eager": (None, False),
    "torch-compile": ("default", False),
    "torch-compile-freezing": ("default", True),
    "torch-compile-max-autotune": ("max-autotune", False),
    "torch-compile-max-autotune-freezing": ("max-autotune", True),
    "torch-compile-cudagraphs": ("reduce-overhead", False),  # CUDA graphs; CUDA only
    "torch-compile-cudagraphs-freezing": ("reduce-overhead", True),
}
PEERS = ("onnxruntime", "openvino", *TORCH_MODES)
# korch's own variants (`korch bench --ablation`): name -> what they change in optimize's options
ABLATION = {
    "korch-no-rewrite": {"rewrite": False},
    "korch-whole-graph": {"selection": "whole-graph", "time_budget": 0.0},
    "korch-greedy": {"selection": "greedy", "time_budget": 0.0},
    "korch-no-seeds": {"seeds": False},
}


def _onnxruntime_peer(plan: Plan, feeds: dict[str, np.ndarray]):
    import onnxruntime as ort

    if plan.model is None:
        raise KorchError("the plan carries no ONNX model to run in ONNX Runtime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = torch.get_num_threads()  # the same threads korch's kernels use
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    cuda = plan.device.startswith("cuda")
    try:
        sess = ort.InferenceSession(
            plan.model.SerializeToString(),
            opts,
            providers=["CUDAExecutionProvider"] if cuda else ["CPUExecutionProvider"],
        )
    except Exception as e:  # (a bfloat16 model on a CPU, which has no bfloat16 kernels)
        raise KorchError(f"peer onnxruntime cannot run this model: {error_line(e)}") from None
    return lambda: sess.run(None, feeds)


def zoo_module(plan: Plan):
    """The PyTorch module a zoo model was exported from (same seeded weights), or None."""
    from korch.cli import zoo

    props = {p.key: p.value for p in plan.model.metadata_props} if plan.model is not None else {}
    name = props.get("korch.zoo")
    if name not in zoo.MODELS or props.get("korch.zoo_version") != str(zoo.ZOO_VERSION):
        return None
    return zoo.make_module(name)


def torch_peer(name: str, module, inputs: list[torch.Tensor], device: str):
    """A call of the module as the peer runs it, and the peer's kernel launches per call (Inductor's
    generated code, counted as korch counts its own Inductor kernels; None for eager PyTorch).
    Compiles it (the first call). With freezing, the weights are constants of the compiled code:
    Inductor reads its `freezing` setting when it compiles (the first call), and the setting among
    the options makes this a compile of its own, not Dynamo's cached one of the same module."""
    from torch._inductor import config, list_mode_options
    from torch._inductor.codecache import PyCodeCache

    from korch.backends.inductor import count_launches

    mode, freezing = TORCH_MODES[name]
    if mode == "reduce-overhead" and not device.startswith("cuda"):
        raise KorchError(f"peer {name} needs --device cuda")
    module = module.to(device).eval()
    if mode is None:
        fn = module
    elif freezing:
        fn = torch.compile(module, options={**list_mode_options(mode), "freezing": True})
    else:
        fn = torch.compile(module, mode=mode)

    def call():
        with torch.inference_mode():
            return fn(*inputs)

    before = len(PyCodeCache.modules)
    with config.patch(freezing=freezing):
        call()
    wrappers = [m for m in PyCodeCache.modules[before:] if hasattr(m, "call")]
    launches = sum(count_launches(Path(m.__file__).read_text()) for m in wrappers)
    return call, launches or None


def _openvino_peer(plan: Plan, feeds: dict[str, np.ndarray]):
    """The source model in OpenVINO's CPU plugin: float32, the threads korch's kernels use."""
    try:
        import openvino as ov
    except ImportError:
        raise KorchError("peer openvino needs the openvino package: pip install openvino") from None
    if plan.model is None:
        raise KorchError("the plan carries no ONNX model to run in OpenVINO")
    if plan.device != "cpu":
        raise KorchError("peer openvino runs on the CPU only")
    config = {"INFERENCE_NUM_THREADS": torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32"}
    try:
        core = ov.Core()
        compiled = core.compile_model(core.read_model(plan.model.SerializeToString()), "CPU", config)
    except Exception as e:
        raise KorchError(f"peer openvino cannot run this model: {error_line(e)}") from None
    request = compiled.create_infer_request()
    names = [i.get_any_name() for i in compiled.inputs]

    def call():
        out = request.infer({n: feeds[n] for n in names})
        return [np.array(out[o]) for o in compiled.outputs]  # (copies: the request reuses its buffers)

    return call


def _flatten(out) -> list[np.ndarray]:
    if isinstance(out, torch.Tensor):
        return [out.detach().float().cpu().numpy()]
    if isinstance(out, np.ndarray):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    return [a for o in out for a in _flatten(o)]


def _agreement(want: list[np.ndarray], got) -> float:
    """Largest relative error of a peer's outputs against korch's (same inputs)."""
    from korch.measure.check import rel_err

    got = _flatten(got)
    if len(got) != len(want):
        raise KorchError(f"a peer returned {len(got)} outputs, the plan {len(want)}")
    return max((rel_err(g.reshape(w.shape), w) for g, w in zip(got, want)), default=0.0)


def _oracle(plan: Plan, feeds: dict[str, np.ndarray], systems: dict[str, Callable]):
    """The outputs every system is checked against, and whose they are: ONNX Runtime's on the
    source model where it runs it (as `korch verify` checks; the onnxruntime peer's, when it is
    one), else korch's own."""
    if "onnxruntime" in systems:
        return _flatten(systems["onnxruntime"]()), "onnxruntime"
    if plan.model is not None:
        import onnxruntime as ort

        try:
            sess = ort.InferenceSession(plan.model.SerializeToString(), providers=["CPUExecutionProvider"])
            return _flatten(sess.run(None, feeds)), "onnxruntime"
        except Exception:  # (a bfloat16 model on a CPU: no kernels for it there)
            pass
    return _flatten(systems["korch"]()), "korch"


def _systems(plan: Plan, peers, module, feeds, variants) -> tuple[dict[str, Callable], dict[str, dict]]:
    """Each system's call, and what is known of it before timing: setup seconds, launches."""
    systems, facts = {}, {}
    for name, p in {"korch": plan, **variants}.items():
        exe = p.executable()
        systems[name] = exe.caller(feeds)
        systems[name]()  # (on CUDA: captures its CUDA graph)
        facts[name] = {"launches": exe.launches}
        if exe.captured is not None:  # (on CUDA: a plan run kernel by kernel says so)
            facts[name]["cuda_graph"] = exe.captured
    ordered = []  # the torch peers' inputs, on the plan's device
    if any(p in TORCH_MODES for p in peers):
        tensors = plan.executable().feeds((), feeds)
        ordered = [tensors[n] for n, _ in plan.inputs]
    for peer in peers:
        start = time.perf_counter()
        launches = None
        if peer in ("onnxruntime", "openvino"):
            make = _onnxruntime_peer if peer == "onnxruntime" else _openvino_peer
            systems[peer] = make(plan, feeds)
            # each ONNX operator of the model one launch, as korch counts its own kernels of these
            # runtimes (korch.pipeline.original_model_seed: the source model run whole)
            launches = len(plan.model.graph.node)
        else:
            systems[peer], launches = torch_peer(peer, module, ordered, plan.device)
        systems[peer]()
        facts[peer] = {"setup_s": round(time.perf_counter() - start, 3)}
        if launches is not None:
            facts[peer]["launches"] = launches
    return systems, facts


def check_peers(peers) -> None:
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise KorchError(f"unknown peers {unknown}; available: {', '.join(PEERS)}")


def ablation_plans(model, options, shapes=None, values=None, say=print) -> dict[str, Plan]:
    """korch's variants of one model (ABLATION), each optimized with `options` changed as the
    variant says. They share options' profile database: the whole-graph and greedy variants
    profile only what their plan needs beyond it (a budget of 0 s: the whole graph in every
    backend, every primitive alone), the others what their own graph or search needs."""
    from korch.pipeline import optimize

    plans = {}
    for name, change in ABLATION.items():
        say(f"ablation: {name}")
        plans[name] = optimize(model, shapes=shapes, values=values, options=replace(options, **change))
    return plans


def bench(
    plan: Plan,
    peers=("onnxruntime",),
    rounds: int = 10,
    seed: int = 0,
    warmup: int = 3,
    block_s: float = 0.05,
    module=None,
    round_pause_s: float = 1.0,
    variants: dict[str, Plan] | None = None,
) -> dict:
    """Median, min and max milliseconds per system (korch, its `variants`, the peers), interleaved;
    each system's largest relative error against ONNX Runtime on the source model (korch's
    outputs where that cannot run); kernel launches per call where known; and korch's speedup over
    the fastest peer. `module`: the PyTorch source, for torch peers (found automatically for zoo
    models; without it they are skipped, as the report's "skipped_peers" says). Rounds are
    `round_pause_s` apart, so the bench spans longer than a short burst in which a shared
    machine's neighbour takes a core; each system's median per round is reported too, for slow
    episodes longer than that (BENCHMARKS.md's method: systems do not slow alike)."""
    check_peers(peers)
    variants = variants or {}
    if module is None and any(p in TORCH_MODES for p in peers):
        module = zoo_module(plan)
    skipped = [p for p in peers if p in TORCH_MODES] if module is None else []
    peers = [p for p in peers if p not in skipped]
    if skipped and not peers:
        raise KorchError(f"{', '.join(skipped)}: {NO_MODULE}, and no other peer is named")
    feeds = plan.random_inputs(seed)
    systems, facts = _systems(plan, peers, module, feeds, variants)
    want, against = _oracle(plan, feeds, systems)
    for name, fn in systems.items():
        facts[name]["max_rel_err"] = _agreement(want, fn())
        for _ in range(warmup):
            fn()
    # on a CPU, where the process's two CPUs sat before the first round and after each (near or far)
    trips, between = placement.recorder(plan.device)
    by_round = interleave(systems, rounds, block_s, plan.device, round_pause_s=round_pause_s, between=between)
    placed = between is not None and None not in trips  # (a round trip that failed: not known)
    far = placement.far_rounds(trips) if placed else None
    results = {name: {**_summary(rs, far), **facts[name]} for name, rs in by_round.items()}
    ablation = {name: results.pop(name) for name in variants}
    peer_best = min((results[p]["median_ms"] for p in peers), default=None)
    speedup = peer_best / results["korch"]["median_ms"] if peer_best else None
    report = {
        "device": plan.device,
        "threads": torch.get_num_threads(),
        "results": results,
        "speedup_vs_best_peer": speedup,
        "errors_against": against,
        # (none where in-place timings priced the plan: they are not a prediction the bench checks)
        "predicted_ms": plan.predicted_ms if plan.prediction_checked else None,
        "rounds": rounds,
    }
    if variants:
        report["ablation"] = ablation
    if skipped:
        report["skipped_peers"] = {p: NO_MODULE for p in skipped}
    if placed:
        report.update(round_trips_ns=[round(ns, 1) for ns in trips], far_rounds=far)
    return report


def _summary(rounds: list[list[float]], far: list[bool | None] | None) -> dict:
    """A system's median, min and max ms over every call, its median per round, and (where the
    rounds' placement is known) its median over the calls of the near rounds (None without one)."""
    calls = [ms for r in rounds for ms in r]
    summary = {
        "median_ms": statistics.median(calls),
        "min_ms": min(calls),
        "max_ms": max(calls),
        "round_medians_ms": [round(statistics.median(r), 6) for r in rounds],
    }
    if far is not None:
        summary["near_median_ms"] = placement.near_median(rounds, far)
    return summary
