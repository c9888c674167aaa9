"""A warm run: optimize a model once with a profiling budget, then again on the same profile
database with `--time-budget 0`, each as its own `korch optimize` process, and report both wall
times and what the warm run still profiled. The default model is a 2-layer transformer encoder
(BERT's post-norm layer, width 256, 4 heads, sequence 64), written to the output folder.

    python benchmarks/warm_run.py [MODEL.onnx] [--time-budget S] [--backends a,b] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_encoder(path: Path, layers: int = 2, dim: int = 256, heads: int = 4, seq: int = 64) -> Path:
    """The encoder as ONNX (opset 17, seeded weights) at `path`."""
    import torch

    from korch.cli.zoo.attention import _PostNormLayer

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(_PostNormLayer(dim, heads, 4 * dim) for _ in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x, None)
            return x

    torch.manual_seed(0)
    with torch.no_grad():
        torch.onnx.export(
            Encoder().eval(), (torch.randn(1, seq, dim),), str(path), dynamo=False, opset_version=17,
            input_names=["x"], output_names=["y"],
        )  # fmt: skip
    return path


def optimize(model: str, out: Path, cache: Path, budget: float, backends: str | None) -> dict:
    cmd = [sys.executable, "-m", "korch.cli.commands", "optimize", model, "-o", str(out)]
    cmd += ["--cache", str(cache), "--time-budget", str(budget), "--json", "--quiet"]
    cmd += ["--backends", backends] if backends else []
    start = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return {"wall_s": round(time.perf_counter() - start, 2), **json.loads(done.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="an ONNX file (default: the 2-layer encoder)")
    parser.add_argument("--time-budget", type=float, default=60.0, help="the cold run's budget")
    parser.add_argument("--backends", help="as optimize's --backends (default: optimize's)")
    parser.add_argument("--warm-runs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="keep the model, database and plans here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        model = args.model or str(write_encoder(folder / "encoder2.onnx"))
        cache = folder / "profiles.sqlite"
        runs = [optimize(model, folder / "cold", cache, args.time_budget, args.backends)]
        for i in range(args.warm_runs):
            runs.append(optimize(model, folder / f"warm{i}", cache, 0, args.backends))
    for name, run in zip(["cold", *(["warm"] * args.warm_runs)], runs):
        print(
            f"{name:5s} {run['wall_s']:6.1f} s  profiled {run['profiled']:4d}  cache hits "
            f"{run['cache_hits']:5d}  kernels {run['kernels']:3d}  measured {run['measured_ms']:.3f} ms  "
            f"optimize's own seconds {json.dumps(run['seconds'])}"
        )


if __name__ == "__main__":
    main()
