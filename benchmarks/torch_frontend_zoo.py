"""Per zoo model: primitives by kind through the PyTorch front end and through ONNX, and the error
of the PyTorch-path primitive graph (numpy reference executor) against eager PyTorch."""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import korch
from korch.cli import zoo
from korch.frontend.torch.importer import import_torch
from korch.ir import reference
from korch.measure import check

KINDS = ("elementwise", "broadcast", "reduce", "layout", "linear", "opaque")


def torch_path(name: str):
    module = zoo.make_module(name)
    started = time.perf_counter()
    result = import_torch(module, zoo.example_inputs(name), output_names=zoo.MODELS[name].outputs)
    seconds = time.perf_counter() - started
    feeds = check.random_inputs(result.graph, seed=0)
    got = reference.run(result.graph, feeds)
    with torch.no_grad():
        want = module(*(torch.from_numpy(feeds[v]) for v in result.graph.inputs))
    want = want if isinstance(want, (tuple, list)) else (want,)
    err = max(check.rel_err(got[n], w.numpy()) for n, w in zip(result.graph.output_names, want))
    return result, seconds, err


def row(label: str, result, seconds: float) -> str:
    k = result.graph.by_kind()
    counts = " ".join(f"{k[kind]:5d}" for kind in KINDS)
    return f"  {label:6s} {result.onnx_nodes:6d} {len(result.graph.nodes):6d} {counts} {seconds:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", default=list(zoo.MODELS))
    parser.add_argument("--dir", default=None, help="zoo ONNX directory (default: the zoo cache)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    header = " ".join(f"{k[:5]:>5s}" for k in KINDS)
    print(f"  {'path':6s} {'ops':>6s} {'prims':>6s} {header} {'import_s':>7s}")
    for name in args.models:
        print(name)
        try:
            result, seconds, err = torch_path(name)
            print(row("torch", result, seconds) + f"   max rel err vs eager {err:.2e}")
        except korch.KorchError as e:
            print(f"  torch  FAILED: {e}")
        started = time.perf_counter()
        onnx_result = korch.fission(zoo.build(name, args.dir))
        print(row("onnx", onnx_result, time.perf_counter() - started))


if __name__ == "__main__":
    main()
