"""Zoo models quantized to 8 bits by ONNX Runtime's own tools, then optimized by korch and timed
against ONNX Runtime on the quantized file. Three forms per model: static QDQ (QuantizeLinear and
DequantizeLinear around float operators, which ONNX Runtime fuses into integer kernels),
static QOperator (QLinearConv and com.microsoft's QLinearAdd and the like; the latter stay opaque)
and dynamic (MatMulInteger and ConvInteger after DynamicQuantizeLinear). Static forms calibrate
on four of korch's seeded inputs (normal floats); weights are int8 per channel, activations uint8.

Per file: primitives, opaque operators, the primitive graph's error against ONNX Runtime, the
plan's kernels and backends, `plan.verify()`, and medians of korch and ONNX Runtime
(`korch.cli.bench.bench`, interleaved). With `--agreement`, instead: the largest relative error
between ONNX Runtime with its graph optimizations off and on, and of korch's primitive graph
against each, for three seeds (how far apart two correct answers lie). Usage:
`python benchmarks/quantized_zoo.py [MODEL ...] --dir DIR [--time-budget S] [--cache DB] [--agreement]`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import korch
from korch.cli.bench import bench
from korch.cli.zoo import build
from korch.measure import check

FORMS = ("qdq", "qoperator", "dynamic")


def quantize(source: Path, form: str, out: Path) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    graph = korch.fission(source).graph
    calibration = [check.random_inputs(graph, seed) for seed in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(calibration)

        def get_next(self):
            return next(self.feeds, None)

    prepared = out.with_name(source.stem + "-prepared.onnx")
    if not prepared.exists():
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    if form == "dynamic":
        quantize_dynamic(prepared, out, weight_type=QuantType.QInt8)
        return
    quantize_static(
        prepared,
        out,
        Reader(),
        quant_format=QuantFormat.QDQ if form == "qdq" else QuantFormat.QOperator,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )


# the columns of measure's row
MEASURED = (
    f"{'prims':>6s} {'opaque':>6s} {'rel err':>8s} {'kernels':>7s} {'backends':22s} {'verify':>8s} "
    f"{'korch ms':>9s} {'ort ms':>9s} {'ratio':>7s}"
)


def measure(path: Path, budget: float, cache: str | None, backends=None, **pins) -> str:
    """The row of one file; `pins`: shapes and values, as korch.fission takes them."""
    fission = korch.fission(path, **pins)
    opaque = len(fission.opaque)
    row = f"{len(fission.graph.nodes):6d} {opaque:6d} {korch.check_fission(fission):8.1e}"
    plan = korch.optimize(path, time_budget=budget, cache=cache, progress=False, backends=backends, **pins)
    used = ",".join(sorted({k.backend for k in plan.kernels}))
    timed = bench(plan, ("onnxruntime",))["results"]
    korch_ms, ort_ms = timed["korch"]["median_ms"], timed["onnxruntime"]["median_ms"]
    return (
        f"{row} {len(plan.kernels):7d} {used:22s} {plan.verify():8.1e} "
        f"{korch_ms:9.3f} {ort_ms:9.3f} {ort_ms / korch_ms:6.2f}x"
    )


def agreement(path: Path, seeds: int = 3) -> str:
    """How far apart correct answers lie: ONNX Runtime with its graph optimizations off (ONNX's
    semantics: no QDQ fusion) against on, and korch's primitive graph against each, per seed."""
    import onnxruntime as ort

    from korch.ir import reference

    fission = korch.fission(path)
    rows = []
    for seed in range(seeds):
        feeds = check.random_inputs(fission.graph, seed)
        runs = {}
        for label, level in (("on", "ORT_ENABLE_ALL"), ("off", "ORT_DISABLE_ALL")):
            opts = ort.SessionOptions()
            opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
            sess = ort.InferenceSession(
                fission.model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
            runs[label] = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        got = reference.run(fission.graph, feeds)
        errs = (check.compare_outputs(runs["off"], runs["on"]), check.compare_outputs(got, runs["on"]))
        rows.append("/".join(f"{e:.3g}" for e in (*errs, check.compare_outputs(got, runs["off"]))))
    return "  ".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "models", nargs="*", default=["resnet50", "yolox-nano", "segformer-b0", "efficientvit-b1"]
    )
    parser.add_argument("--dir", required=True, help="where the zoo models and their quantized forms go")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of {', '.join(FORMS)}")
    parser.add_argument(
        "--time-budget", type=float, default=60.0, metavar="S", help="profiling budget per file"
    )
    parser.add_argument("--cache", help="profile database (default: korch's)")
    parser.add_argument(
        "--agreement",
        action="store_true",
        help="instead of optimizing, per seed: ONNX Runtime unfused vs fused / korch vs fused / vs unfused",
    )
    args = parser.parse_args()
    import onnxruntime

    print(f"onnxruntime {onnxruntime.__version__}, korch {korch.__version__}, budget {args.time_budget:g} s")
    head = "per seed: ONNX Runtime off vs on / korch vs on / korch vs off" if args.agreement else MEASURED
    print(f"{'file':28s} {head} {'s':>5s}")
    directory = Path(args.dir)
    for name in args.models:
        source = build(name, directory)
        for form in args.forms.split(","):
            out = directory / f"{name}-{form}.onnx"
            started = time.perf_counter()
            try:
                if not out.exists():
                    quantize(source, form, out)
            except Exception as e:  # (ONNX Runtime's quantizer fails on some graphs: not korch's)
                print(f"{out.name:28s} ONNX Runtime's quantizer failed: {str(e).splitlines()[0][:80]}")
                continue
            try:
                line = agreement(out) if args.agreement else measure(out, args.time_budget, args.cache)
            except korch.KorchError as e:
                line = f"refused: {e}"
            print(f"{out.name:28s} {line} {time.perf_counter() - started:5.0f}", flush=True)


if __name__ == "__main__":
    main()
