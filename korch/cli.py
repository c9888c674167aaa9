"""The `korch` command line: argument parsing, environment variables, output and exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from korch.errors import CheckFailed, KorchError

FISSION_TOLERANCE = 1e-4


class _Parser(argparse.ArgumentParser):
    """Usage errors are bad input: one line on stderr and exit code 2."""

    def error(self, message: str):
        sys.stderr.write(f"korch: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


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


def _log(args, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr, flush=True)


def _emit(args, payload: dict, human: str) -> None:
    if args.json:
        print(json.dumps(payload))
    else:
        print(human)


def cmd_fission(args) -> int:
    import korch
    from korch.graph_io import save_graph

    start = time.perf_counter()
    result = korch.fission(args.model, shapes=dict(args.shape or []), strict=args.strict)
    seconds = time.perf_counter() - start
    graph = result.graph
    for warning in result.warnings:
        _log(args, f"warning: {warning}")
    _log(args, f"fission: {result.onnx_nodes} ONNX nodes -> {len(graph.nodes)} primitives in {seconds:.2f}s")
    written = save_graph(graph, args.output) if args.output else []
    err = None
    if args.check:
        err = korch.check_fission(result, seed=args.seed)
        _log(args, f"check: max relative error vs ONNX Runtime {err:.3g} (tolerance {FISSION_TOLERANCE:g})")
    payload = {
        "onnx_nodes": result.onnx_nodes,
        "primitives": len(graph.nodes),
        "by_kind": graph.by_kind(),
        "opaque_ops": result.opaque_ops,
        "max_rel_err": err,
        "seconds": round(seconds, 4),
        "written": [str(p) for p in written],
    }
    kinds = ", ".join(f"{k} {v}" for k, v in payload["by_kind"].items())
    human = [f"{args.model}: {result.onnx_nodes} ONNX nodes -> {len(graph.nodes)} primitives ({kinds})"]
    if result.opaque:
        human.append("opaque: " + ", ".join(f"{op} ({why})" for op, why in sorted(set(result.opaque))))
    if err is not None:
        human.append(f"max relative error vs ONNX Runtime: {err:.3g}")
    if written:
        human.append("wrote " + ", ".join(map(str, written)))
    if args.text:
        human.append(graph.text())
    _emit(args, payload, "\n".join(human))
    if err is not None and not err <= FISSION_TOLERANCE:
        raise CheckFailed(f"max relative error {err:.3g} exceeds {FISSION_TOLERANCE:g}")
    return 0


def cmd_candidates(args) -> int:
    import korch
    from korch.candidates import CandidateOptions, enumerate_candidates

    if args.max_size < 1:
        raise KorchError("--max-size must be at least 1")
    result = korch.fission(args.model, shapes=dict(args.shape or []), strict=args.strict)
    found = enumerate_candidates(result.graph, CandidateOptions(max_size=args.max_size))
    payload = found.summary()
    pruned = ", ".join(f"{k} {v}" for k, v in payload["pruned"].items()) or "none"
    human = (
        f"{args.model}: {payload['primitives']} primitives in {payload['partitions']} partitions -> "
        f"{payload['candidates']} candidates ({payload['unique_candidates']} unique) "
        f"in {payload['seconds']:.2f}s\npruned: {pruned}"
    )
    _emit(args, payload, human)
    return 0


def cmd_zoo(args) -> int:
    from korch import zoo

    if args.list:
        names = list(zoo.MODELS)
        _emit(
            args,
            {"models": {n: zoo.MODELS[n].description for n in names}},
            "\n".join(f"{n:14s} {zoo.MODELS[n].description}" for n in names),
        )
        return 0
    cache = args.dir or os.environ.get("KORCH_ZOO") or zoo.default_dir()
    paths = {}
    for name in args.names or list(zoo.MODELS):
        start = time.perf_counter()
        paths[name] = str(zoo.build(name, cache, force=args.force))
        _log(args, f"zoo: {name} -> {paths[name]} ({time.perf_counter() - start:.1f}s)")
    _emit(args, {"models": paths}, "\n".join(paths.values()))
    return 0


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX file")
    p.add_argument(
        "--shape",
        action="append",
        type=_parse_shape,
        metavar="NAME=D0xD1x...",
        help="pin an input's shape (repeatable)",
    )
    p.add_argument("--strict", action="store_true", help="fail instead of keeping operators opaque")
    _output_args(p)


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="korch", description="Optimal kernel orchestration for tensor programs.")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks for unexpected errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("fission", help="split every operator of an ONNX model into primitives")
    _model_args(p)
    p.add_argument("-o", "--output", help="write the primitive graph as JSON (large constants in .npz)")
    p.add_argument("--check", action="store_true", help="compare with ONNX Runtime on random inputs")
    p.add_argument("--seed", type=int, default=0, help="seed for --check inputs")
    p.add_argument("--text", action="store_true", help="also print the primitive graph's text form")
    p.set_defaults(func=cmd_fission)

    p = sub.add_parser("candidates", help="enumerate candidate kernels (no profiling)")
    _model_args(p)
    p.add_argument("--max-size", type=int, default=12, help="primitives per candidate, broadcasts free")
    p.set_defaults(func=cmd_candidates)

    p = sub.add_parser("zoo", help="build the bundled model zoo as ONNX files (random weights)")
    p.add_argument("names", nargs="*", help="models to build (default: all)")
    p.add_argument("--dir", help="cache directory (default $KORCH_ZOO or ~/.cache/korch/zoo)")
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p.add_argument("--list", action="store_true", help="list the models")
    _output_args(p)
    p.set_defaults(func=cmd_zoo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KorchError as e:
        print(f"korch: error: {e}", file=sys.stderr)
        return 2
    except CheckFailed as e:
        print(f"korch: check failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("korch: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a korch bug or an input we did not foresee: still one line
        if args.verbose:
            traceback.print_exc()
        line = (str(e).strip().splitlines() or [""])[0][:300]
        print(
            f"korch: error: unexpected {type(e).__name__}: {line} (--verbose shows the traceback)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
