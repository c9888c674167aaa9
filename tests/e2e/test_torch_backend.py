"""torch.compile(model, backend="korch"): plans match eager PyTorch; anything korch cannot do runs
eagerly with a warning."""

import warnings

import pytest
import torch
import torch._dynamo
from test_torch_frontend import Block, ConvBN, fast_options, rand

from korch import torch_backend
from korch.measure import check


@pytest.fixture(scope="session")
def torch_cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "torch_profiles.sqlite"


@pytest.fixture
def compiled_graphs(monkeypatch):
    """The plans korch built, one per Dynamo graph it compiled."""
    plans = []
    real = torch_backend.compile_graph

    def spy(gm, example_inputs, opts):
        run = real(gm, example_inputs, opts)
        plans.append(run.plan)
        return run

    monkeypatch.setattr(torch_backend, "compile_graph", spy)
    torch._dynamo.reset()
    yield plans
    torch._dynamo.reset()


def korch_warnings(record) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("korch:")]


def run_compiled(module, x, cache, **options):
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        compiled = torch.compile(module, backend="korch", options={**fast_options(cache), **options})
        got = compiled(x)
    return got, korch_warnings(record)


def test_backend_is_registered():
    assert "korch" in torch._dynamo.list_backends()


@pytest.mark.parametrize("make,shape", [(Block, (2, 5, 16)), (ConvBN, (1, 3, 8, 8))], ids=["block", "convbn"])
def test_compiled_module_matches_eager(make, shape, compiled_graphs, torch_cache):
    module = make().eval()
    x = rand(*shape)
    got, warned = run_compiled(module, x, torch_cache)
    assert warned == [] and len(compiled_graphs) == 1
    with torch.no_grad():
        want = module(x)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    assert check.rel_err(got.numpy(), want.numpy()) <= 1e-4
    assert compiled_graphs[0].meta.fission["source"] == "torch"
    # parameters and buffers are frozen into the plan: the only input is x
    assert [name for name, _ in compiled_graphs[0].inputs] == [compiled_graphs[0].inputs[0][0]]


class LinearRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


def test_inductor_kernels_compile_outside_dynamo(compiled_graphs, torch_cache):
    """The plan's Inductor kernels are traced and compiled in this process while Dynamo is still
    compiling the graph; under Dynamo's fake-tensor mode that failed and the graph ran eagerly.
    Inductor alone, so the plan surely holds one of its kernels."""
    module = LinearRelu().eval()
    x = rand(3, 8)
    got, warned = run_compiled(module, x, torch_cache, backends=("inductor",))
    assert warned == [] and len(compiled_graphs) == 1
    assert "inductor" in {k.backend for k in compiled_graphs[0].kernels}
    with torch.no_grad():
        assert torch.allclose(got, module(x), rtol=1e-5, atol=1e-5)


class CachedAttention(torch.nn.Module):
    """One decoding step: the new key and value go into cache slots (`index_copy_` at a position
    known at run time), a step counter advances in place, and the query attends over the slots
    written so far."""

    def __init__(self, slots=6, dim=8):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.register_buffer("keys", torch.zeros(1, slots, dim))
        self.register_buffer("values", torch.zeros(1, slots, dim))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x, position):
        q, k, v = self.qkv(x).chunk(3, -1)
        self.keys.index_copy_(1, position, k)
        self.values.index_copy_(1, position, v)
        self.steps.add_(1)
        written = torch.arange(self.keys.shape[1]) <= position
        scores = (q @ self.keys.transpose(1, 2)).masked_fill(~written, float("-inf"))
        return scores.softmax(-1) @ self.values + self.steps


def test_a_graph_that_writes_its_inputs_writes_them_back(compiled_graphs, torch_cache):
    """A KV cache: the plan computes the new buffer values and the backend copies them back, so
    step after step outputs and buffers match eager PyTorch's on a twin of the module."""
    module, twin = CachedAttention().eval(), CachedAttention().eval()
    twin.load_state_dict(module.state_dict())
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        compiled = torch.compile(module, backend="korch", options=fast_options(torch_cache))
        for step in range(4):
            x, position = rand(1, 1, 8), torch.tensor([step])
            got, want = compiled(x, position), twin(x, position)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), step
            for name, buffer in twin.named_buffers():
                assert torch.allclose(getattr(module, name), buffer, rtol=1e-5, atol=1e-6), (step, name)
    assert korch_warnings(record) == [] and len(compiled_graphs) == 1
    # the written buffers are the plan's run-time inputs beside x and position; the weights are frozen
    assert len(compiled_graphs[0].inputs) == 5


class Broken(torch.nn.Module):
    """A graph break between two blocks korch compiles (the same graph twice: profiled once)."""

    def __init__(self):
        super().__init__()
        self.first, self.second = Block(), Block()

    def forward(self, x):
        y = self.first(x)
        torch._dynamo.graph_break()
        return self.second(y)


def test_graph_break_compiles_each_side(compiled_graphs, torch_cache):
    module = Broken().eval()
    x = rand(2, 5, 16)
    got, warned = run_compiled(module, x, torch_cache)
    assert warned == [] and len(compiled_graphs) == 2
    with torch.no_grad():
        assert check.rel_err(got.numpy(), module(x).numpy()) <= 1e-4


class Spectral(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x * 2).abs() + 1


def test_unsupported_graph_runs_eagerly_with_a_warning(compiled_graphs, torch_cache):
    module = Spectral()
    x = rand(2, 5, 16)
    got, warned = run_compiled(module, x, torch_cache)
    assert len(warned) == 1 and "aten._fft_r2c" in warned[0] and "\n" not in warned[0]
    assert compiled_graphs == []
    assert check.rel_err(got.numpy(), module(x).numpy()) <= 1e-6


def test_training_graph_runs_eagerly(compiled_graphs, torch_cache):
    module = Block()
    x = rand(2, 5, 16)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = torch.compile(module, backend="korch", options=fast_options(torch_cache))(x)
    assert "inference" in " ".join(korch_warnings(record))
    got.sum().backward()  # eager autograd still works
    assert module.fc.weight.grad is not None


def test_unknown_option_is_an_error():
    with pytest.raises(TypeError, match="time_budgte"):
        torch_backend.korch_backend(None, [], options={"time_budgte": 1})
