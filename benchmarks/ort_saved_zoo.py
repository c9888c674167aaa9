"""Zoo models as ONNX Runtime's optimizers save them, then optimized by korch and timed against
ONNX Runtime on the saved file. Two forms per model: `session` (a session's
`optimized_model_filepath` at ORT_ENABLE_EXTENDED, the highest level ONNX Runtime saves without
hardware-specific layouts: FusedConv, FusedGemm, FusedMatMul, Gelu, QuickGelu,
SkipLayerNormalization) and, for BERT and ViT, `transformers` (`onnxruntime.transformers.optimizer`,
what Hugging Face optimum's O1-O4 run: Attention, EmbedLayerNormalization, BiasGelu,
SkipLayerNormalization). korch lowers these operators (korch/frontend/onnx/rules_contrib*.py); before it
did, each stayed opaque, one ONNX Runtime kernel that nothing fused with.

Per file, as benchmarks/quantized_zoo.py: primitives, opaque operators, the primitive graph's error
against ONNX Runtime, the plan's kernels and backends, `plan.verify()`, medians of korch and ONNX
Runtime (interleaved); then, in a run of their own, ONNX Runtime on the original file against the
saved one (interleaved; both at ORT_ENABLE_ALL). Usage:
`python benchmarks/ort_saved_zoo.py [MODEL ...] --dir DIR [--forms session,transformers]
[--time-budget S] [--cache DB]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from quantized_zoo import MEASURED, measure

import korch
from korch.cli.zoo import build
from korch.measure import check
from korch.plan.runtime import interleave

FORMS = ("session", "transformers")
TRANSFORMERS = {"bert-base": ("bert", 12, 768), "vit-b16": ("vit", 12, 768)}  # type, heads, width


def save(source: Path, form: str, out: Path, name: str) -> bool:
    """Write the form of `source` to `out`; False where the form does not apply to the model."""
    if form == "session":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(out)
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        return True
    if name not in TRANSFORMERS:
        return False
    from onnxruntime.transformers import optimizer

    model_type, heads, width = TRANSFORMERS[name]
    optimized = optimizer.optimize_model(
        str(source), model_type=model_type, num_heads=heads, hidden_size=width, opt_level=0
    )
    optimized.save_model_to_file(str(out))
    return True


def original_vs_saved(source: Path, saved: Path, rounds: int = 10) -> str:
    """Medians of ONNX Runtime on the original file and on the saved one, interleaved."""
    import onnxruntime as ort

    feeds = check.random_inputs(korch.fission(source).graph, 0)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = torch.get_num_threads()
    systems = {}
    for label, path in (("original", source), ("saved", saved)):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        systems[label] = lambda session=session: session.run(None, feeds)
        for _ in range(3):
            systems[label]()
    by_round = interleave(systems, rounds, 0.05, "cpu", round_pause_s=1.0)
    medians = {k: statistics.median(ms for r in rs for ms in r) for k, rs in by_round.items()}
    return f"{medians['original']:9.3f} {medians['saved']:9.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "models", nargs="*", default=["resnet50", "yolox-nano", "segformer-b0", "vit-b16", "bert-base"]
    )
    parser.add_argument("--dir", required=True, help="where the zoo models and their saved forms go")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of {', '.join(FORMS)}")
    parser.add_argument(
        "--time-budget", type=float, default=60.0, metavar="S", help="profiling budget per file"
    )
    parser.add_argument("--cache", help="profile database (default: korch's)")
    args = parser.parse_args()
    import onnxruntime

    print(f"onnxruntime {onnxruntime.__version__}, korch {korch.__version__}, budget {args.time_budget:g} s")
    print(f"{'file':32s} {MEASURED} {'s':>5s}  ort ms: original saved")
    directory = Path(args.dir)
    for name in args.models:
        source = build(name, directory)
        for form in args.forms.split(","):
            out = directory / f"{name}-ort-{form}.onnx"
            started = time.perf_counter()
            try:
                if not out.exists() and not save(source, form, out, name):
                    continue
                row = measure(out, args.time_budget, args.cache)
                row = f"{row} {time.perf_counter() - started:5.0f}  {original_vs_saved(source, out)}"
            except korch.KorchError as e:
                row = f"refused: {e}"
            print(f"{out.name:32s} {row}", flush=True)


if __name__ == "__main__":
    main()
