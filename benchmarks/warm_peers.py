"""Compile the zoo modules' torch.compile peers once, in a process of their own, so that Inductor's
on-disk caches (compiled FX graphs, Triton kernels) hold them when zoo_bench.py compiles the same
modules: run in the background beside the GPU tests and korch's first models (gpu_bench.sh), it
takes most of the peers' compile off each model's share of the run.

    python benchmarks/warm_peers.py MODEL ... [--device cuda] [--peers torch-compile,...]
"""

from __future__ import annotations

import argparse
import time

import torch

from korch.cli import zoo
from korch.cli.bench import TORCH_MODES, torch_peer


def warm(name: str, device: str, peers: list[str]) -> None:
    """The module and inputs as korch.cli.bench makes them (zoo weights, the model's input shapes)."""
    module = zoo.make_module(name).to(device).eval()
    inputs = [  # (the values do not matter to the compile, only shapes and types)
        torch.ones(shape, dtype=getattr(torch, dtype), device=device)
        for _, shape, dtype in zoo.MODELS[name].inputs
    ]
    for peer in peers:
        start = time.perf_counter()
        torch_peer(peer, module, inputs, device)  # (compiles it, as the bench will)
        print(f"{name} {peer}: compiled in {time.perf_counter() - start:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--peers", default="torch-compile,torch-compile-cudagraphs")
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if TORCH_MODES.get(p, (None,))[0]]
    for name in args.models:
        warm(name, args.device, peers)


if __name__ == "__main__":
    main()
