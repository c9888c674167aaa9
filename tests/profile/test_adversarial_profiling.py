"""Adversarial profiling. Broken, foreign, unwritable and locked profile databases, and profiling
flags that cannot work, are one `korch: error:` line and exit 2 before any profiling, the database
left as it was. A profiling worker killed at any moment (idle, compiling, timing) neither ends a
run without a plan nor leaves a failure of the machine kept as the kernel's own."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import multiprocessing
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from badinput import Case, good_model, problem, run_main
from faulty_backends import RaiseBackend, TorchKernels
from helpers import relu_model

import korch
import korch.pipeline as pipeline
from korch.backends import CompiledKernel, get_backends
from korch.cli import commands as cli
from korch.errors import KorchError
from korch.profile import database as profile_db
from korch.profile.database import SCHEMA, Profile, ProfileDB
from korch.profile.workers import WorkerPool
from korch.search.candidates import CandidateOptions, enumerate_candidates

KILLS = "KORCH_TEST_KILLS"  # a directory: each kill below happens once per test, marked by a file


# ------------------------------------------------------------------ jobs and backends run by workers


def echo(job: dict) -> dict:
    """(A korch.profile.workers job.)"""
    return {"status": "ok", **job}


def misbehave(job: dict) -> dict:
    """(A korch.profile.workers job.) Its worker is killed as the OOM killer kills, or it hangs."""
    if job["do"] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
    return {"status": "ok"}


def _first(event: str) -> bool:
    """Whether `event` happens here for the first time in this test (a file made in $KORCH_TEST_KILLS),
    in a profiling worker (korch itself may compile a backend's least kernel:
    korch.orchestrate.solve_measure)."""
    if multiprocessing.parent_process() is None:
        return False
    try:
        os.close(os.open(Path(os.environ[KILLS]) / event, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _siblings() -> list[int]:
    """The other profiling workers of this worker's parent (read from /proc: Linux)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
            if ppid == os.getppid() and b"spawn_main" in cmdline and int(stat.parent.name) != os.getpid():
                found.append(int(stat.parent.name))
    return found


def _dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


class KillCompileBackend(TorchKernels):
    """Its first compile is killed mid-job, as by the OOM killer."""

    name = "kill-compile"

    def compile(self, spec, device):
        if _first(self.name):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().compile(spec, device)


class KillTimingBackend(TorchKernels):
    """Its first kernel to be timed kills the timing worker: a compile worker calls a kernel once
    (its check), the timing worker calls it again and again."""

    name = "kill-timing"

    def compile(self, spec, device):
        inner, calls = super().compile(spec, device).fn, itertools.count(1)

        def fn(*inputs):
            if next(calls) == 2 and _first(self.name):
                os.kill(os.getpid(), signal.SIGKILL)
            return inner(*inputs)

        return CompiledKernel(fn)


class KillTimerBackend(TorchKernels):
    """Its first compile kills the other workers of the run (with one compile worker: the timing
    worker, idle or still importing, before its first job) and waits until they are dead; its
    kernels are refused, so that plans hold only real backends."""

    name = "kill-timer"

    def compile(self, spec, device):
        if _first(self.name):
            others = _siblings()
            for pid in others:
                os.kill(pid, signal.SIGKILL)
            while not all(_dead(pid) for pid in others):
                time.sleep(0.01)
        raise RuntimeError("no kernel from kill-timer")


class KillAlwaysBackend(TorchKernels):
    """Every compile kills its worker."""

    name = "kill-always"

    def compile(self, spec, device):
        if multiprocessing.parent_process() is not None:  # (in a worker)
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("no kernel from kill-always outside a worker")


# ------------------------------------------------------------------ the corpus: databases and flags


def _store_rows(path: Path) -> Path:
    """A korch database of a few rows, closed, in the rollback journal mode (so that reading it
    changes no byte, whatever SQLite does on close)."""
    db = ProfileDB(path)
    db.store(Profile("k1", "onnxruntime", "ok", 0.5, 0.4, 0.9, 1, 0.1), "v1", "cpu", "sig", {"a": 1})
    db.store(Profile("k2", "onnxruntime", "failed", reason="RuntimeError: no"), "v1", "cpu", "sig", {})
    db.store_rewrite_timing("r1", "v1", "cpu", 1.0, 0.5)
    db.close()
    return _journal(path, "delete")


