"""The PyTorch front end against torch's own operator database (OpInfo): for every operator that
takes float32 (int64, bool, bfloat16) on CPU, its first samples of that dtype are exported, lowered to
primitives and run by the numpy reference, and the outputs compared with eager PyTorch. korch may
refuse a sample (an operator without a rule, a dtype it lacks: a KorchError), but it may neither
crash nor compute something else. Hand-written cases live in test_torch_frontend.py; this is the
breadth check."""

import logging
import warnings

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import korch.backends  # noqa: F401  (first: torch's test utilities freeze torch.backends' flags)
from korch.errors import KorchError
from korch.frontend.torch.importer import import_torch
from korch.ir import reference
from korch.ir.prims import BFLOAT16
from korch.ir.tensors import as_tensor, to_numpy
from korch.measure import check

pytestmark = pytest.mark.sweep
op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db

# per operator and dtype, the first samples, which OpInfo makes small and varied (0-d, empty, kwargs)
SAMPLES = {torch.float32: 3, torch.int64: 2, torch.bool: 2, torch.bfloat16: 2}
# relative to the largest output value (korch.measure.check.rel_err); eager bfloat16 rounds once per
# operator, korch once per primitive (each in float32): a few of bfloat16's 2^-8 apart
TOLERANCE = {torch.bfloat16: 3e-2}
DEFAULT_TOLERANCE = 1e-4
CASES = [
    pytest.param(op, dtype, id=f"{op.name}.{op.variant_test_name}".rstrip(".") + f"-{str(dtype)[6:]}")
    for dtype in SAMPLES
    for op in op_db
    if dtype in op.supported_dtypes("cpu")
]


class Call(torch.nn.Module):
    """op(input, *args, **kwargs) with the sample's tensors as the module's inputs, the rest fixed."""

    def __init__(self, op, sample):
        super().__init__()
        self.op = op
        self.leaves, self.tree = tree_flatten((sample.input, sample.args, sample.kwargs))
        self.tensors = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, torch.Tensor)]

    def inputs(self) -> list[torch.Tensor]:
        return [self.leaves[i] for i in self.tensors]

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for i, t in zip(self.tensors, tensors):
            leaves[i] = t
        x, args, kwargs = tree_unflatten(leaves, self.tree)
        return self.op(x, *args, **kwargs)


def _mismatch(got: np.ndarray, want: torch.Tensor) -> str | None:
    tolerance = TOLERANCE.get(want.dtype, DEFAULT_TOLERANCE)
    want = to_numpy(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)}, eager {want.dtype}{list(want.shape)}"
    got, want = (a.astype(np.float32) if a.dtype == BFLOAT16 else a for a in (got, want))
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return "NaNs in other places"
    err = check.rel_err(np.nan_to_num(got), np.nan_to_num(want))
    return f"relative error {err:.3g}" if err > tolerance else None


# operators that leave the order of equal values open (torch's sort is not stable unless asked):
# their indices must pick the same values as eager's, along some axis, not be the same
UNSTABLE = ("sort", "argsort", "topk", "kthvalue", "msort")


# operators whose values are undefined (uninitialized memory; korch gives zeros): their outputs'
# shapes and dtypes are compared, not their values
UNINITIALIZED = ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided")


def _same_picks(x: torch.Tensor, got: np.ndarray, want: torch.Tensor) -> bool:
    got = as_tensor(got)
    if got.shape != want.shape:
        return False
    for axis in range(x.dim()):
        picks = [i.unsqueeze(axis) if i.dim() < x.dim() else i for i in (got, want)]  # (kthvalue)
        try:
            if torch.equal(*(torch.take_along_dim(x, i, axis) for i in picks)):
                return True
        except (RuntimeError, IndexError):
            continue
    return False


@pytest.mark.parametrize("op,dtype", CASES)
def test_aten_lowering_matches_eager_or_refuses(op, dtype):
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[: SAMPLES[dtype]]
    except Exception as e:  # (a few OpInfos need libraries this machine lacks)
        pytest.skip(f"no samples: {type(e).__name__}")
    lowered = 0
    for k, sample in enumerate(samples):
        module = Call(op.op, sample).eval()
        inputs = module.inputs()
        try:
            with torch.no_grad():
                want, _ = tree_flatten(module(*inputs))
        except Exception:  # (eager refuses it on this machine: CUDA-only, say)
            continue
        if not want or not all(isinstance(w, torch.Tensor) for w in want):
            continue  # (a Python number or None: not a graph output)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            try:
                result = import_torch(module, inputs)
            except KorchError as e:
                assert "\n" not in str(e), f"sample {k}: a refusal is one line"
                if "has no korch lowering" in str(e):
                    break  # (the other samples reach the same ATen operator: time saved)
                continue
            finally:
                logging.disable(logging.NOTSET)
        feeds = {name: to_numpy(t) for name, t in zip(result.graph.inputs, inputs)}
        got = reference.run(result.graph, feeds)
        assert len(got) == len(want), f"sample {k}: {len(got)} outputs, eager {len(want)}"
        for name, w in zip(result.graph.output_names, want):
            problem = _mismatch(got[name], w)
            if (
                problem
                and op.name in UNSTABLE
                and w.dtype == torch.int64
                and _same_picks(sample.input, got[name], w)
            ):
                problem = None
            if (
                problem
                and op.name in UNINITIALIZED
                and got[name].shape == w.shape
                and str(got[name].dtype) == str(w.dtype)[6:]
            ):
                problem = None
            assert problem is None, f"sample {k} ({sample.summary()}), output {name}: {problem}"
        lowered += 1
    if not lowered:
        pytest.skip("korch refuses every sample")
