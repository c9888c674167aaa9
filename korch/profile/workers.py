"""Worker processes that run profiling jobs one at a time each: a crash or a hang costs its job,
not the run. A job's time limit starts when its worker is ready, not when the job is handed
over: a fresh worker first imports torch, ONNX Runtime and korch (seconds, more beside a busy
neighbour), and that is not the job's time.

Ctrl-C in a terminal reaches the whole process group. Only the parent acts on it: it stops its
workers (close), so the workers ignore it, as they would otherwise each print a traceback."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import util as mp_util
from multiprocessing.connection import wait

from korch.config import STARTUP_FAILURES, STARTUP_S
from korch.errors import KorchError
from korch.measure.heap import keep_heap

_READY = {"ready": True}


def use_threads(threads: int) -> None:
    """A worker's share of the cores, for its kernels (torch's intra-op threads) and for
    Inductor's compiles, which would otherwise start a pool of min(32, cores) processes in every
    worker: 256 compiling processes beside 16 workers on the 16-core GPU machine."""
    import torch

    torch.set_num_threads(threads)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)  # read when Inductor is imported
    config = sys.modules.get("torch._inductor.config")
    if config is not None:  # (already imported: a long-lived Ray worker)
        config.compile_threads = threads


@contextlib.contextmanager
def compile_threads(threads: int | None):
    """Inductor's compile threads raised to `threads` for one compile (None: left as they are):
    the whole graph's kernels, the longest compile of a run, would otherwise compile one after
    another in a worker whose share of the cores is one; a second thread shortens it. Inductor's
    pool, once started, stays for the worker's later jobs, which compile with the worker's own
    share again."""
    if threads is None:
        yield
        return
    from torch._inductor import config

    before = config.compile_threads
    config.compile_threads = threads
    try:
        yield
    finally:
        config.compile_threads = before


@contextlib.contextmanager
def kernel_threads(threads: int | None):
    """torch's intra-op threads set to `threads` for one compile (None: left as they are). Inductor
    specializes a CPU kernel on the thread count it is compiled with, and its caches key on it:
    a compile worker's kernel built for its own share of the cores was compiled again, whole, by
    the timing worker and by the plan, which run with all of them. Built for theirs, those
    compiles find it in the cache."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# what allocators and compilers say when memory or disk runs out (torch's CPU and CUDA allocators,
# ONNX Runtime's arena, a C++ std::bad_alloc, a full disk under Inductor's cache)
_OUT_OF_ROOM = (
    "out of memory",
    "can't allocate memory",
    "failed to allocate memory",
    "bad_alloc",
    "bad allocation",
    "no space left on device",
)


def environmental(error: BaseException) -> bool:
    """Whether an error from compiling or running a kernel is the machine's (memory or disk ran
    out), not the kernel's: korch.profile.database then counts it instead of keeping it, and a later
    run profiles the kernel again."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":  # (torch's)
        return True
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT):
        return True
    text = str(error).lower()
    return any(words in text for words in _OUT_OF_ROOM)


def _serve(conn, threads: int, run: Callable[[dict], dict]) -> None:
    # (workers are born ignoring Ctrl-C, see start_process, except those of a pool started
    # outside the main thread, where a process cannot change its signal handlers)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    use_threads(threads)
    keep_heap()  # kernels timed here as a plan runs them (korch.measure.heap)
    with contextlib.suppress(EOFError, BrokenPipeError):  # the parent is gone: nothing to serve
        conn.send(_READY)
        while True:
            job = conn.recv()
            if job is None:
                _leave()
            try:
                conn.send(run(job))
            except Exception as e:
                reason = traceback.format_exc(limit=1)[-240:]
                conn.send({"status": "failed", "reason": reason, "environmental": environmental(e)})


def _leave() -> None:
    """Exit without the interpreter's teardown: with torch and Inductor loaded it takes seconds of
    a core, which close() would wait for once per worker, and a worker has nothing to save (the
    parent stores every result). What must still happen does, first: Inductor's pool of compiling
    processes, if this worker started one, is shut down, and multiprocessing's finalizers run
    (without them, its semaphores were reported as leaked when korch exited)."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    shutdown = getattr(async_compile, "shutdown_compile_workers", None)
    if shutdown is not None:
        shutdown()
    mp_util._exit_function()  # (multiprocessing's part of the teardown)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@dataclass
class _Worker:
    proc: mp.process.BaseProcess
    conn: object
    spawned: float
    ready: bool = False  # its imports are done
    job: dict | None = None
    started: float = 0.0  # when the job's clock started: when both it and the worker were ready