def _journal(path: Path, mode: str) -> Path:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={mode}")
    conn.close()
    return path


def _korch_db(d: Path, *statements: str, mode: str = "delete") -> Path:
    path = _store_rows(d / "profiles.sqlite")
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return _journal(path, mode)


def _bytes(d: Path, data: bytes) -> Path:
    (d / "profiles.sqlite").write_bytes(data)
    return d / "profiles.sqlite"


def _overwrite(d: Path, start: int, stop: int, byte: int = 0xAB) -> Path:
    path = _korch_db(d)
    data = bytearray(path.read_bytes())
    data[start:stop] = bytes([byte]) * (stop - start)
    path.write_bytes(bytes(data))
    return path


def _truncate(d: Path, keep: float) -> Path:
    path = _korch_db(d)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "profiles.sqlite")
    return d / "profiles.sqlite"


def _socket(d: Path, stack: contextlib.ExitStack) -> Path:
    sock = stack.enter_context(socket.socket(socket.AF_UNIX))
    sock.bind(str(d / "profiles.sqlite"))
    return d / "profiles.sqlite"


def _symlink_to_directory(d: Path) -> Path:
    (d / "elsewhere").mkdir()
    (d / "profiles.sqlite").symlink_to(d / "elsewhere")
    return d / "profiles.sqlite"


def _unwritable(target: Path, stack: contextlib.ExitStack) -> bool:
    """Make a file or directory unwritable, even to root (immutable: chattr +i), until the case
    ends; False where this machine cannot."""
    if os.geteuid() != 0:
        mode = target.stat().st_mode
        target.chmod(0o555 if target.is_dir() else 0o444)
        stack.callback(target.chmod, mode)
        return True
    made = subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode == 0
    if made:
        stack.callback(subprocess.run, ["chattr", "-i", str(target)], check=True)
    return made


def _immutable_file(d: Path, stack: contextlib.ExitStack, mode: str) -> Path | None:
    path = _korch_db(d, mode=mode)
    return path if _unwritable(path, stack) else None


def _immutable_directory(d: Path, stack: contextlib.ExitStack, mode: str) -> Path | None:
    """A database whose directory cannot be written: SQLite cannot make its journal there."""
    inner = d / "read-only"
    inner.mkdir()
    path = _korch_db(inner, mode=mode)
    return path if _unwritable(inner, stack) else None


def _locked(d: Path, stack: contextlib.ExitStack, mode: str, begin: str) -> Path:
    """Another program holds a write transaction on the database (as long as the case runs)."""
    path = _korch_db(d, mode=mode)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute(begin)
    stack.callback(holder.close)
    stack.callback(holder.execute, "ROLLBACK")
    return path


@dataclass(frozen=True)
class DbCase:
    category: str
    name: str
    make: Callable  # (directory, ExitStack) -> the --cache path, or None where it cannot be made here
    match: str
    unchanged: bool = True  # the file (and its directory) is left exactly as it was
    plan_inside: str | None = None  # -o names this directory of the case's (the cache may be in it)
    env_cache: bool = False  # the cache is given by $KORCH_CACHE, not --cache
    flags: tuple[str, ...] = ()  # more flags for korch optimize


