"""Hugging Face models as users get them for ONNX Runtime: exported by optimum (`optimum-cli export
onnx`), then optimized by korch and verified. The models are hf_sweep.py's tiny random-weight
configurations, saved and exported with optimum's own dummy inputs. Every symbolic dimension is
pinned (batch 1, 8 tokens, a past of 7; a file with a past decodes one token), and a merged decoder
(`decoder_model_merged.onnx`: one If on the input use_cache_branch) is optimized once per branch
with `values={"use_cache_branch": ...}`. With `--ort-optimize O2` (O1 to O3), the exports are
optimized by optimum's ORTOptimizer first (`optimum-cli onnxruntime optimize`: ONNX Runtime's
transformer fusions, its com.microsoft operators). Per ONNX file: primitives, opaque operators, the
primitive graph's error against ONNX Runtime, the plan's kernels and backends, `plan.verify()`,
seconds.

optimum-onnx needs transformers < 4.58, so it runs in an environment of its own that sees korch
and torch: `python -m venv --system-site-packages ENV && ENV/bin/pip install optimum-onnx`, then
`PYTHONPATH=. ENV/bin/python benchmarks/optimum_sweep.py [MODEL ...] --dir DIR`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import onnx

import korch

sys.path.insert(0, str(Path(__file__).parent))
from hf_sweep import _randomize_zeros, models  # noqa: E402  (the same tiny configurations)

TASKS = {
    "bert": "fill-mask",
    "gpt2": "text-generation-with-past",
    "llama": "text-generation-with-past",
    "qwen2": "text-generation-with-past",
    "phi3": "text-generation-with-past",
    "t5": "text2text-generation-with-past",
    "bart": "text2text-generation-with-past",
    "vit": "image-classification",
    "convnext": "image-classification",
}
DIMS = dict(
    batch_size=1,
    sequence_length=8,
    decoder_sequence_length=8,
    encoder_sequence_length=8,
    past_sequence_length=7,
    past_decoder_sequence_length=7,
    num_channels=3,
    height=32,
    width=32,
)


def shapes_of(model: onnx.ModelProto, decode: bool) -> dict[str, tuple[int, ...]]:
    """Every input's shape with its symbolic dimensions (optimum writes sums such as
    'past_sequence_length + sequence_length') evaluated; one new token where a past is read."""
    dims = dict(DIMS, sequence_length=1, decoder_sequence_length=1) if decode else DIMS
    shapes = {}
    for inp in model.graph.input:
        shape = []
        for d in inp.type.tensor_type.shape.dim:
            if not d.dim_param:
                shape.append(d.dim_value)
                continue
            expr = re.sub(r"[A-Za-z_]\w*", lambda m: str(dims[m.group()]), d.dim_param)
            shape.append(int(eval(expr, {"__builtins__": {}})))  # (sums of known sizes only)
        shapes[inp.name] = tuple(shape)
    return shapes


def check(path: Path, budget: float, cache: str, values: dict | None = None) -> str:
    model = onnx.load(path, load_external_data=False)
    names = {i.name for i in model.graph.input}
    decode = any("past" in n for n in names) and (values is None or values.get("use_cache_branch", True))
    shapes = {n: s for n, s in shapes_of(model, decode).items() if n not in (values or {})}
    fission = korch.fission(path, shapes=shapes, values=values)
    row = f"{len(fission.graph.nodes):6d} {len(fission.opaque):6d} {korch.check_fission(fission):9.1e}"
    plan = korch.optimize(path, shapes=shapes, values=values, time_budget=budget, cache=cache, progress=False)
    backends = ",".join(sorted({k.backend for k in plan.kernels}))
    return f"{row} {len(plan.kernels):7d} {backends:22s} {plan.verify():9.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", help=f"default: {' '.join(TASKS)}")
    parser.add_argument("--dir", required=True, help="where the saved models and exports go")
    parser.add_argument("--optimize", type=float, default=5.0, metavar="SECONDS", help="profiling budget")
    parser.add_argument("--cache", help="profile database (default: korch's)")
    parser.add_argument(
        "--ort-optimize", choices=["O1", "O2", "O3"], help="optimum's ORTOptimizer level, before korch"
    )
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    table = models(transformers)
    print(f"transformers {transformers.__version__}, korch {korch.__version__}")
    head = f"{'prims':>6s} {'opaque':>6s} {'rel err':>9s} {'kernels':>7s} {'backends':22s} {'verify':>9s}"
    print(f"{'file':42s} {head} {'s':>5s}")
    for name in args.models or TASKS:
        saved, exported = Path(args.dir) / "hf" / name, Path(args.dir) / "onnx" / name
        model = table[name][0]().eval()
        _randomize_zeros(model)
        model.save_pretrained(saved)
        cli = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(saved)]
        command = [*cli, "--task", TASKS[name], str(exported)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            print(f"{name:42s} optimum's export failed: {done.stderr.strip().splitlines()[-1][:100]}")
            continue
        if args.ort_optimize:
            optimized = exported.with_name(f"{name}-{args.ort_optimize}")
            cli = [*cli[:3], "onnxruntime", "optimize", "--onnx_model", str(exported), "-o", str(optimized)]
            done = subprocess.run([*cli, f"-{args.ort_optimize}"], capture_output=True, text=True)
            if done.returncode:
                print(f"{name:42s} ORTOptimizer failed: {done.stderr.strip().splitlines()[-1][:100]}")
                continue
            exported = optimized
        for path in sorted(exported.glob("*.onnx")):
            merged = "merged" in path.name
            for values in [{"use_cache_branch": False}, {"use_cache_branch": True}] if merged else [None]:
                label = f"{name}/{path.name}" + (f" cache={values['use_cache_branch']}" if merged else "")
                started = time.perf_counter()
                try:
                    line = check(path, args.optimize, args.cache, values)
                except korch.KorchError as e:
                    line = f"refused: {e}"
                print(f"{label:42s} {line} {time.perf_counter() - started:5.1f}", flush=True)


if __name__ == "__main__":
    main()
