"""The runtime: compiles a plan's kernels once (identical kernels share one compilation, unless
their backend bakes in different weights) and runs them in order on device tensors, releasing
each buffer after its last reader."""

from __future__ import annotations

import functools
import logging
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

from korch.backends import all_backends, compile_with
from korch.config import WAKE_CALLS
from korch.errors import KorchError, first_line
from korch.ir.prims import BFLOAT16
from korch.ir.reference import mismatch
from korch.ir.tensors import DTYPES, as_tensor, to_numpy, to_tensor
from korch.measure import busy
from korch.measure.heap import keep_heap
from korch.measure.timing import (
    device_intervals,
    elapsed_ms,
    hold_for,
    queued_ms,
    repeat,
    rest,
    warm_up,
)

log = logging.getLogger("korch")


class Executable:
    def __init__(self, plan):
        self.plan = plan
        device = plan.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise KorchError(f"this plan was built for {device}, and no CUDA device is available here")
        keep_heap()  # the buffers of one call stay in the process for the next (korch.measure.heap)
        backends = all_backends()
        compiled: dict[tuple, object] = {}
        # C order: a weight the import transposed (Gemm's transB) is a Fortran-order view, and a
        # kernel compiled for dense inputs would copy it in every call (a large classifier's
        # weight: a sizeable share of the plan's time)
        self.weights = {v: to_tensor(a, device) for v, a in plan.weights.items()}
        self._weight_storages = frozenset(_storage(w) for w in self.weights.values())
        # each kernel's arguments with the weights in place once, here: a call fills in only the
        # values computed at run time (a source model run whole reads every weight of the model)
        self.steps = []
        self.launches = 0  # device kernels per call, as far as the backends know (CompiledKernel.kernels)
        lanes = []  # each kernel's numpy form (CompiledKernel.arrays), None where it has none
        for k in plan.kernels:
            if k.backend not in backends:
                raise KorchError(f"the plan needs backend {k.backend!r}, which this korch does not have")
            backend = backends[k.backend]
            reads = [(n, v) for n, v in zip(k.spec.graph.inputs, k.spec.inputs) if v in plan.weights]
            # a backend that bakes weights in compiles once per set of weights
            ident = (k.spec.key, k.backend, tuple(reads) if backend.bakes_weights else ())
            if ident not in compiled:
                weights = {n: plan.weights[v] for n, v in reads}
                compiled[ident] = compile_with(backend, k.spec, device, weights)
            ins = k.spec.inputs
            self.launches += compiled[ident].kernels
            lanes.append(compiled[ident].arrays)
            self.steps.append(
                (
                    compiled[ident].fn,
                    [self.weights.get(v) for v in ins],
                    [(i, v) for i, v in enumerate(ins) if v not in self.weights],
                    k.spec.outputs,
                    [v for v in k.free_after if v not in self.weights],  # (weights are not a run's values)
                )
            )
        self.index_limits = plan.meta.index_limits
        self.input_names = [n for n, _ in plan.inputs]
        self.input_types = dict(plan.inputs)
        # (shape, dtype) of each input as torch states them: feeds compares, per call, without converting
        self._wants = {n: (torch.Size(t.shape), DTYPES[t.dtype]) for n, t in plan.inputs}
        self._device = torch.device(device)
        self._outputs_fresh = _outputs_fresh(plan, backends)
        self._cuda_graph = None  # (graph, static inputs, static outputs) once captured; False: cannot
        # a plan whose every kernel runs on numpy arrays (ONNX Runtime on a CPU, a source model run
        # whole the common case) runs a numpy caller's arrays as they are: converting each value to
        # a tensor and back cost more a call than a small session takes
        self._array_steps = None
        if device == "cpu" and self._outputs_fresh and all(lanes):
            self._array_steps = [
                (arrays, [None if w is None else to_numpy(w) for w in args], *rest)
                for arrays, (_, args, *rest) in zip(lanes, self.steps)
            ]
            self._array_wants = {n: (tuple(t.shape), np.dtype(t.dtype)) for n, t in plan.inputs}

    def run_tensors(self, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The plan's outputs. On CUDA the kernel sequence is captured once as a CUDA graph and
        replayed (one launch for the whole plan); the outputs then live in the graph's static
        buffers, overwritten by the next call (`__call__` copies them out)."""
        if self.plan.device.startswith("cuda"):
            if self._cuda_graph is None:
                self._cuda_graph = self._capture(feeds)
            if self._cuda_graph:
                graph, static_in, static_out = self._cuda_graph
                for name, tensor in feeds.items():
                    static_in[name].copy_(tensor)
                graph.replay()
                return static_out
        return self._run(feeds)

    @property
    def captured(self) -> bool | None:
        """Whether the plan runs as one CUDA graph (None: not on CUDA, or not called yet)."""
        return None if self._cuda_graph is None else bool(self._cuda_graph)

    def run_owned(self, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """run_tensors' outputs, each the caller's own: copied out of a CUDA graph's static
        buffers, which the next call overwrites."""
        outs = self.run_tensors(feeds)
        return [o.clone() for o in outs] if self._cuda_graph else outs

    def _capture(self, feeds: dict[str, torch.Tensor]):
        """(graph, static inputs, static outputs), or False when some kernel cannot be captured
        (an ONNX Runtime session, say) or the capture recorded no kernel (torch only warns "The
        CUDA Graph is empty", and a replay would do nothing): the plan then runs kernel by kernel."""
        static_in = {name: t.clone() for name, t in feeds.items()}
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph: lazy initialisation, autotuning
                    self._run(static_in)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with torch.cuda.graph(graph):
                    static_out = self._run(static_in)
            empty = [w for w in caught if "CUDA Graph is empty" in str(w.message)]
            for w in caught:  # (the others as they came)
                if w not in empty:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            if empty:
                raise RuntimeError("the CUDA graph is empty: no kernel of the plan was captured")
            return graph, static_in, static_out
        except Exception as e:
            line = first_line(e, 160)
            log.warning("korch: warning: CUDA graph capture failed (%s); running kernel by kernel", line)
            return False

    def _run(self, feeds: dict, mark: Callable[[], None] | None = None, steps=None) -> list:
        """Every kernel in order (`steps`: self.steps, on tensors, or self._array_steps, on
        arrays); `mark` is called before the first kernel and after each."""
        env = dict(feeds)
        if mark is not None:
            mark()
        for fn, args, computed, outs, free in steps or self.steps:
            args = list(args)
            for i, v in computed:
                args[i] = env[v]
            env.update(zip(outs, fn(*args)))
            if mark is not None:
                mark()
            for v in free:
                env.pop(v, None)
        outs = [env[v] if v in env else self.weights[v] for v, _ in self.plan.outputs]
        return self._own_outputs(outs, feeds)

    def _own_outputs(self, outs: list[torch.Tensor], feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The outputs, each in memory of its own, as ONNX Runtime returns them: an output that is a
        weight, the caller's input, an output already returned, or a view of one of these (a
        reshape kernel may return its input's memory) is copied, or the caller's writes to it
        would change the plan's weights, the caller's input, or another output. A kernel's fresh
        buffer, the common case, is returned as it is (without a look when every output is one)."""
        if self._outputs_fresh:
            return outs
        taken = {_storage(t) for t in feeds.values()}
        owned = []
        for out in outs:
            memory = _storage(out)
            if memory in taken or memory in self._weight_storages:
                out = out.clone()
                memory = _storage(out)
            taken.add(memory)
            owned.append(out)
        return owned

    def time_steps(self, feeds: dict[str, torch.Tensor], repeats: int = 5, spread_s: float = 0.0):
        """(median ms, minimum ms) of the whole plan and the median ms of each kernel in place (in
        plan order, with the caches and thread pools as the kernels before it left them): what the
        cost model's sum of isolated timings is checked against. The runs are spread over at least
        `spread_s` seconds, so a burst of interference cannot slow all of them. On CUDA the whole
        plan is timed as a caller runs it (its CUDA graph replayed, synchronised) and each kernel
        by the device's time in a kernel-by-kernel run, the host's launch overhead hidden as it is
        in the replay (the profiler's isolated timings are taken the same way). A plan that runs
        on arrays is timed on them (as `caller` runs it)."""
        device = self.plan.device
        cuda = device.startswith("cuda")
        steps = self._array_steps
        if steps is not None:
            feeds = {name: to_numpy(t) for name, t in feeds.items()}
        if cuda:  # warm-up (lazy initialisation, autotuning), then how long the host takes to queue the plan
            warm_up(lambda: self._run(feeds), device, calls=1)
            hold_ms = hold_for(queued_ms(lambda: self._run(feeds), device)[0])
        else:
            busy.settle()  # the thread pools of what ran before go idle
        totals, per_run = [], []
        for i in range(repeats + 1):  # the first run warms up
            if i > 1 and spread_s > 0:  # thread pools and clocks wake up after the pause
                rest(spread_s / (repeats - 1), lambda: self._run(feeds, steps=steps), device)
            if cuda:
                totals.append(elapsed_ms(lambda: self.run_tensors(feeds), device))
                per_run.append(self._device_steps(feeds, hold_ms))
            else:
                stamps: list[float] = []
                self._run(feeds, lambda: stamps.append(time.perf_counter()), steps)  # noqa: B023 (called here)
                totals.append((stamps[-1] - stamps[0]) * 1e3)
                per_run.append([(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])])
        per_step = [statistics.median(t) for t in zip(*per_run[1:])]
        return statistics.median(totals[1:]), min(totals[1:]), per_step

    def _device_steps(self, feeds: dict[str, torch.Tensor], hold_ms: float) -> list[float]:
        """Each kernel's milliseconds on the CUDA device in one kernel-by-kernel run: the stream
        held (backends.device_intervals) while the host queues the plan kernel by kernel."""
        return device_intervals(self.plan.device, hold_ms, lambda mark: self._run(feeds, mark))

    def run_arrays(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The plan's outputs, each new memory, for feeds that array_feeds returned (and checked:
        nothing is checked here)."""
        return self._run(feeds, steps=self._array_steps)

    def caller(self, feeds: dict[str, np.ndarray]) -> Callable[[], list]:
        """The plan called as its caller calls it, `plan(**values)`, on a CPU with these numpy
        arrays, on CUDA with tensors already on the device (as the torch peers are called): the
        inputs checked and converted, and the outputs handed over, in every call. What the bench
        and optimize's runoff time, so that what they compare is what a caller pays."""
        values = self.feeds((), feeds) if self._device.type == "cuda" else feeds
        return lambda: self(**values)

    def array_feeds(self, inputs, named) -> dict[str, np.ndarray] | None:
        """The caller's numpy arrays as run_arrays takes them, or None where the plan does not run
        on arrays (a kernel that is not ONNX Runtime on a CPU) or some value is not the plan's
        shape and dtype in this machine's byte order: `feeds` converts it then, or says why not
        (ONNX Runtime would read a big-endian array's bytes as they are)."""
        if self._array_steps is None:
            return None
        given = self._given(inputs, named)
        for name, value in given.items():
            # (exactly an ndarray: a masked array's min and max skip the masked values it holds)
            if type(value) is not np.ndarray or (value.shape, value.dtype) != self._array_wants[name]:
                return None
            if name in self.index_limits:
                _check_indices(name, value, self.index_limits[name])
        return given

    def _given(self, inputs, named) -> dict:
        """The caller's values by input name, all of them and no others."""
        if len(inputs) > len(self.input_names):
            raise KorchError(f"the plan takes {len(self.input_names)} inputs, got {len(inputs)}")
        given = dict(zip(self.input_names, inputs))
        given.update(named)
        missing = [n for n in self.input_names if n not in given]
        unknown = [n for n in given if n not in self.input_types]
        if missing or unknown:
            raise KorchError(f"inputs do not match the plan: {mismatch(missing, unknown)}")
        return given

    def feeds(self, inputs, named) -> dict[str, torch.Tensor]:
        feeds = {}
        for name, value in self._given(inputs, named).items():
            t = self.input_types[name]
            tensor = _as_tensor(name, value, t)
            if (tensor.shape, tensor.dtype) != self._wants[name]:
                dtype = str(tensor.dtype).removeprefix("torch.")
                raise KorchError(
                    f"input {name!r} is {dtype}{list(tensor.shape)}, the plan wants {t.dtype}{list(t.shape)}"
                )
            if name in self.index_limits:
                _check_indices(name, tensor, self.index_limits[name])
            feeds[name] = tensor if tensor.device == self._device else tensor.to(self._device)
        return feeds

    def __call__(self, *inputs, **named):
        """Numpy arrays in, numpy arrays out; torch tensors in, torch tensors out."""
        as_numpy = not any(isinstance(x, torch.Tensor) for x in (*inputs, *named.values()))
        if as_numpy:
            arrays = self.array_feeds(inputs, named)
            if arrays is not None:
                return self.run_arrays(arrays)
        outs = self.run_owned(self.feeds(inputs, named))
        return [to_numpy(o) for o in outs] if as_numpy else outs

    def run_numpy(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self(**feeds)
        return {name: out for (_, name), out in zip(self.plan.outputs, outs)}


def _storage(tensor: torch.Tensor) -> int:
    """Where the memory under a tensor begins: views of one buffer share it."""
    return tensor.untyped_storage().data_ptr()


def _as_tensor(name: str, value, want) -> torch.Tensor:
    """The caller's value as a tensor (sharing an array's memory), or a one-line KorchError naming
    the input when it is not one (None, a string, a dict, a ragged list, an array of objects)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and (value.dtype == BFLOAT16 or value.dtype.kind in "biuf"):
        if not _shareable(value):  # a copy in native byte order, C order, writable
            value = np.array(value, dtype=value.dtype.newbyteorder("="), order="C")
        return as_tensor(value)
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as e:
        if value is None:
            what = "None"
        elif isinstance(value, np.ndarray):
            what = f"a numpy array of {value.dtype}"
        else:
            what = f"a {type(value).__name__}"
        why = f" ({first_line(e, 80)})" if isinstance(value, list | tuple) else ""
        raise KorchError(
            f"input {name!r} is {what}{why}, not an array: the plan wants {want.dtype}{list(want.shape)}"
        ) from None


def _shareable(array: np.ndarray) -> bool:
    """Whether a tensor can share the array's memory: torch takes no negative strides (x[::-1])
    and no other byte order, and a read-only array would be one the plan's tensors may not write."""
    return array.flags.writeable and array.dtype.isnative and min(array.strides, default=0) >= 0


def _outputs_fresh(plan, backends) -> bool:
    """Whether every output of a run is certain to be a buffer of its own: each is computed by a
    kernel whose backend always returns new memory (backend.fresh_outputs), and none is a weight,
    an input, or the same value as another output."""
    made_by = {v: k.backend for k in plan.kernels for v in k.spec.outputs}
    outs = [v for v, _ in plan.outputs]
    return len(set(outs)) == len(outs) and all(
        v in made_by and backends[made_by[v]].fresh_outputs for v in outs
    )


def _check_indices(name: str, values: torch.Tensor | np.ndarray, limit: int) -> None:
    """An index outside the table it indexes is the caller's mistake: say so here, before a
    kernel fails on it with an assertion from deep inside a backend (or reads out of bounds)."""
    if isinstance(values, np.ndarray):
        bounds = (values.min(), values.max()) if values.size else None
    else:
        bounds = torch.aminmax(values) if values.numel() else None
    if bounds is None:
        return
    low, high = (int(x) for x in bounds)
    if low < -limit or high >= limit:
        raise KorchError(
            f"input {name!r} indexes a dimension of size {limit}: its values must be in "
            f"[{-limit}, {limit}), got {low}..{high}"
        )


def interleave(
    systems: dict[str, Callable],
    rounds: int,
    block_s: float,
    device: str,
    pause_s=0.02,
    round_pause_s=0.0,
    between: Callable[[], None] | None = None,
):
    """Milliseconds of each call of each system, timed side by side (name -> one list per round):
    `rounds` rounds, in each a block of at least block_s seconds (and 3 timed calls) per system;
    `between` called before the first round and after each."""
    samples: dict[str, list[list[float]]] = {name: [[] for _ in range(rounds)] for name in systems}
    order = list(systems.items())
    if between is not None:
        between()
    for r in range(rounds):
        if r:
            time.sleep(round_pause_s)
        # interleaved blocks (A B C, then C B A, ...), so drift on a shared machine hits every
        # system alike and no system always follows the same one; before each block a pause, and
        # then a wait until the previous block's thread pools stop spinning (busy.settle: ONNX
        # Runtime's spin on after a call); the first calls of each block are dropped
        # (WAKE_CALLS): they pay for waking thread pools, which says more about the switch than
        # about the system
        for name, fn in order if r % 2 == 0 else order[::-1]:
            time.sleep(pause_s)
            busy.settle()
            timed = repeat(functools.partial(elapsed_ms, fn, device), block_s, at_least=WAKE_CALLS + 3)
            samples[name][r] = timed[WAKE_CALLS:]
        if between is not None:
            between()
    return samples


def measure_in_place(plan, repeats: int = 5, spread_s: float = 0.0) -> dict:
    """The plan run as a whole, each kernel timed where it runs: the check on the cost model (the
    sum of kernels timed alone, warm) that `korch optimize` and `korch explain` report."""
    exe = plan.executable()
    feeds = exe.feeds((), plan.random_inputs())
    # once more when other processes took the CPU (on CUDA, device time: not stretched by them)
    retries = 0 if plan.device.startswith("cuda") else 1
    (total, fastest, steps), _, disturbed = busy.quietest(
        lambda: exe.time_steps(feeds, repeats, spread_s), retries, key=lambda t: t[1]
    )
    return {
        "ms": round(total, 6),
        "min_ms": round(fastest, 6),
        "kernels_ms": [round(t, 6) for t in steps],
        "predicted_over_measured": round(plan.predicted_ms / total, 4) if total else None,
        "disturbed": disturbed,  # (in every run)
    }
