"""The inductor-autotune backend: frozen Inductor kernels whose matmuls and convolutions are
autotuned against Inductor's GEMM templates, checked against the reference executor."""

import pytest
import torch
from helpers import rand
from test_inductor_frozen import check_a_plan_of_one_backend, conv_relu_model, matmul_bias_model, whole_spec

from korch.backends import compile_with, get_backends
from korch.backends.inductor import InductorAutotuneBackend
from korch.config import AUTOTUNE_LINEAR
from korch.ir import reference
from korch.ir.graph import GraphBuilder
from korch.ir.prims import Prim
from korch.ir.tensor_type import TensorType
from korch.ir.tensors import to_tensor
from korch.profile.jobs import check_kernel
from korch.search.kernel import KernelSpec

AUTOTUNE = InductorAutotuneBackend()


def chain(matmuls: int) -> KernelSpec:
    """x[16, 32] through `matmuls` matmuls by 32x32 weights, each followed by a tanh (none: a tanh)."""
    b = GraphBuilder()
    x = b.input("in0", TensorType((16, 32), "float32"))
    ws = [b.input(f"in{i + 1}", TensorType((32, 32), "float32")) for i in range(matmuls)]
    y = x
    for w in ws:
        (y,) = b.emit(Prim.MATMUL, [y, w])
        (y,) = b.emit(Prim.TANH, [y])
    if not matmuls:
        (y,) = b.emit(Prim.TANH, [y])
    graph = b.build([y], ["out0"], name=f"chain{matmuls}")
    return KernelSpec(graph.name, graph, graph.inputs, graph.outputs, weights=tuple(range(1, matmuls + 1)))


def compiled_checked(spec: KernelSpec, inputs, weights, device: str = "cpu"):
    compiled = compile_with(AUTOTUNE, spec, device, weights)
    outs = compiled.fn(*[to_tensor(x, device) for x in inputs])
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, inputs)))
    assert check_kernel(outs, want, spec.graph) is None
    return compiled


def test_takes_only_candidates_with_a_few_linear_primitives_one_tunable():
    untuned = "no matmul (on CUDA, convolution) for Inductor's templates to tune"
    over = f"over {AUTOTUNE_LINEAR} linear primitives (each is autotuned in its compile)"
    assert AUTOTUNE.supports(chain(0), "cpu") == untuned  # nothing to tune
    assert AUTOTUNE.supports(chain(1), "cpu") is None
    assert AUTOTUNE.supports(chain(AUTOTUNE_LINEAR), "cpu") is None
    assert AUTOTUNE.supports(chain(AUTOTUNE_LINEAR + 1), "cpu") == over  # a whole model's worth
    # an activation times an activation: templates apply, there is no weight to freeze
    activations = chain(1)
    spec = KernelSpec("k", activations.graph, activations.inputs, activations.outputs, weights=())
    assert AUTOTUNE.supports(spec, "cpu") is None
    # a convolution: a oneDNN call on a CPU in any mode, a Triton template's on CUDA
    conv, _, _ = whole_spec(*conv_relu_model())
    assert AUTOTUNE.supports(conv, "cpu") == untuned
    assert AUTOTUNE.supports(conv, "cuda") is None


def test_matches_the_reference():
    spec, inputs, weights = whole_spec(*matmul_bias_model())
    assert AUTOTUNE.supports(spec, "cpu") is None
    compiled_checked(spec, inputs, weights)


def test_an_activation_matmul_with_no_weight_matches_the_reference():
    two = chain(2)
    spec = KernelSpec("k", two.graph, two.inputs, two.outputs, weights=())
    inputs = [rand(16, 32), rand(32, 32, seed=1) * 0.2, rand(32, 32, seed=2) * 0.2]
    compiled_checked(spec, inputs, {})


def test_compiles_with_gemm_autotuning_where_the_frozen_backend_does_not(monkeypatch):
    """Inductor's GEMM autotuning is on while it compiles (and not left on after), off for inductor-frozen."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config

    seen, inner = [], compile_fx.compile_fx_inner

    def recording(*args, **kwargs):
        seen.append(config.max_autotune_gemm)
        return inner(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", recording)
    spec, inputs, weights = whole_spec(*matmul_bias_model(seed=3))
    compiled_checked(spec, inputs, weights)
    assert seen and all(seen) and not config.max_autotune_gemm
    seen.clear()
    (frozen,) = get_backends(["inductor-frozen"])
    compile_with(frozen, spec, "cpu", weights)
    assert seen and not any(seen)


def test_its_profiles_are_apart_and_it_is_compiled_where_it_is_timed():
    inductor, frozen, autotune = get_backends(["inductor", "inductor-frozen", "inductor-autotune"])
    assert len({inductor.version(), frozen.version(), autotune.version()}) == 3
    assert autotune.bakes_weights and autotune.compiles_again("cpu") and autotune.compiles_again("cuda")
    assert "inductor-autotune" in [b.name for b in get_backends(device="cuda")]
    assert "inductor-autotune" not in [b.name for b in get_backends(device="cpu")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("make", [conv_relu_model, matmul_bias_model])
def test_matches_the_reference_on_cuda(make):
    spec, inputs, weights = whole_spec(*make())
    compiled_checked(spec, inputs, weights, "cuda")


@pytest.mark.e2e
def test_a_plan_of_autotuned_kernels_runs_after_save_and_load(tmp_path):
    check_a_plan_of_one_backend(matmul_bias_model, "inductor-autotune", 60, tmp_path)
