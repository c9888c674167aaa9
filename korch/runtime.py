"""The runtime: compiles a plan's kernels once (identical kernels share one compilation) and runs
them in order on device tensors, releasing each buffer after its last reader."""

from __future__ import annotations

import numpy as np
import torch

from korch.backends import all_backends
from korch.backends.torch_ops import DTYPES
from korch.errors import KorchError


class Executable:
    def __init__(self, plan):
        self.plan = plan
        device = plan.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise KorchError(f"this plan was built for {device}, and no CUDA device is available here")
        backends = all_backends()
        compiled: dict[tuple[str, str], object] = {}
        self.steps = []
        for k in plan.kernels:
            ident = (k.spec.key, k.backend)
            if ident not in compiled:
                if k.backend not in backends:
                    raise KorchError(f"the plan needs backend {k.backend!r}, which this korch does not have")
                compiled[ident] = backends[k.backend].compile(k.spec, device)
            self.steps.append((compiled[ident].fn, k.spec.inputs, k.spec.outputs, k.free_after))
        self.weights = {v: torch.as_tensor(np.array(a)).to(device) for v, a in plan.weights.items()}
        self.input_names = [n for n, _ in plan.inputs]
        self.input_types = dict(plan.inputs)

    def run_tensors(self, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        env = dict(self.weights)
        env.update(feeds)
        for fn, ins, outs, free in self.steps:
            results = fn(*[env[v] for v in ins])
            env.update(zip(outs, results))
            for v in free:
                env.pop(v, None)
        return [env[v] for v, _ in self.plan.outputs]

    def feeds(self, inputs, named) -> dict[str, torch.Tensor]:
        if len(inputs) > len(self.input_names):
            raise KorchError(f"the plan takes {len(self.input_names)} inputs, got {len(inputs)}")
        given = dict(zip(self.input_names, inputs))
        given.update(named)
        missing = [n for n in self.input_names if n not in given]
        unknown = [n for n in given if n not in self.input_types]
        if missing or unknown:
            raise KorchError(f"inputs do not match the plan: missing {missing}, unexpected {unknown}")
        feeds = {}
        for name, value in given.items():
            t = self.input_types[name]
            tensor = torch.as_tensor(value) if not isinstance(value, torch.Tensor) else value
            if tuple(tensor.shape) != t.shape or tensor.dtype != DTYPES[t.dtype]:
                raise KorchError(f"input {name!r} is {tensor.dtype}{list(tensor.shape)}, the plan wants {t}")
            feeds[name] = tensor.to(self.plan.device)
        return feeds

    def __call__(self, *inputs, **named):
        """Numpy arrays in, numpy arrays out; torch tensors in, torch tensors out."""
        as_numpy = not any(isinstance(x, torch.Tensor) for x in (*inputs, *named.values()))
        outs = self.run_tensors(self.feeds(inputs, named))
        return [o.detach().cpu().numpy() for o in outs] if as_numpy else outs

    def run_numpy(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self(**feeds)
        return {name: out for (_, name), out in zip(self.plan.outputs, outs)}