class WorkerPool:
    """`size` worker processes of `threads` threads each, running `run(job) -> result` (a
    module-level function, so that a spawned worker can import it). A worker that dies or
    overruns is replaced and its job recorded as failed, a failure of the machine ("environmental":
    korch.profile.database profiles it again later); one found dead when handed a job is replaced, and
    the job goes to the next worker."""

    def __init__(self, size: int, threads: int, run: Callable[[dict], dict]):
        self.ctx = mp.get_context("spawn")
        self.size, self.threads, self.run_job = size, threads, run
        self.workers: list[_Worker] = []
        self.lost_starting = 0  # workers lost before they were ready
        self.unsent = 0  # jobs in a row that could not be sent: their workers were dead
        self.ever_ready = False

    def _spawn(self) -> _Worker:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(child, self.threads, self.run_job), daemon=True)
        start_process(proc)
        child.close()
        return _Worker(proc, parent, spawned=time.time())

    def start(self) -> None:
        """Spawn every worker now rather than at the first run: their imports overlap other work."""
        while len(self.workers) < self.size:
            self.workers.append(self._spawn())

    def run(self, jobs, timeout: float, on_result, stop_at: float | None = None) -> list:
        """Run every job, calling on_result(job, result) as each finishes. Past `stop_at` (a
        time.time()) no job starts: the jobs running finish, and those never started are
        returned, in order."""
        pending, left = list(jobs), []
        pending.reverse()
        while len(self.workers) < min(self.size, len(pending)):
            self.workers.append(self._spawn())
        while pending or any(w.job is not None for w in self.workers):
            if pending and stop_at is not None and time.time() > stop_at:
                left, pending = pending[::-1], []
            for i in range(len(self.workers)):
                while self.workers[i].job is None and pending:
                    self._hand_over(i, pending)
            busy = [w for w in self.workers if w.job is not None]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=1.0)
            for i, w in enumerate(self.workers):
                if w.job is not None and not self._receive(w, ready, on_result):
                    self._check(i, w, ready, timeout, on_result)
        return left

    def _hand_over(self, i: int, pending: list) -> None:
        """Send worker i the next job (a worker still starting reads it once ready). A worker that
        died before it (killed while idle, as by the OOM killer between chunks, or dead while
        starting) cannot take it: the send fails, the worker is replaced, and the job, which
        never ran, waits for the next one; nothing is recorded about it."""
        w, job = self.workers[i], pending.pop()
        try:
            w.conn.send(job)
        except OSError:  # (BrokenPipeError, ConnectionResetError: its end of the pipe is closed)
            pending.append(job)
            w.proc.join(timeout=1.0)  # (dead, or about to be: its end of the pipe is closed)
            self.unsent += 1
            self._replace(i, w, f"worker died (exit code {w.proc.exitcode})")
            return
        w.job, w.started, self.unsent = job, time.time(), 0

    def _receive(self, w: _Worker, ready, on_result) -> bool:
        """Whether w sent something: that it is ready (its job's clock starts) or a result."""
        if w.conn not in ready:
            return False
        try:
            message = w.conn.recv() if w.conn.poll() else None
        except (EOFError, OSError):
            return False  # the worker died mid-message: _check sees it
        if message == _READY:
            w.ready, w.started, self.ever_ready = True, time.time(), True
        elif message is not None:
            job, w.job = w.job, None
            on_result(job, message)
        return message is not None

    def _check(self, i: int, w: _Worker, ready, timeout: float, on_result) -> None:
        """Replace w if it died or overran, recording its job as failed. A worker lost before it
        was ready says nothing about its job (the result is marked "startup", and not stored);
        when no worker ever starts, a one-line error ends the run instead of every kernel
        "failing"."""
        now = time.time()
        if w.proc.sentinel in ready:
            w.proc.join()
            reason = f"worker died (exit code {w.proc.exitcode})"
        elif w.ready and now - w.started > timeout:
            reason = f"timed out after {timeout:.0f}s"
        elif not w.ready and now - w.spawned > STARTUP_S:
            reason = f"worker not ready after {STARTUP_S:.0f}s"
        else:
            return
        # the machine's failure, not the kernel's: a later run profiles it again (korch.profile.database)
        outcome = {"status": "failed", "reason": reason, "environmental": True}
        if not w.ready:
            outcome["startup"] = True
        job = w.job
        self._replace(i, w, reason)
        on_result(job, outcome)

    def _replace(self, i: int, w: _Worker, reason: str) -> None:
        """A fresh worker in w's place. When workers are lost while starting and none ever got
        ready (or, after some did, the last few died before they could take a job), a one-line
        error ends the run instead of every kernel "failing", or of a run that never ends."""
        w.proc.kill()
        w.proc.join()
        if not w.ready:
            self.lost_starting += 1
            never = not self.ever_ready and self.lost_starting >= STARTUP_FAILURES
            if never or self.unsent >= STARTUP_FAILURES:
                raise KorchError(f"profiling workers cannot start: {reason} (their messages are above)")
        self.workers[i] = self._spawn()

    def close(self) -> None:
        """Idle workers are asked to leave. A worker still running a job (the run was
        interrupted) or still importing is killed: it ignores Ctrl-C, and waiting for it would
        keep an interrupted korch running for as long as its job or its imports take."""
        for w in self.workers:  # all asked first, then all waited for: they leave together
            if w.job is not None or not w.ready:
                w.proc.kill()
            with contextlib.suppress(BrokenPipeError, OSError):
                w.conn.send(None)
        for w in self.workers:
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
        self.workers = []


def start_process(proc) -> None:
    """Start a spawned worker without the parent's main script. Spawning would import it again in
    the child, by its path or module name: a script that calls korch.optimize outside `if
    __name__ == "__main__":` would start korch again in every worker, which Python stops (every
    worker died before its first job, and every kernel "failed"); one read from standard input
    (`python - < script.py`) has no file to import; and a guarded script's own imports (a
    transformers model's, seconds) would slow every worker's start. Workers run korch's
    functions on plain data and need nothing from it."""
    main = sys.modules.get("__main__")
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    if "__file__" in saved:
        del main.__file__
    if "__spec__" in saved:
        main.__spec__ = None  # (multiprocessing reads it unguarded)
    try:
        with _sigint_ignored():
            proc.start()
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


@contextlib.contextmanager
def _sigint_ignored():
    """A child started while Ctrl-C is ignored ignores it too (an ignored signal stays ignored
    across exec, and Python then installs no KeyboardInterrupt handler): so a worker ignores it
    from its first instruction, through the imports it does before _serve runs. A Ctrl-C in the
    milliseconds of the start itself is lost. Only the main thread may change signal handlers,
    and a handler installed outside Python (getsignal says None) could not be put back."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