def _cases() -> list[DbCase]:
    page = 4096
    damaged = {
        "btree-page-overwritten": (lambda d, s: _overwrite(d, page + 100, 3 * page), "damaged"),
        "truncated-to-half": (lambda d, s: _truncate(d, 0.5), "damaged"),
        "truncated-to-one-page": (lambda d, s: _truncate(d, 0.25), "damaged"),
        "header-page-size-garbage": (lambda d, s: _overwrite(d, 16, 18, 0x03), "not a usable"),
        "first-page-schema-zeroed": (lambda d, s: _overwrite(d, 100, page, 0x00), "damaged"),
        "sqlite-magic-then-zeros": (lambda d, s: _bytes(d, b"SQLite format 3\x00" + bytes(4080)), "usable"),
        "text-file": (lambda d, s: _bytes(d, b"these are my notes\n" * 40), "not a usable"),
        "random-bytes": (lambda d, s: _bytes(d, os.urandom(8192)), "not a usable"),
        "zeros": (lambda d, s: _bytes(d, bytes(8192)), "not a usable"),
        "an-onnx-model": (lambda d, s: _bytes(d, good_model().SerializeToString()), "not a usable"),
        "median-text": (lambda d, s: _korch_db(d, "UPDATE profiles SET median_ms = 'fast'"), "median_ms"),
        "min-text": (lambda d, s: _korch_db(d, "UPDATE profiles SET min_ms = 'n/a'"), "min_ms"),
        "max-blob": (lambda d, s: _korch_db(d, "UPDATE profiles SET max_ms = x'00ff'"), "max_ms"),
        "kernels-text": (lambda d, s: _korch_db(d, "UPDATE profiles SET kernels = 'many'"), "kernels"),
        "compile-negative": (lambda d, s: _korch_db(d, "UPDATE profiles SET compile_s = -1"), "compile_s"),
        "median-negative": (lambda d, s: _korch_db(d, "UPDATE profiles SET median_ms = -0.5"), "median_ms"),
        "env-failures-text": (lambda d, s: _korch_db(d, "UPDATE profiles SET env_failures = 'x'"), "env_"),
        "rewrite-before-text": (
            lambda d, s: _korch_db(d, "UPDATE rewrite_timings SET before_ms = 'slow'"),
            "before_ms",
        ),
    }
    foreign = {
        "another-table-beside": (lambda d, s: _korch_db(d, "CREATE TABLE users (name TEXT)"), "users"),
        "an-index-on-profiles": (lambda d, s: _korch_db(d, "CREATE INDEX fast ON profiles (status)"), "fast"),
        "a-view": (lambda d, s: _korch_db(d, "CREATE VIEW v AS SELECT key FROM profiles"), "v"),
        "a-trigger": (
            lambda d, s: _korch_db(
                d, "CREATE TRIGGER t AFTER INSERT ON profiles BEGIN DELETE FROM profiles; END"
            ),
            "t",
        ),
        "only-other-tables": (
            lambda d, s: _sqlite(d, "CREATE TABLE users (a)", "CREATE TABLE orders (b)"),
            "orders, users",
        ),
        "profiles-of-a-newer-korch": (
            lambda d, s: _korch_db(d, "ALTER TABLE profiles ADD COLUMN future REAL"),
            "other columns",
        ),
        "profiles-lacking-a-column": (
            lambda d, s: _sqlite(d, SCHEMA.replace("    reason TEXT,\n", "")),
            "other columns",
        ),
    }
    files = {
        "a-directory": (lambda d, s: d, "is a directory"),
        "a-symlink-to-a-directory": (lambda d, s: _symlink_to_directory(d), "is a directory"),
        "a-fifo": (lambda d, s: _fifo(d), "not a regular file"),
        "a-unix-socket": (_socket, "not a regular file"),
        "a-character-device": (lambda d, s: Path(os.devnull), "not a regular file"),
        "below-a-regular-file": (lambda d, s: _bytes(d, b"x") / "profiles.sqlite", "not a directory"),
    }
    unwritable = {
        "immutable-file-wal": (lambda d, s: _immutable_file(d, s, "wal"), "read-only"),
        "immutable-file-rollback": (lambda d, s: _immutable_file(d, s, "delete"), "read-only"),
        "immutable-directory-rollback": (lambda d, s: _immutable_directory(d, s, "delete"), "writable"),
        "immutable-directory-wal": (lambda d, s: _immutable_directory(d, s, "wal"), "writable"),
        "locked-by-a-writer-wal": (lambda d, s: _locked(d, s, "wal", "BEGIN IMMEDIATE"), "locked"),
        "locked-by-a-writer-rollback": (lambda d, s: _locked(d, s, "delete", "BEGIN IMMEDIATE"), "locked"),
        "locked-exclusively": (lambda d, s: _locked(d, s, "delete", "BEGIN EXCLUSIVE"), "locked"),
    }
    cases = [DbCase("damaged", n, make, match) for n, (make, match) in damaged.items()]
    cases += [DbCase("foreign", n, make, match) for n, (make, match) in foreign.items()]
    cases += [DbCase("files", n, make, match) for n, (make, match) in files.items()]
    cases += [DbCase("unwritable", n, make, match) for n, (make, match) in unwritable.items()]
    return cases + _flag_cases()


