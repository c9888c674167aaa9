"""The Inductor backends: a candidate traced to an aten graph and compiled by PyTorch Inductor
(C++/OpenMP on CPU, Triton on CUDA), its weights as inputs ("inductor"), compiled in as constants
("inductor-frozen"), or compiled in with Inductor's GEMM (and on CUDA convolution) templates tried
against the vendor libraries ("inductor-autotune")."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator

import torch

from korch.backends import (
    Backend,
    CompiledKernel,
    Weights,
    onnx_patterns,
    onnx_view,
    source_digest,
    torch_ops,
)
from korch.backends.torch_ops import graph_function
from korch.config import AUTOTUNE_LINEAR, CPP_WRAPPER_FROM
from korch.ir.graph import Graph
from korch.ir.prims import Kind, Prim
from korch.ir.tensors import to_tensor
from korch.measure.device import example_tensors
from korch.search.kernel import KernelSpec

_DEFINITION = re.compile(r"^(\w+) = async_compile\.\w+\(", re.M)
_CPP_KERNEL = re.compile(r'^extern "C"\s+void\s+(\w+)\(', re.M)
# library calls of the C++ wrapper: an aten operator's CPU shim, or one run through the proxy executor
_CPP_LIBRARY_CALL = re.compile(r"\baoti_torch_cpu_\w+\(|\baoti_torch_proxy_executor_call_function\(")


def count_launches(source: str) -> int:
    """Kernel launches per call in Inductor's generated wrapper: its own kernels (C++ or Triton)
    and library calls such as extern_kernels.mm (in a C++ wrapper, an aten operator's shim such as
    aoti_torch_cpu_mkldnn__convolution_pointwise). At least 1."""
    if "void inductor_entry_impl(" in source:  # (the C++ wrapper: the calls of its entry function)
        body = source.split("void inductor_entry_impl(", 1)[1].split("} // inductor_entry_impl", 1)[0]
        launches = sum(len(re.findall(rf"\b{name}\(", body)) for name in set(_CPP_KERNEL.findall(source)))
        return max(launches + len(_CPP_LIBRARY_CALL.findall(body)), 1)
    body = source.split("def call(", 1)[-1]
    launches = sum(len(re.findall(rf"\b{name}(\.run)?\(", body)) for name in _DEFINITION.findall(source))
    launches += len(re.findall(r"\bextern_kernels\.\w+\(", body))
    # (not the op names quoted in its size and stride checks)
    launches += len(re.findall(r"(?<!['\"])\btorch\.ops\.\w+\.\w+", body))
    return max(launches, 1)


@contextlib.contextmanager
def outside_dynamo() -> Iterator[None]:
    """Dynamo calls a torch.compile backend inside its tracing context, whose fake-tensor mode
    (with symbolic shapes) make_fx, torch.export and Inductor adopt. korch's own tracing
    (torch.export of a graph, make_fx and compile_fx of each Inductor kernel) must run on
    korch's real tensors, as it does outside torch.compile, so both are set aside."""
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with tracing(None), unset_fake_temporarily():
        yield


