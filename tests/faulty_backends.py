"""Backends that misbehave on purpose (or report on their worker), imported by profiling workers
in tests."""

import os
import signal
import time

import torch

from korch.backends import Backend, CompiledKernel


class _Faulty(Backend):
    selectable = False

    def version(self) -> str:
        return "test-1"

    def supports(self, spec, device):
        return None


class SegfaultBackend(_Faulty):
    name = "segfault"

    def compile(self, spec, device):
        os.kill(os.getpid(), signal.SIGSEGV)


class HangBackend(_Faulty):
    name = "hang"

    def compile(self, spec, device):
        time.sleep(3600)


class WrongBackend(_Faulty):
    name = "wrong"

    def compile(self, spec, device):
        types = [spec.graph.types[v] for v in spec.graph.outputs]

        def fn(*inputs):
            return [torch.full(t.shape, 3.0) for t in types]

        return CompiledKernel(fn)


class RaiseBackend(_Faulty):
    name = "raise"

    def compile(self, spec, device):
        raise RuntimeError("no kernel for you")


class TorchKernels(_Faulty):
    """Correct kernels (torch ops), for subclasses that misbehave around them."""

    def compile(self, spec, device):
        from korch.backends.torch_ops import graph_function

        return CompiledKernel(graph_function(spec.graph, device))


class CompileThreadsBackend(TorchKernels):
    """Correct kernels (torch ops) that note Inductor's compile threads during each compile, a line
    "key threads" in the file $KORCH_TEST_THREADS_LOG: what the profiling worker gave the job."""

    name = "compile-threads"

    def threads(self) -> int:
        from torch._inductor import config

        return config.compile_threads

    def compile(self, spec, device):
        with open(os.environ["KORCH_TEST_THREADS_LOG"], "a") as log:
            log.write(f"{spec.key} {self.threads()}\n")
        return super().compile(spec, device)


class KernelThreadsBackend(CompileThreadsBackend):
    """The same with torch's intra-op threads: what a kernel compiled there specializes on."""

    name = "kernel-threads"

    def threads(self) -> int:
        import torch

        return torch.get_num_threads()


class SlowBackend(TorchKernels):
    """Correct kernels (torch ops) that take a second each to compile."""

    name = "slow"

    def compile(self, spec, device):
        time.sleep(1.0)
        return super().compile(spec, device)


class SlowFirstBackend(TorchKernels):
    """Correct kernels (torch ops) whose first compile of a key takes a second and later ones
    (another process's, as a warm compiler cache would) nothing: a marker file per key in
    $KORCH_TEST_COMPILED_DIR."""

    name = "slow-first"

    def compile(self, spec, device):
        marker = os.path.join(os.environ["KORCH_TEST_COMPILED_DIR"], spec.key)
        if not os.path.exists(marker):
            time.sleep(1.0)
            open(marker, "w").close()
        return super().compile(spec, device)


class UncachedBackend(CompileThreadsBackend):
    """Correct kernels whose compiles no cache shares between processes (Backend.compiles_again):
    each compile is a line "key pid" in $KORCH_TEST_THREADS_LOG."""

    name = "uncached"

    def compiles_again(self, device) -> bool:
        return True

    def threads(self) -> int:
        return os.getpid()


class WrongUncachedBackend(WrongBackend):
    """Wrong kernels whose compiles no cache shares: the check must still catch them."""

    name = "wrong-uncached"

    def compiles_again(self, device) -> bool:
        return True


class LoggedCompilesBackend(TorchKernels):
    """Correct kernels whose first compile of a key takes 0.2 s (later ones, as from a warm cache,
    nothing: a marker per key in $KORCH_TEST_COMPILED_DIR); each compile is a line "pid start end"
    in $KORCH_TEST_THREADS_LOG."""

    name = "logged"

    def compile(self, spec, device):
        start = time.time()
        marker = os.path.join(os.environ["KORCH_TEST_COMPILED_DIR"], spec.key)
        if not os.path.exists(marker):
            time.sleep(0.2)
            open(marker, "w").close()
        kernel = super().compile(spec, device)
        with open(os.environ["KORCH_TEST_THREADS_LOG"], "a") as log:
            log.write(f"{os.getpid()} {start} {time.time()}\n")
        return kernel
