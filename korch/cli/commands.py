"""The `korch` commands: what each one does, environment variables, output and exit codes (the
argument grammar is korch.cli.args)."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

from korch.cli.args import UsageError, build_parser
from korch.errors import CheckFailed, KorchError, first_line


def _log(args, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr, flush=True)


def _emit(args, payload: dict, human: str) -> None:
    if args.json:
        print(json.dumps(payload))
        args.emitted = True  # its one JSON object: a check failing after it adds no other
    else:
        print(human)


def cmd_fission(args) -> int:
    import korch
    from korch.cli.run_files import refuse_inside_plan
    from korch.ir.serialize import check_graph_target, save_graph
    from korch.measure.tolerance import graph_tolerance

    if args.output:  # refused before any work, as optimize's -o is
        check_graph_target(Path(args.output))
        refuse_inside_plan(Path(args.output), "-o")
        _check_not_the_model(Path(args.output), args.model)
        _check_writable(Path(args.output))
    start = time.perf_counter()
    result = korch.fission(args.model, shapes=_shapes(args), values=_values(args), strict=args.strict)
    seconds = time.perf_counter() - start
    graph = result.graph
    for warning in result.warnings:
        _log(args, f"warning: {warning}")
    _log(args, f"fission: {result.onnx_nodes} ONNX nodes -> {len(graph.nodes)} primitives in {seconds:.2f}s")
    written = save_graph(graph, args.output) if args.output else []
    err = None
    limit = graph_tolerance(graph)
    if args.check:
        err = korch.check_fission(result, seed=args.seed)
        _log(args, f"check: max relative error vs ONNX Runtime {err:.3g} (tolerance {limit:g})")
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
    if err is not None and not err <= limit:
        raise CheckFailed(f"max relative error {err:.3g} exceeds {limit:g}")
    return 0


def _check_not_the_model(output: Path, model) -> None:
    """fission -o writes OUTPUT and OUTPUT.npz: neither may be the model itself, under any name."""
    for path in (output, output.with_suffix(".npz")):
        try:
            same = os.path.samefile(path, model)
        except OSError:  # one of them does not exist: nothing to overwrite
            continue
        if same:
            raise KorchError(f"-o {output}: would overwrite the model {model}")


def cmd_candidates(args) -> int:
    import korch
    from korch.search.candidates import CandidateOptions, enumerate_candidates

    if args.max_size < 1:
        raise KorchError("--max-size must be at least 1")
    result = korch.fission(args.model, shapes=_shapes(args), values=_values(args), strict=args.strict)
    found = enumerate_candidates(result.graph, CandidateOptions(max_size=args.max_size))
    payload = found.summary()
    pruned = ", ".join(f"{k} {v}" for k, v in payload["pruned"].items()) or "none"
    human = (
        f"{args.model}: {payload['primitives']} primitives in {payload['partitions']} partitions -> "
        f"{payload['candidates']} candidates ({payload['unique_candidates']} unique) "
        f"in {payload['seconds']:.2f}s\npruned: {pruned}"
    )
    note = found.lowered_note(args.max_size, CandidateOptions.max_per_partition)
    if note:  # (on stderr: the JSON object is the contract's)
        _log(args, f"note: {note}")
    _emit(args, payload, human)
    return 0


def _cache_path(args):
    return args.cache or os.environ.get("KORCH_CACHE") or None


def cmd_optimize(args) -> int:
    from korch.pipeline import optimize

    options = _optimize_options(args)
    plan = optimize(
        args.model, shapes=_shapes(args), values=_values(args), options=options, strict=args.strict
    )
    try:
        plan.save(args.output)
    except OSError as e:  # the place was writable when checked, minutes ago
        raise KorchError(f"cannot write {args.output} ({e.strerror or e})") from None
    payload = _optimize_payload(plan, args.output)
    human = _optimize_text(args.model, plan, payload)
    _optimize_warnings(args, plan.meta.search, payload["disturbed"])
    _emit(args, payload, human)
    return 0


def _optimize_options(args):
    """optimize's options from its flags, refused before any work: the plan's place is checked
    now, not after minutes of profiling."""
    from korch.pipeline import OptimizeOptions

    backends = _names(args.backends) if args.backends else None
    if args.backends is not None and not backends:
        raise KorchError(f"--backends names no backend: {args.backends!r}")
    _check_plan_target(args.output)
    _check_cache_outside(args.output, _cache_path(args))
    options = OptimizeOptions(
        device=args.device,
        backends=backends,
        cache=_cache_path(args),
        time_budget=args.time_budget,
        max_size=args.max_size,
        jobs=args.jobs,
        progress=not args.quiet,
        seeds=not args.no_seeds,
        rewrite=not args.no_rewrite,
        executor=args.executor,
        ray_address=args.ray_address or os.environ.get("RAY_ADDRESS") or None,
    )
    options.check_device("--device")
    return options


def _optimize_payload(plan, output) -> dict:
    """optimize --json's object (korch's public contract)."""
    from korch.cli import explain

    meta = plan.meta
    return {
        "kernels": len(plan.kernels),
        "predicted_ms": round(plan.predicted_ms, 6),
        "solver": meta.solver,
        "profiled": meta.profiling["profiled"],
        "cache_hits": meta.profiling["cache_hits"],
        "seconds": meta.seconds,
        "skipped": meta.profiling["skipped"],
        "failed": meta.profiling["failed"],
        "retimed": meta.profiling["retimed"],
        "disturbed": meta.profiling["disturbed"],
        "greedy_ms": round(meta.greedy_ms, 6) if meta.greedy_ms is not None else None,
        "greedy_kernels": meta.greedy_kernels,
        "measured_ms": meta.measured["ms"],
        "backends": dict(Counter(k.backend for k in plan.kernels)),
        "rewrites": meta.rewrites,
        "search": explain.search_totals(meta.search),
        "decided_by": meta.decided_by,
        "plan": str(output),
    }


def _optimize_text(model, plan, payload: dict) -> str:
    from korch.cli.explain import search_lines

    meta, solver = plan.meta, plan.meta.solver
    greedy = (
        f"greedy fusion {meta.greedy_ms:.3f} ms in {meta.greedy_kernels} kernels"
        if meta.greedy_ms is not None
        else "no greedy baseline: not every primitive was profiled alone within --time-budget"
    )
    backends_used = ", ".join(f"{k} {v}" for k, v in payload["backends"].items())
    human = (
        f"{model}: {payload['kernels']} kernels, predicted {plan.predicted_ms:.3f} ms "
        + ("" if plan.prediction_checked else "from in-place timings ")
        + f"({greedy}); measured in place {meta.measured['ms']:.3f} ms\n"
        f"solver: {solver['status']}, gap {round(solver['gap'], 6):g}, {solver['seconds']:.2f}s; "
        f"profiled {payload['profiled']}, cache hits {payload['cache_hits']}, "
        f"failed {payload['failed']}, skipped {payload['skipped']}\n"
        f"backends: {backends_used}\n{search_lines(meta.search, meta.decided_by)[0]}\n"
        f"plan written to {payload['plan']}"
    )
    for rewrite in meta.rewrites:
        human += f"\nrewrite: {rewrite}"
    return human


def _optimize_warnings(args, search: dict, disturbed: int) -> None:
    """On stderr: a plan not certified optimal, and timings other processes may have slowed."""
    from korch.config import RETIMES

    if search["bounded"] and search["certified_gap"] != 0:
        gap = "an unknown gap" if search["certified_gap"] is None else f"{search['certified_gap']:.1%}"
        _log(
            args,
            f"warning: {search['bounded']} kernels were priced by lower bounds only within --time-budget: "
            f"the plan is certified within {gap} of the optimum over every candidate",
        )
    if disturbed:
        _log(
            args,
            f"warning: {disturbed} kernels were timed while other processes kept part of the "
            f"CPU busy, in every one of {1 + RETIMES} tries: their timings may be too slow (the profile "
            "database keeps them; a quieter machine and a fresh --cache may give a faster plan)",
        )


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list (--backends, --vs), blanks dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _pins(pairs, flag: str, show=str) -> dict:
    """(name, pin) pairs of a repeatable flag by input name; naming one input twice with two pins
    is a mistake, not a last-one-wins."""
    pins: dict = {}
    for name, pin in pairs or []:
        if name in pins and pins[name] != pin:
            raise KorchError(f"{flag} {name} given twice: {show(pins[name])} and {show(pin)}")
        pins[name] = pin
    return pins


def _values(args) -> dict:
    return _pins(args.value, "--value")


def _shapes(args) -> dict:
    return _pins(args.shape, "--shape", lambda dims: "x".join(map(str, dims)))


def _check_plan_target(path) -> None:
    """Refuse an output that save would refuse or could not write, before spending minutes on
    profiling."""
    from korch.plan.plan import check_save_target

    target = Path(path)
    try:
        check_save_target(target)
    except KorchError as e:
        raise KorchError(f"-o {e}") from None
    _check_writable(target)


def _check_cache_outside(plan, cache) -> None:
    """Saving a plan replaces its whole directory: a profile database inside it would first make
    the directory one that is not a plan (refused after all the profiling), or be deleted."""
    from korch.profile.database import default_path

    directory, db = Path(plan).resolve(), Path(cache or default_path()).resolve()
    if db == directory or directory in db.parents:
        raise KorchError(
            f"the profile database {cache or db} is inside the plan directory {plan}, which saving "
            "the plan replaces: keep it elsewhere (--cache or $KORCH_CACHE)"
        )


def _check_writable(target: Path) -> None:
    """Plan.save creates the plan's parent directories and a directory beside the plan to write
    into. Creating (and removing) a directory in the nearest place that exists tries the same
    without leaving anything behind, not even the parents: the model may yet be refused."""
    existing = target.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise KorchError(f"cannot write {target}: {existing} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".korch-probe-"))
    except OSError as e:
        raise KorchError(
            f"cannot write {target}: cannot create a directory in {existing} ({e.strerror or e})"
        ) from None


def _load_plan(path, args):
    from korch.plan.plan import Plan

    return Plan.load(path, allow_mismatch=args.allow_version_mismatch)


def cmd_run(args) -> int:
    from korch.cli.run_files import output_target, read_inputs, write_outputs

    written = output_target(args.output, args.plan, args.inputs) if args.output else None
    plan = _load_plan(args.plan, args)
    feeds = read_inputs(args.inputs, dict(plan.inputs)) if args.inputs else plan.random_inputs(args.seed)
    outs = plan.run(feeds)
    if written is not None:
        write_outputs(written, outs)
    payload = {
        "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in outs.items()},
        "written": str(written) if written is not None else None,
    }
    human = [f"{k}: {v.dtype}{list(v.shape)}" for k, v in outs.items()]
    if written is not None:
        human.append(f"wrote {written}")
    _emit(args, payload, "\n".join(human))
    return 0


def cmd_verify(args) -> int:
    from korch.measure.tolerance import graph_tolerance, tolerance

    plan = _load_plan(args.plan, args)
    err = plan.verify(args.seed)
    limit = args.tolerance
    if limit is None:  # (a plan without its primitive graph: float32's)
        graph = plan.graph
        limit = graph_tolerance(graph) if graph is not None else tolerance(())
    ok = bool(err <= limit)
    _emit(
        args,
        {"max_rel_err": err, "ok": ok, "oracle": plan.oracle},
        f"max relative error vs {plan.oracle}: {err:.3g} ({'ok' if ok else 'FAILED'})",
    )
    if not ok:
        raise CheckFailed(f"max relative error {err:.3g} exceeds {limit:g}")
    return 0


def cmd_bench(args) -> int:
    from korch.cli.bench import PEERS, ablation_plans, bench, check_peers

    peers = _names(args.vs)
    if not peers:  # korch timed alone has no peer to be faster than: a slip, as for --backends
        raise KorchError(f"--vs names no peer: {args.vs!r}; available: {', '.join(PEERS)}")
    check_peers(peers)  # before any optimizing
    target = Path(args.target)
    variants = {}
    if target.is_dir():
        given = [f for f, dest in _MODEL_ONLY_BENCH_FLAGS.items() if getattr(args, dest) not in (None, False)]
        if given:
            raise KorchError(f"{', '.join(given)}: only for a model to optimize; {target} is a plan")
        plan = _load_plan(target, args)
        if args.device is not None and _device_key(args.device) != _device_key(plan.device):
            raise KorchError(f"{target} was optimized for {plan.device}, not {args.device}: optimize again")
    else:
        from korch.pipeline import OptimizeOptions, optimize

        backends = _names(args.backends) if args.backends else None
        if args.backends is not None and not backends:
            raise KorchError(f"--backends names no backend: {args.backends!r}")
        options = OptimizeOptions(
            device="cpu" if args.device is None else args.device,  # (an empty --device is refused)
            backends=backends,
            cache=_cache_path(args),
            progress=not args.quiet,
            time_budget=args.time_budget,
        )
        options.check_device("--device")
        shapes, values = _shapes(args), _values(args)
        plan = optimize(target, shapes=shapes, values=values, options=options)
        if args.ablation:
            variants = ablation_plans(target, options, shapes, values, say=lambda m: _log(args, m))
    report = bench(plan, peers, rounds=args.rounds, variants=variants)
    for peer, why in report.get("skipped_peers", {}).items():  # (on stderr: the JSON is the contract's)
        _log(args, f"note: {peer} skipped: {why}")
    _emit(args, report, _bench_table(report))
    return 0


def _bench_table(report: dict) -> str:
    rows = {**report["results"], **report.get("ablation", {})}
    width = max(len(n) for n in rows)
    head = f"{'median ms':>10s} {'min ms':>9s} {'max ms':>9s} {'rel err':>9s} {'launches':>8s}"
    lines = [f"{'system':{width}s} {head}"]
    for name, r in rows.items():
        launches = r.get("launches")
        line = f"{name:{width}s} {r['median_ms']:10.3f} {r['min_ms']:9.3f} {r['max_ms']:9.3f}"
        line += f" {r['max_rel_err']:9.1e} {'' if launches is None else launches:>8}"
        if r.get("cuda_graph") is False:
            line += "  (not captured as a CUDA graph)"
        lines.append(line)
    lines.append(f"relative errors against {report['errors_against']}'s outputs on the same inputs")
    if report["speedup_vs_best_peer"]:
        predicted = report["predicted_ms"]
        lines.append(
            f"korch speedup vs best peer: {report['speedup_vs_best_peer']:.2f}x"
            + ("" if predicted is None else f" (predicted {predicted:.3f} ms)")
        )
    far = report.get("far_rounds")
    if far is not None and True in far:  # (korch.measure.placement: a slow episode of the machine)
        trips = report["round_trips_ns"]
        lines.append(
            f"{far.count(True)} of {len(far)} rounds ran with the process's CPUs far apart (a cache line's "
            f"round trip {max(trips):.0f} against {min(trips):.0f} ns); "
            f"near rounds only: {_near_medians(rows)}"
        )
    return "\n".join(lines)


def _near_medians(rows: dict) -> str:
    """Each system's median over the near rounds' calls, or "none" where no round was near."""
    if any(r.get("near_median_ms") is None for r in rows.values()):
        return "none"
    return ", ".join(f"{name} {r['near_median_ms']:.3f} ms" for name, r in rows.items())


def _device_key(device: str) -> str:
    """cuda and cuda:0 are the same device."""
    return "cuda:0" if device == "cuda" else device


# korch bench's flags that only apply when it optimizes a model
_MODEL_ONLY_BENCH_FLAGS = {
    "--time-budget": "time_budget",
    "--backends": "backends",
    "--ablation": "ablation",
    "--shape": "shape",
    "--value": "value",
    "--cache": "cache",
}


def cmd_explain(args) -> int:
    from korch.cli import explain
    from korch.cli.run_files import refuse_inside_plan
    from korch.ir.serialize import atomic_write
    from korch.plan.plan import Plan

    if args.html:
        refuse_inside_plan(Path(args.html), "--html", args.plan)
    plan = Plan.load(args.plan, allow_mismatch=True)  # a report runs nothing: any versions will do
    report = explain.report(plan, str(args.plan), pruned=args.pruned)
    if args.html:
        from korch.cli.explain_html import page

        html = page(plan, report).encode()
        try:  # (atomically: a hard link to a plan's file there is replaced, not rewritten)
            atomic_write(Path(os.path.realpath(args.html)), lambda f: f.write(html))
        except OSError as e:
            raise KorchError(f"{args.html}: cannot write the report ({e.strerror or e})") from None
        _log(args, f"explain: wrote {args.html}")
        report["html"] = str(args.html)
    _emit(args, report, explain.text(report, plan.graph))
    return 0


def cmd_zoo(args) -> int:
    from korch.cli import zoo

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


COMMANDS = {
    "fission": cmd_fission,
    "candidates": cmd_candidates,
    "optimize": cmd_optimize,
    "run": cmd_run,
    "verify": cmd_verify,
    "bench": cmd_bench,
    "explain": cmd_explain,
    "zoo": cmd_zoo,
}


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (tests and callers may swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _configure_logging(verbose: bool) -> None:
    """korch's warnings (and with --verbose its notes) go to stderr as plain lines."""
    logger = logging.getLogger("korch")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)