@contextlib.contextmanager
def static_shapes(inputs: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Fake copies of `inputs` with fixed sizes, in a tracing context whose fake-tensor mode has a
    shape environment, for compile_fx. Inductor's caches on disk (the FX graph cache, AOT
    autograd's) need that environment: without it they were bypassed, so every compile of the
    same kernel lowered it and generated its code again, paid by the compile worker, the timing
    worker and the plan measured in place (a cache hit skips both). The sizes stay constants, so
    the code is the same as compiled from real inputs."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    with tracing(TracingContext(mode)):
        yield [mode.from_tensor(x, static_shapes=True) for x in inputs]


def _epilogue_forms(gm: torch.fx.GraphModule) -> None:
    """The traced graph rewritten into the forms Inductor's freezing passes match, computing the
    same values: a broadcast whose only readers are elementwise ops with an operand of its full
    shape is dropped (they broadcast it themselves: a conv's bias added after it is then folded
    into the conv), and max(x, 0) becomes relu (a oneDNN post-op of the conv or matmul before it)."""
    aten = torch.ops.aten
    binary = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)

    def shape(n) -> tuple | None:
        return tuple(n.meta["val"].shape) if isinstance(n, torch.fx.Node) and "val" in n.meta else None

    def zero(n) -> bool:
        value = getattr(gm, n.target, None) if isinstance(n, torch.fx.Node) and n.op == "get_attr" else None
        return isinstance(value, torch.Tensor) and value.numel() == 1 and not value.any()

    for node in list(gm.graph.nodes):
        if node.target is aten.expand.default:
            readers = list(node.users)
            others = [a for u in readers for a in u.args if a is not node]
            elementwise = all(u.target in binary and len(u.args) == 2 and not u.kwargs for u in readers)
            full = len(others) == len(readers) and all(shape(a) == shape(node) for a in others)
            if readers and elementwise and full:
                node.replace_all_uses_with(node.args[0])
        elif node.target is aten.maximum.default and node.meta["val"].dtype.is_floating_point:
            x, c = node.args if zero(node.args[1]) else node.args[::-1]
            if zero(c) and shape(x) == shape(node) and x.meta["val"].dtype == node.meta["val"].dtype:
                with gm.graph.inserting_before(node):
                    relu = gm.graph.call_function(aten.relu.default, (x,))
                relu.meta.update(node.meta)
                node.replace_all_uses_with(relu)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _compile_graph(
    fn: Callable, examples: list[torch.Tensor], freezing: bool, cpp_wrapper: bool
) -> CompiledKernel:
    """`fn` traced on `examples` and compiled by Inductor; with `freezing`, the tensors `fn` closes
    over are frozen: folded where they meet only each other, prepacked for oneDNN and MKL on CPU.
    With `cpp_wrapper` (korch's larger kernels on CPU: _cpp_wrapper), the code that calls
    Inductor's kernels and the libraries' is C++, not Python. Called outside_dynamo."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch.fx.experimental.proxy_tensor import make_fx

    sources = []

    def inner(*args, **kwargs):  # (a frozen graph's callable wraps what holds the source)
        compiled = compile_fx_inner(*args, **kwargs)
        sources.append(getattr(compiled, "source_code", "") or "")
        return compiled

    settings = contextlib.ExitStack()
    settings.enter_context(config.patch(cpp_wrapper=cpp_wrapper))
    if freezing:  # (Inductor freezes only inference graphs: traced without autograd)
        settings.enter_context(torch.no_grad())
        settings.enter_context(config.patch(freezing=True))
    with settings:
        traced = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)
        if freezing:
            _epilogue_forms(traced)
        with static_shapes(examples) as fakes:
            compiled = compile_fx(traced, fakes, inner_compile=inner)
    source = getattr(compiled, "source_code", "") or "".join(sources)

    def run(*inputs: torch.Tensor) -> list[torch.Tensor]:
        # compiled for dense inputs; another kernel may hand over a strided view
        return list(compiled(*[x if x.is_contiguous() else x.contiguous() for x in inputs]))

    return CompiledKernel(run, count_launches(source))


def _cpp_wrapper(spec: KernelSpec, device: str) -> bool:
    """Whether the kernel calls its kernels from C++ (Inductor's cpp_wrapper): on CPU, from
    CPP_WRAPPER_FROM primitives. A large kernel (a whole graph, a partition) compiled cold took
    less time so, but a small frozen kernel, compiled again whenever it is (see
    InductorFrozenBackend.compile), took longer (BENCHMARKS.md, design constants)."""
    return device == "cpu" and len(spec.graph.nodes) >= CPP_WRAPPER_FROM


class InductorBackend(Backend):
    name = "inductor"

    def version(self) -> str:
        digest = source_digest(sys.modules[__name__], torch_ops, onnx_patterns, onnx_view)
        return f"torch-{torch.__version__}+{digest}+cpp{CPP_WRAPPER_FROM}"  # (the C++ wrapper's size)

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        if any(n.prim is Prim.OPAQUE for n in spec.graph.nodes):
            return "opaque operators run in ONNX Runtime"
        if any(spec.graph.types[v].dtype == "float64" for v in spec.graph.types) and device.startswith(
            "cuda"
        ):
            return "float64 on CUDA"
        return None

    def compile(self, spec: KernelSpec, device: str) -> CompiledKernel:
        with outside_dynamo():  # (korch may be called from inside a Dynamo trace)
            examples = example_tensors(spec.graph, device)
            return _compile_graph(
                graph_function(spec.graph, device),
                examples,
                freezing=False,
                cpp_wrapper=_cpp_wrapper(spec, device),
            )


def weight_derived(graph: Graph, weights: tuple[int, ...]) -> set[str]:
    """The values computed from the weights (the inputs at `weights`) alone, the weights among
    them: what freezing folds at compile time."""
    fixed = set(graph.constants)
    derived = {graph.inputs[i] for i in weights}
    for node in graph.nodes:
        if all(v in fixed or v in derived for v in node.inputs) and any(v in derived for v in node.inputs):
            derived.update(node.outputs)
    return derived


def weight_fed_linear(graph: Graph, weights: tuple[int, ...]) -> bool:
    """Whether a linear primitive has an operand computed from the weights alone, read directly or
    through other primitives (a transpose, a scale): what freezing prepacks."""
    derived = weight_derived(graph, weights)
    return any(node.kind is Kind.LINEAR and not derived.isdisjoint(node.inputs) for node in graph.nodes)


class InductorFrozenBackend(InductorBackend):
    """Inductor with the kernel's weights compiled in as constants (its freezing): on CPU convs and
    matmuls become oneDNN and MKL calls on prepacked weights with their pointwise epilogues fused,
    and anything computed from weights alone is folded at compile time."""

    name = "inductor-frozen"
    bakes_weights = True

    def version(self) -> str:
        return f"{super().version()}+frozen"

    def compiles_again(self, device: str) -> bool:
        return device == "cpu"  # (see compile: oneDNN prepacked weights keep it out of the FX cache)

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        reason = super().supports(spec, device)
        if reason is None and not weight_fed_linear(spec.graph, spec.weights):
            return "no linear primitive reads a weight (freezing changes nothing)"
        return reason

    def compile(self, spec: KernelSpec, device: str, weights: Weights | None = None) -> CompiledKernel:
        """Inductor's FX graph cache keys a frozen weight by its shape, dtype and strides and reads
        its value from the graph being compiled (folding happens before the lookup), so kernels of
        one structure share cached code, each with its own weights. (A graph holding a oneDNN
        prepacked weight, a CPU conv's or matmul's, is not cached: it is lowered again each time.)"""
        graph, weights = spec.graph, weights or {}
        with outside_dynamo():  # (korch may be called from inside a Dynamo trace)
            baked = {i: to_tensor(weights[v], device) for i, v in enumerate(graph.inputs) if v in weights}
            fed = [i for i in range(len(graph.inputs)) if i not in baked]
            run = graph_function(graph, device)

            def closed(*xs: torch.Tensor) -> list[torch.Tensor]:  # the weights: constants of the trace
                args = dict(baked)
                args.update(zip(fed, xs))
                return run(*[args[i] for i in range(len(graph.inputs))])

            examples = example_tensors(graph, device)
            inner = _compile_graph(
                closed, [examples[i] for i in fed], freezing=True, cpp_wrapper=_cpp_wrapper(spec, device)
            )

        # an output folded to a constant is the compiled kernel's own tensor: handed out as a copy,
        # or a caller's write to it would change every later call
        derived = weight_derived(graph, tuple(baked))
        folded = [i for i, v in enumerate(graph.outputs) if v in derived]

        def fn(*inputs: torch.Tensor) -> list[torch.Tensor]:
            outs = inner.fn(*[inputs[i] for i in fed])
            for i in folded:
                outs[i] = outs[i].clone()
            return outs

        return CompiledKernel(fn, inner.kernels)


class InductorAutotuneBackend(InductorFrozenBackend):
    """Inductor frozen, with its GEMM templates (Triton on CUDA, C++ on CPU) and on CUDA its
    convolution templates benchmarked against the vendor library's call for every matmul (and
    convolution) the candidate holds, the fastest kept with the pointwise work around it fused in
    (torch.compile's max-autotune, for GEMMs and convolutions only). Autotuning runs every choice
    on the device, so a kernel is compiled, checked and timed in the profiler's timing worker
    alone, never beside another timing. Only candidates with a few linear primitives
    (AUTOTUNE_LINEAR), one of them tunable: each is autotuned in its compile, which a whole model
    would spend minutes on. Used by default on CUDA; on a CPU the templates rarely beat oneDNN and
    MKL (say `--backends` to add it)."""

    name = "inductor-autotune"
    default_on = ("cuda",)

    def version(self) -> str:
        return f"{super().version()}+autotune"

    def compiles_again(self, device: str) -> bool:
        return True  # (autotuning times its choices on the device: not beside another timing)

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        reason = InductorBackend.supports(self, spec, device)
        if reason is not None:
            return reason
        linear = [node.prim for node in spec.graph.nodes if node.kind is Kind.LINEAR]
        # (a CPU convolution is a oneDNN call whatever the mode: Inductor has no C++ template for it)
        tunable = {Prim.MATMUL, Prim.GROUPED_MATMUL} | ({Prim.CONV} if device.startswith("cuda") else set())
        if tunable.isdisjoint(linear):
            return "no matmul (on CUDA, convolution) for Inductor's templates to tune"
        if len(linear) > AUTOTUNE_LINEAR:
            return f"over {AUTOTUNE_LINEAR} linear primitives (each is autotuned in its compile)"
        return None

    def compile(self, spec: KernelSpec, device: str, weights: Weights | None = None) -> CompiledKernel:
        from torch._inductor import config

        # (the choices' timings are not printed: a profiling run would write a table per GEMM)
        quiet = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
        with config.patch(max_autotune_gemm=True, **{k: v for k, v in quiet.items() if hasattr(config, k)}):
            return super().compile(spec, device, weights)