def _sqlite(d: Path, *statements: str) -> Path:
    conn = sqlite3.connect(d / "profiles.sqlite")
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return d / "profiles.sqlite"


def _flag_cases() -> list[DbCase]:
    """Profiling flags that cannot work: -o and --cache together where saving the plan would
    replace the database with the plan's directory, and values the grammar or the options refuse;
    all before the database is even made."""
    inside = {  # name: (the cache in the case's directory, the plan there, by $KORCH_CACHE)
        "cache-in-the-plan-directory": ("plan/p.sqlite", "plan", False),
        "cache-deep-in-the-plan": ("plan/a/b/p.sqlite", "plan", False),
        "cache-is-the-plan-directory": ("plan", "plan", False),
        "korch-cache-in-the-plan": ("plan/p.sqlite", "plan", True),
        "plan-is-dot-cache-beside": ("p.sqlite", ".", False),
    }
    bad = {
        "jobs-negative": ("--jobs", "-3"),
        "jobs-fraction": ("--jobs", "2.5"),
        "jobs-text": ("--jobs", "lots"),
        "jobs-empty": ("--jobs", ""),
        "time-budget-text": ("--time-budget", "10s"),
        "time-budget-empty": ("--time-budget", ""),
        "executor-unknown": ("--executor", "slurm"),
        "max-size-fraction": ("--max-size", "1.5"),
        "backends-one-unknown": ("--backends", "onnxruntime,nope"),  # (the line names 'nope')
        "device-cuda-text-index": ("--device", "cuda:x"),
    }
    cases = [
        DbCase("flags", name, lambda d, s, c=cache: d / c, "inside the plan directory", False, plan, env)
        for name, (cache, plan, env) in inside.items()
    ]
    return cases + [
        DbCase("flags", name, lambda d, s: d / "p.sqlite", "nope" if "nope" in v else f, False, flags=(f, v))
        for name, (f, v) in bad.items()
    ]


CATEGORIES = ("damaged", "foreign", "files", "unwritable", "flags")