def _fail(wants_json: bool, kind: str, message: str, code: int) -> int:
    """A failed command's one line on stderr; with --json, also the one JSON object it owes
    stdout, so that a script reading stdout learns why there is no result."""
    print(f"korch: {kind}: {message}", file=sys.stderr)
    if wants_json:
        print(json.dumps({"error": message}))
    return code


def _owes_json(args) -> bool:
    """--json was given and nothing printed yet (a failed check follows its report)."""
    return getattr(args, "json", False) and not getattr(args, "emitted", False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:  # nothing parsed: whether JSON was asked for is read from the words
        return _fail("--json" in argv, "error", str(e), 2)
    command = COMMANDS[args.command]
    _configure_logging(args.verbose)
    try:
        return command(args)
    except BrokenPipeError as e:
        if not _reader_left():  # another pipe than stdout (a profiling worker's): not foreseen
            return _unexpected(args, e)
        # `korch ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KorchError as e:
        return _fail(_owes_json(args), "error", str(e), 2)
    except CheckFailed as e:
        return _fail(_owes_json(args), "check failed", str(e), 1)
    except KeyboardInterrupt:
        print("korch: interrupted", file=sys.stderr)
        if _owes_json(args):
            print(json.dumps({"error": "interrupted"}))
        return 130
    except Exception as e:
        return _unexpected(args, e)


def _unexpected(args, e: Exception) -> int:
    """A korch bug or an input we did not foresee: still one line."""
    if args.verbose:
        traceback.print_exc()
    line = f"unexpected {type(e).__name__}: {first_line(e)} (--verbose shows the traceback)"
    return _fail(_owes_json(args), "error", line, 2)


def _reader_left() -> bool:
    """Whether stdout is a pipe whose reader has gone (`korch ... | head`): polling its end
    reports an error then. A BrokenPipeError from any other pipe is not that."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # (errors and hang-ups are reported unasked)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # (a stdout without a descriptor: a StringIO)
        return False


if __name__ == "__main__":
    sys.exit(main())
