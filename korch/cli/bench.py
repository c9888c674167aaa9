"""Side-by-side timing of a plan and its peers on the same inputs, interleaved (A B A B ...)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from korch.errors import KorchError, error_line
from korch.plan.plan import Plan
from korch.plan.runtime import interleave

TORCH_MODES = {  # peer name -> torch.compile mode (None: eager PyTorch)
    "eager": None,
    "torch-compile": "default",
    "torch-compile-max-autotune": "max-autotune",
    "torch-compile-cudagraphs": "reduce-overhead",  # CUDA graphs; CUDA only
}
PEERS = ("onnxruntime", *TORCH_MODES)


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


def _torch_peer(name: str, module, inputs: list[torch.Tensor], device: str):
    mode = TORCH_MODES[name]
    if mode == "reduce-overhead" and not device.startswith("cuda"):
        raise KorchError("peer torch-compile-cudagraphs needs --device cuda")
    module = module.to(device).eval()
    fn = module if mode is None else torch.compile(module, mode=mode)

    def call():
        with torch.inference_mode():
            return fn(*inputs)

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


def _systems(plan: Plan, peers, module, feeds) -> tuple[dict[str, Callable], dict[str, float]]:
    exe = plan.executable()
    systems = {"korch": exe.caller(feeds)}
    ordered = []  # the torch peers' inputs, on the plan's device
    if any(p in TORCH_MODES for p in peers):
        if module is None:
            raise KorchError(
                "torch peers need the PyTorch module: models built by `korch zoo` carry it; for other "
                "models pass module= to korch.cli.bench.bench"
            )
        tensors = exe.feeds((), feeds)
        ordered = [tensors[n] for n, _ in plan.inputs]
    compile_s = {}
    for peer in peers:
        start = time.perf_counter()
        if peer == "onnxruntime":
            systems[peer] = _onnxruntime_peer(plan, feeds)
        else:
            systems[peer] = _torch_peer(peer, module, ordered, plan.device)
        systems[peer]()  # compiles, for torch.compile peers
        compile_s[peer] = time.perf_counter() - start
    return systems, compile_s


def check_peers(peers) -> None:
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise KorchError(f"unknown peers {unknown}; available: {', '.join(PEERS)}")


def bench(
    plan: Plan,
    peers=("onnxruntime",),
    rounds: int = 10,
    seed: int = 0,
    warmup: int = 3,
    block_s: float = 0.05,
    module=None,
    round_pause_s: float = 1.0,
) -> dict:
    """Median, min and max milliseconds per system, each peer's agreement with korch's outputs,
    and korch's speedup over the fastest peer. `module`: the PyTorch source, for torch peers
    (found automatically for zoo models). Rounds are `round_pause_s` apart, so the bench spans
    longer than the ~2 s bursts in which a shared machine's neighbour takes a core (a bench of
    ten back-to-back rounds fits inside one, and every median doubles)."""
    check_peers(peers)
    if module is None and any(p in TORCH_MODES for p in peers):
        module = zoo_module(plan)
    feeds = plan.random_inputs(seed)
    systems, compile_s = _systems(plan, peers, module, feeds)
    want = _flatten(systems["korch"]())
    agreement = {p: _agreement(want, systems[p]()) for p in peers}
    for fn in systems.values():
        for _ in range(warmup):
            fn()
    by_round = interleave(systems, rounds, block_s, plan.device, round_pause_s=round_pause_s)
    samples = {name: [ms for r in rs for ms in r] for name, rs in by_round.items()}
    results = {
        name: {"median_ms": statistics.median(s), "min_ms": min(s), "max_ms": max(s)}
        for name, s in samples.items()
    }
    for p in peers:
        results[p].update(max_rel_err=agreement[p], setup_s=round(compile_s[p], 3))
    peer_best = min((results[p]["median_ms"] for p in peers), default=None)
    speedup = peer_best / results["korch"]["median_ms"] if peer_best else None
    return {
        "device": plan.device,
        "threads": torch.get_num_threads(),
        "results": results,
        "speedup_vs_best_peer": speedup,
        "predicted_ms": plan.predicted_ms,
        "rounds": rounds,
    }