def _state(path: Path) -> tuple:
    """What a refused run must not change: the file's bytes and what lies beside it (but for the
    index and log SQLite makes beside a database in WAL mode whenever it is read)."""
    if not path.is_file():
        return (path.exists(),)
    data = path.read_bytes()
    wal = data[18:20] == b"\x02\x02"  # (the header's read and write versions: 2 is WAL)
    shared = {f"{path.name}-wal", f"{path.name}-shm"} if wal else set()
    return hashlib.sha256(data).hexdigest(), sorted(
        p.name for p in path.parent.iterdir() if p.name not in shared
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "good.onnx"
    onnx.save(good_model(), path)
    return path


def _argv(model: Path, plan: Path, cache: Path | None) -> list[str]:
    argv = ["optimize", str(model), "-o", str(plan), "--backends", "onnxruntime", "--max-size", "2"]
    return argv + (["--cache", str(cache)] if cache is not None else [])


def _run_case(case: DbCase, model: Path, d: Path, capsys, monkeypatch) -> str | None:
    """None when the case is refused as it should be, else what went wrong."""
    with contextlib.ExitStack() as stack:
        cache = case.make(d, stack)
        if cache is None:
            return None  # (not possible on this machine: an immutable file needs root's chattr)
        plan = d / (case.plan_inside or "plan-elsewhere")
        if case.plan_inside == ".":
            monkeypatch.chdir(d)
            plan = Path(".")
        before = _state(cache)
        if case.env_cache:
            monkeypatch.setenv("KORCH_CACHE", str(cache))
        argv = [*_argv(model, plan, None if case.env_cache else cache), *case.flags]
        code, _, err = run_main(argv, capsys)
        monkeypatch.delenv("KORCH_CACHE", raising=False)
        monkeypatch.chdir(model.parent)
        bad = problem(Case(case.category, case.name, (), case.match), code, err)
        if bad is None and "Traceback" in err:
            bad = f"{case.name}: a traceback"
        if bad is None and case.unchanged and _state(cache) != before:
            bad = f"{case.name}: the database was changed"
        if bad is None and not case.unchanged and Path(cache).exists():
            bad = f"{case.name}: the database was created: the run went on to profile"
        if bad is None and case.plan_inside is None and plan.exists():
            bad = f"{case.name}: a plan was written"
        return bad


def test_the_corpus_is_large():
    cases = _cases()
    assert len(cases) >= 35, len(cases)
    assert {c.category for c in cases} == set(CATEGORIES)
    assert len({c.name for c in cases}) == len(cases)


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_bad_database_is_one_line_before_any_profiling(category, model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(profile_db, "LOCK_WAIT_S", 1.0)  # (the lock cases: a second each, not five)
    problems = []
    for case in (c for c in _cases() if c.category == category):
        d = tmp_path / case.name
        d.mkdir()
        started = time.monotonic()
        problems.append(_run_case(case, model, d, capsys, monkeypatch))
        if "locked" in case.name and time.monotonic() - started < 1.0:
            problems.append(f"{case.name}: refused without waiting for the lock")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def test_a_lock_is_waited_for_a_few_seconds_and_the_error_says_how_long(model, tmp_path, capsys):
    """With the real LOCK_WAIT_S: a lock another program holds past it ends the run in one line
    that names the wait, seconds after the start instead of after the profiling (75 s)."""
    assert 1 <= profile_db.LOCK_WAIT_S <= 10
    with contextlib.ExitStack() as stack:
        cache = _locked(tmp_path, stack, "wal", "BEGIN IMMEDIATE")
        started = time.monotonic()
        code, _, err = run_main(_argv(model, tmp_path / "plan", cache), capsys)
        waited = time.monotonic() - started
    assert problem(Case("lock", "real-wait", (), f"waited {profile_db.LOCK_WAIT_S:g} s"), code, err) is None
    assert profile_db.LOCK_WAIT_S <= waited < profile_db.LOCK_WAIT_S + 20


# ------------------------------------------------------------------ the database: transient failures


def _legacy_db(path: Path) -> Path:
    """A database as korch wrote it before environmental failures were counted."""
    legacy = SCHEMA.replace("    env_failures INTEGER NOT NULL DEFAULT 0,\n", "")
    assert legacy != SCHEMA
    conn = sqlite3.connect(path)
    conn.execute(legacy)
    rows = [
        ("died", "failed", None, "worker died (exit code -9)"),
        ("slow", "failed", None, "timed out after 300s"),
        ("memory", "failed", None, "OutOfMemoryError: CUDA out of memory"),
        ("refused", "failed", None, "RuntimeError: no kernel for you"),
        ("wrong", "failed", None, "wrong result: y relative error 0.5"),
        ("fine", "ok", 1.5, None),
    ]
    for key, status, ms, reason in rows:
        conn.execute(
            "INSERT INTO profiles (key, backend, backend_version, device, signature, status, median_ms, "
            "reason, spec, created) VALUES (?, 'inductor', 'v1', 'cpu', 's', ?, ?, ?, '{}', 0)",
            (key, status, ms, reason),
        )
    conn.commit()
    conn.close()
    return path


def test_an_older_database_is_migrated_and_its_environmental_failures_are_retried(tmp_path):
    path = _legacy_db(tmp_path / "old.sqlite")
    db = ProfileDB(path)
    try:
        look = {
            k: db.lookup(k, "inductor", "v1", "cpu") for k in ("died", "slow", "memory", "refused", "wrong")
        }
        assert {k for k, p in look.items() if p is None} == {"died", "slow", "memory"}
        assert look["refused"].status == look["wrong"].status == "failed"
        assert db.lookup("fine", "inductor", "v1", "cpu").median_ms == 1.5
        assert db.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        db.close()
    conn = sqlite3.connect(path)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(profiles)")]
    conn.close()
    assert columns[-1] == "env_failures"


def test_environmental_failures_are_retried_until_the_cap_then_kept(tmp_path):
    db = ProfileDB(tmp_path / "p.sqlite")
    died = Profile("k", "inductor", "failed", reason="worker died (exit code -9)", transient=True)
    try:
        for _ in range(profile_db.ENVIRONMENTAL_CAP - 1):
            db.store(died, "v1", "cpu", "s", {})
            assert db.lookup("k", "inductor", "v1", "cpu") is None  # profiled again by the next run
        db.store(died, "v1", "cpu", "s", {})
        kept = db.lookup("k", "inductor", "v1", "cpu")
        assert kept.status == "failed" and not kept.transient  # a kernel that kills every worker
        # a deterministic failure is kept at once; a success after a failure of the machine is kept
        db.store(Profile("d", "inductor", "failed", reason="RuntimeError: no"), "v1", "cpu", "s", {})
        assert db.lookup("d", "inductor", "v1", "cpu").status == "failed"
        db.store(died, "v2", "cpu", "s", {})
        db.store(Profile("k", "inductor", "ok", 2.0), "v2", "cpu", "s", {})
        assert db.lookup("k", "inductor", "v2", "cpu").median_ms == 2.0
    finally:
        db.close()


def test_out_of_memory_and_a_full_disk_are_the_machines_failures():
    import errno

    from korch.profile.workers import environmental

    assert environmental(MemoryError())
    assert environmental(OSError(errno.ENOSPC, "No space left on device"))
    assert environmental(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert environmental(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 10 GB"))
    assert not environmental(RuntimeError("no kernel for you"))
    assert not environmental(ValueError("wrong shape"))


# ------------------------------------------------------------------ killed workers


def _pool_run(pool: WorkerPool, jobs: list, timeout: float = 60.0) -> list:
    results = []
    pool.run(jobs, timeout, lambda job, result: results.append(result))
    return results


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("when", ["idle", "starting"])
def test_a_worker_killed_before_its_job_costs_nothing(when):
    """An idle worker killed (the OOM killer, between chunks) or one killed while it imports: the
    job sent to it was lost to a broken pipe, which korch's CLI took for a closed stdout (exit 0,
    no plan). The job now runs in a fresh worker."""
    pool = WorkerPool(1, 1, echo)
    try:
        if when == "idle":
            assert _pool_run(pool, [{"n": 1}]) == [{"status": "ok", "n": 1}]
        else:
            pool.start()
        first = pool.workers[0].proc
        _kill(first.pid)
        first.join()
        assert _pool_run(pool, [{"n": 2}, {"n": 3}]) == [{"status": "ok", "n": 2}, {"status": "ok", "n": 3}]
        assert pool.workers[0].proc.pid != first.pid
    finally:
        pool.close()


def test_workers_dead_before_every_job_end_the_run_with_one_line():
    """(torch.set_num_threads(0) raises in each worker as it starts.) Dead before their jobs are
    sent: a one-line error, not a broken pipe."""
    pool = WorkerPool(1, 0, echo)
    try:
        pool.start()
        pool.workers[0].proc.join()
        with pytest.raises(KorchError, match=r"^profiling workers cannot start: worker died"):
            _pool_run(pool, [{"n": n} for n in range(5)])
    finally:
        pool.close()


def test_a_worker_killed_or_timed_out_mid_job_is_the_machines_failure():
    pool = WorkerPool(1, 1, misbehave)
    try:
        died, slow = _pool_run(pool, [{"do": "die"}, {"do": "hang"}], timeout=2.0)
    finally:
        pool.close()
    assert died == {"status": "failed", "reason": "worker died (exit code -9)", "environmental": True}
    assert slow == {"status": "failed", "reason": "timed out after 2s", "environmental": True}


def _graph_and_candidates():
    graph = korch.fission(good_model()).graph
    return graph, enumerate_candidates(graph, CandidateOptions(max_size=2))


@pytest.mark.e2e
def test_kernels_whose_workers_were_killed_are_profiled_again_by_the_next_run(tmp_path, monkeypatch):
    """A compile worker killed mid-compile and the timing worker killed mid-timing (once each):
    both kernels are failures of the machine, not kept; the next run profiles them, and them only."""
    from korch.profile.profiler import ProfileOptions, profile

    monkeypatch.setenv(KILLS, str(tmp_path))
    graph, cands = _graph_and_candidates()
    backends = [KillCompileBackend(), KillTimingBackend()]
    options = ProfileOptions(min_time=0.002, progress=False, jobs=1)
    first = profile(graph, cands, backends, ProfileDB(tmp_path / "p.sqlite"), options)
    lost = {(b, p.reason) for by in first.profiles.values() for b, p in by.items() if p.status != "ok"}
    assert lost == {
        ("kill-compile", "worker died (exit code -9)"),
        ("kill-timing", "worker died (exit code -9)"),
    }
    assert all(p.transient for by in first.profiles.values() for p in by.values() if p.status != "ok")
    second = profile(graph, cands, backends, ProfileDB(tmp_path / "p.sqlite"), options)
    assert second.profiled == 2 and second.failed == 0
    assert second.cache_hits == first.profiled - 2
    conn = sqlite3.connect(tmp_path / "p.sqlite")
    statuses = conn.execute("SELECT status, COUNT(*) FROM profiles GROUP BY status").fetchall()
    conn.close()
    assert statuses == [("ok", first.profiled)]


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the timing worker in Linux's /proc")
def test_the_timing_worker_killed_before_its_first_job_still_gives_a_plan(
    model, tmp_path, capsys, monkeypatch
):
    """`korch optimize` exited 0 with no plan and no message: the send to the dead timing worker
    raised BrokenPipeError, which the CLI took for a closed stdout."""
    monkeypatch.setenv(KILLS, str(tmp_path))
    monkeypatch.setattr(pipeline, "get_backends", lambda *args: [KillTimerBackend(), *get_backends(*args)])
    code, out, err = run_main(
        [*_argv(model, tmp_path / "plan", tmp_path / "p.sqlite"), "--jobs", "1", "-q"], capsys
    )
    assert code == 0, err
    assert (tmp_path / "kill-timer").exists()  # the timing worker was killed
    assert korch.load(tmp_path / "plan").verify() <= 1e-4
    conn = sqlite3.connect(tmp_path / "p.sqlite")
    failed = conn.execute("SELECT backend, reason FROM profiles WHERE status != 'ok'").fetchall()
    conn.close()
    assert {b for b, _ in failed} == {"kill-timer"}, failed  # its refusals only: no job was lost


def test_a_broken_pipe_that_is_not_stdout_is_not_success(model, tmp_path, capsys, monkeypatch):
    """Only a reader that left stdout (`korch ... | head`) ends a command quietly with exit 0."""

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.COMMANDS, "fission", broken)
    code, _, err = run_main(["fission", str(model)], capsys)
    assert (
        code == 2
        and err.startswith("korch: error: unexpected BrokenPipeError")
        and len(err.splitlines()) == 1
    )
    read, write = os.pipe()
    os.close(read)  # the reader is gone before korch writes
    proc = subprocess.run(
        [sys.executable, "-m", "korch.cli.commands", "fission", str(model), "--text"],
        stdout=write,
        stderr=subprocess.PIPE,
    )
    os.close(write)
    assert proc.returncode == 0 and b"error" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------ advice, and --jobs


def _relu(path):
    return relu_model(path, opset=17)


@pytest.mark.parametrize("backend", [RaiseBackend, KillAlwaysBackend], ids=["refused", "killed"])
def test_when_nothing_ran_the_advice_fits_the_failure(backend, tmp_path, monkeypatch):
    """--time-budget was advised whatever the failures, where no budget was given and a larger
    one could not help; failures of the machine are said to be profiled again."""
    monkeypatch.setattr(pipeline, "get_backends", lambda *args: [backend()])
    options = pipeline.OptimizeOptions(
        cache=tmp_path / "p.sqlite", progress=False, min_time=0.002, seeds=False, jobs=1
    )
    with pytest.raises(KorchError) as refused:
        pipeline.optimize(_relu(tmp_path / "m.onnx"), options=options)
    message = str(refused.value)
    assert "commonest profiling failure" in message and "--time-budget" not in message, message
    assert ("profiled again by the next run" in message) == (backend is KillAlwaysBackend), message


def test_jobs_are_capped_at_the_cores_and_the_cap_is_said(tmp_path, capsys, caplog):
    cores = os.cpu_count() or 1
    with caplog.at_level(logging.WARNING, logger="korch"):
        options = pipeline.OptimizeOptions(jobs=cores * 50)
    assert options.jobs == cores
    assert f"{cores * 50} jobs asked for, more than this machine's {cores} cores" in caplog.text
    assert pipeline.OptimizeOptions(jobs=cores).jobs == cores
    capsys.readouterr()  # (korch's logger writes to stderr once a CLI test has run here)
    code, _, err = run_main(
        _argv(tmp_path / "missing.onnx", tmp_path / "plan", None) + ["--jobs", "999"], capsys
    )
    lines = err.splitlines()
    assert code == 2 and len(lines) == 2, err  # the note on the cap, then the missing model's error
    assert f"999 jobs asked for, more than this machine's {cores} cores: {cores} compile workers" in lines[0]
