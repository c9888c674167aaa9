"""The `korch` command line's grammar: every command, its arguments and their checks. Usage
errors are bad input: one line on stderr and exit code 2 (korch.cli.commands runs the commands)."""

from __future__ import annotations

import argparse
import math

from korch.errors import KorchError


class UsageError(KorchError):
    """A command line the grammar refuses."""


class _Parser(argparse.ArgumentParser):
    """Usage errors are bad input like any other: raised, not printed, so that korch.cli.commands reports
    them the one way it reports every error (one line on stderr; with --json, a JSON object)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


_VERBOSE = "log korch's notes, and print tracebacks for unexpected errors"


def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        if any(d < 0 for d in shape):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape wants NAME=D0xD1x..., got {text!r}") from None
    return name, shape


def _parse_value(text: str) -> tuple[str, bool | int | float]:
    """--value NAME=V: true, false or a number, for every element of the input."""
    name, sep, word = text.rpartition("=")
    word = word.strip().lower()
    try:
        if not sep or not name:
            raise ValueError
        if word in ("true", "false"):
            return name, word == "true"
        try:
            return name, int(word)  # (an int64 past 2**53 stays exact)
        except ValueError:
            number = float(word)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--value wants NAME=true|false|NUMBER, got {text!r}") from None
    if math.isinf(number) and "inf" not in word:  # 1e400: no float holds it; inf is said outright
        raise argparse.ArgumentTypeError(f"--value {text!r}: the number is out of range")
    return name, number


def _path(text: str) -> str:
    """An argparse type: a file name, not an empty string (which a shell variable left unset gives)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("wants a file name, got an empty string")
    return text


