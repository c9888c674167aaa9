"""A LLaMA-style or Mixtral-style decoder (Hugging Face transformers, random weights) optimized by
korch and timed against its peers: ONNX Runtime (LLaMA only: the model is exported by torch.onnx's
dynamo exporter and korch optimizes the ONNX file), torch.compile and eager PyTorch on the
transformers module itself. Mixtral goes through korch's PyTorch front end (torch.onnx does not
export transformers' mixtures of experts), and so does either model in bfloat16 (`--dtype
bfloat16`: ONNX Runtime has no bfloat16 kernels on a CPU).

Needs `transformers` and `onnxscript` (not korch dependencies; see benchmarks/hf_sweep.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import torch

import korch
from korch.bench import bench

BASE = dict(
    hidden_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    intermediate_size=1376,
    vocab_size=8000,
)


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids).logits


def build(kind: str):
    import transformers as T

    if kind == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**BASE))
    config = T.MixtralConfig(**{**BASE, "intermediate_size": 512}, num_local_experts=8, num_experts_per_tok=2)
    return T.MixtralForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=("llama", "mixtral"))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--time-budget", type=int, default=120)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--dir", default=".", help="where the ONNX file, profile database and results go")
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    module = Logits(build(args.kind)).eval().to(getattr(torch, args.dtype))
    ids = torch.randint(0, BASE["vocab_size"], (1, args.tokens), generator=torch.Generator().manual_seed(0))
    cache = f"{args.dir}/profiles.sqlite"
    name = f"{args.kind}{args.tokens}" + ("-bf16" if args.dtype == "bfloat16" else "")
    started = time.perf_counter()
    if args.kind == "llama" and args.dtype == "float32":
        path = f"{args.dir}/{name}.onnx"
        with torch.no_grad():
            torch.onnx.export(module, (ids,), path, dynamo=True, opset_version=23, input_names=["ids"])
        started = time.perf_counter()
        plan = korch.optimize(path, time_budget=args.time_budget, cache=cache)
        peers = ("onnxruntime", "torch-compile", "eager")
    else:
        plan = korch.optimize(module, (ids,), time_budget=args.time_budget, cache=cache)
        peers = ("torch-compile", "eager")
    optimize_s = time.perf_counter() - started
    plan.save(f"{args.dir}/{name}-plan")  # (korch explain DIR/...-plan)
    kernels = f"{len(plan.kernels)} kernels ({', '.join(sorted({k.backend for k in plan.kernels}))})"
    print(f"optimize {optimize_s:.1f} s: {kernels}, verify {plan.verify():.1e}")
    result = bench(plan, peers, rounds=10, module=module)
    result.update(optimize_s=optimize_s, primitives=plan.meta["fission"]["primitives"])
    for system, r in result["results"].items():
        print(f"  {system:14s} median {r['median_ms']:8.3f} ms  min {r['min_ms']:8.3f}")
    print(f"  speed-up over the best peer: {result['speedup_vs_best_peer']:.2f}x")
    with open(f"{args.dir}/{name}.json", "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