def _at_least(low, kind=int):
    """An argparse type: a number of `kind` not below `low` (NaN is refused too)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a number, got {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=_path, help="ONNX file")
    p.add_argument(
        "--shape",
        action="append",
        type=_parse_shape,
        metavar="NAME=D0xD1x...",
        help="pin an input's shape (repeatable)",
    )
    _value_arg(p)
    p.add_argument("--strict", action="store_true", help="fail instead of keeping operators opaque")
    _output_args(p)


def _value_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--value",
        action="append",
        type=_parse_value,
        metavar="NAME=V",
        help="pin an input to a value in every element (true, false or a number; repeatable): it "
        "becomes a constant of the model, and an If on it keeps only the branch it takes",
    )


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-version-mismatch",
        action="store_true",
        help="load a plan built with other korch/torch/onnxruntime/backend versions or another device",
    )


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    # --verbose is korch's, but users add it after the command too, where the error messages
    # that suggest it leave them; SUPPRESS keeps the command from resetting one given before it
    p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE)


def _fission_command(sub) -> None:
    p = sub.add_parser("fission", help="split every operator of an ONNX model into primitives")
    _model_args(p)
    p.add_argument(
        "-o", "--output", type=_path, help="write the primitive graph as JSON (large constants in .npz)"
    )
    p.add_argument("--check", action="store_true", help="compare with ONNX Runtime on random inputs")
    p.add_argument("--seed", type=_at_least(0), default=0, help="seed for --check inputs")
    p.add_argument("--text", action="store_true", help="also print the primitive graph's text form")


def _candidates_command(sub) -> None:
    p = sub.add_parser("candidates", help="enumerate candidate kernels (no profiling)")
    _model_args(p)
    p.add_argument(
        "--max-size", type=_at_least(1), default=12, help="primitives per candidate, broadcasts free"
    )


def _optimize_command(sub) -> None:
    p = sub.add_parser("optimize", help="fission, candidates, profiling, selection: write a plan")
    _model_args(p)
    p.add_argument(
        "-o", "--output", type=_path, required=True, metavar="PLAN_DIR", help="where to write the plan"
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--backends",
        help="comma-separated backends: inductor, inductor-frozen, inductor-autotune, vendor, eager, "
        "onnxruntime, openvino (default: all but eager and inductor-autotune on CPU; all but openvino "
        "on CUDA)",
    )
    p.add_argument(
        "--cache",
        type=_path,
        help="profile database (default $KORCH_CACHE or ~/.cache/korch/profiles.sqlite)",
    )
    p.add_argument(
        "--time-budget", type=_at_least(0.0, float), help="seconds of profiling; the rest is skipped"
    )
    p.add_argument(
        "--max-size", type=_at_least(1), default=12, help="primitives per candidate, broadcasts free"
    )
    p.add_argument("--jobs", type=_at_least(1), help="compile workers (default, and at most: one per core)")
    p.add_argument("--no-seeds", action="store_true", help="no whole-partition peer candidates")
    p.add_argument(
        "--no-rewrite", action="store_true", help="no algebraic rewrites (optimize the graph as imported)"
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where compile jobs run: local worker processes, or a Ray cluster (falls back to local "
        "when Ray is absent); timing always runs here",
    )
    p.add_argument("--ray-address", help="Ray cluster to join (default $RAY_ADDRESS, else a local one)")


def _run_command(sub) -> None:
    p = sub.add_parser("run", help="run a plan")
    p.add_argument("plan", type=_path, metavar="PLAN_DIR")
    _plan_args(p)
    p.add_argument("--inputs", type=_path, help="inputs as .npz (default: seeded random inputs)")
    p.add_argument("--output", type=_path, help="write the outputs as .npz")
    p.add_argument("--seed", type=_at_least(0), default=0)
    _output_args(p)


def _verify_command(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="run a plan and its oracle (ONNX Runtime on the source model, or the reference executor "
        "on the primitive graph for plans made from PyTorch) on the same inputs and compare",
    )
    p.add_argument("plan", type=_path, metavar="PLAN_DIR")
    _plan_args(p)
    p.add_argument("--seed", type=_at_least(0), default=0)
    p.add_argument(
        "--tolerance",
        type=_at_least(0.0, float),
        help="largest relative error accepted (default 1e-4; 1e-2 when an output is float16, 5e-2 bfloat16)",
    )
    _output_args(p)


def _bench_command(sub) -> None:
    p = sub.add_parser("bench", help="time a plan against its peers, interleaved")
    p.add_argument("target", type=_path, metavar="MODEL.onnx|PLAN_DIR")
    _plan_args(p)
    p.add_argument(
        "--vs",
        default="onnxruntime",
        help="comma-separated peers: onnxruntime, openvino, eager, torch-compile, torch-compile-freezing, "
        "torch-compile-max-autotune(-freezing), torch-compile-cudagraphs(-freezing) (torch peers need a "
        "model built by `korch zoo`)",
    )
    p.add_argument(
        "--ablation",
        action="store_true",
        help="given a model: also korch's own variants (no rewrite, whole graph, greedy, no seeds), "
        "each optimized and timed in the same run",
    )
    p.add_argument("--backends", help="comma-separated backends, when optimizing a model (as optimize's)")
    p.add_argument("--device", help="cpu (default) or cuda, when optimizing a model (a plan has its own)")
    p.add_argument("--rounds", type=_at_least(1), default=10, help="interleaved blocks per system")
    p.add_argument("--cache", type=_path, help="profile database when optimizing a model")
    p.add_argument(
        "--time-budget", type=_at_least(0.0, float), help="seconds of profiling when optimizing a model"
    )
    p.add_argument("--shape", action="append", type=_parse_shape, metavar="NAME=D0xD1x...")
    _value_arg(p)
    _output_args(p)


def _explain_command(sub) -> None:
    p = sub.add_parser("explain", help="what a plan chose and why: kernels, alternatives, graph")
    p.add_argument("plan", type=_path, metavar="PLAN_DIR")
    p.add_argument("--html", type=_path, metavar="FILE", help="also write a self-contained HTML report")
    p.add_argument(
        "--pruned", action="store_true", help="also list each pruned candidate: its primitives and why"
    )
    _output_args(p)


def _zoo_command(sub) -> None:
    p = sub.add_parser("zoo", help="build the bundled model zoo as ONNX files (random weights)")
    p.add_argument("names", nargs="*", help="models to build (default: all)")
    p.add_argument("--dir", type=_path, help="cache directory (default $KORCH_ZOO or ~/.cache/korch/zoo)")
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p.add_argument("--list", action="store_true", help="list the models")
    _output_args(p)


_COMMANDS = (
    _fission_command,
    _candidates_command,
    _optimize_command,
    _run_command,
    _verify_command,
    _bench_command,
    _explain_command,
    _zoo_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="korch", description="Optimal kernel orchestration for tensor programs.")
    parser.add_argument("--verbose", action="store_true", help=_VERBOSE)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in _COMMANDS:  # (in the order `korch --help` lists them)
        command(sub)
    return parser
