"""A LLaMA-style or Mixtral-style decoder (Hugging Face transformers, random weights) optimized by
korch and timed against its peers: ONNX Runtime (LLaMA only: the model is exported by torch.onnx's
dynamo exporter and korch optimizes the ONNX file), torch.compile and eager PyTorch on the
transformers module itself. Mixtral goes through korch's PyTorch front end (torch.onnx does not
export transformers' mixtures of experts), and so does either model in bfloat16 (`--dtype
bfloat16`: ONNX Runtime has no bfloat16 kernels on a CPU).

`--decode` times one step of generation instead: one new token against a transformers StaticCache
holding `--tokens` tokens of prompt, the cache written in place (`index_copy_`). korch runs it as
a torch.compile backend (`backend="korch"`), which hands the new cache values back to the model;
the peers are torch.compile (Inductor) and eager PyTorch on the same model. Before timing, eight
steps teacher-forced with eager's tokens are compared with eager's: logits and the final cache.

Needs `transformers` and `onnxscript` (not korch dependencies; see benchmarks/hf_sweep.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings

import torch

import korch
from korch.cli.bench import bench
from korch.plan.runtime import interleave

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
    parser.add_argument("--decode", action="store_true", help="time one generation step with a KV cache")
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    if args.decode:
        return decode(args)
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
    result.update(optimize_s=optimize_s, primitives=plan.meta.fission["primitives"])
    for system, r in result["results"].items():
        print(f"  {system:14s} median {r['median_ms']:8.3f} ms  min {r['min_ms']:8.3f}")
    print(f"  speed-up over the best peer: {result['speedup_vs_best_peer']:.2f}x")
    with open(f"{args.dir}/{name}.json", "w") as f:
        json.dump(result, f, indent=1, default=str)


def decode(args) -> None:
    import transformers as T

    model = build(args.kind).eval().to(getattr(torch, args.dtype))
    seeded = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, BASE["vocab_size"], (1, args.tokens), generator=seeded)
    length = args.tokens + 16  # a static cache attends over every slot, written or not

    def prefilled():
        cache = T.StaticCache(config=model.config, max_cache_len=length)
        model(prompt, past_key_values=cache, cache_position=torch.arange(args.tokens), use_cache=True)
        return cache

    def step(fn, cache, token, position):
        out = fn(token, past_key_values=cache, cache_position=torch.tensor([position]), use_cache=True)
        return out.logits[:, -1]

    options = {"time_budget": args.time_budget, "cache": f"{args.dir}/profiles.sqlite", "progress": False}
    systems = {
        "korch": torch.compile(model, backend="korch", options=options),
        "torch-compile": torch.compile(model),
        "eager": model,
    }
    name = f"{args.kind}-decode{args.tokens}" + ("-bf16" if args.dtype == "bfloat16" else "")
    result = {"tokens": args.tokens, "cache_slots": length, "dtype": args.dtype, "results": {}}
    with torch.no_grad():
        # eight greedy steps of eager's; each system is then fed the same tokens (the first a
        # fresh 1x1 tensor: a slice of the prompt has argmax's shape but not its strides, and
        # Dynamo compiles the graph again for the second token)
        cache, token, fed, want = prefilled(), torch.full((1, 1), int(prompt[0, 0])), [], []
        for i in range(8):
            fed.append(token)
            want.append(step(model, cache, token, args.tokens + i))
            token = want[-1].argmax(-1, keepdim=True)
        want_cache = [layer.keys.clone() for layer in cache.layers]
        caches = {}
        for system, fn in systems.items():
            started = time.perf_counter()
            cache = caches[system] = prefilled()
            got = [step(fn, cache, t, args.tokens + i) for i, t in enumerate(fed)]
            err = max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want))
            cache_err = max(float((layer.keys - k).abs().max()) for layer, k in zip(cache.layers, want_cache))
            result["results"][system] = {
                "setup_s": round(time.perf_counter() - started, 1),
                "max_rel_err": err,
                "cache_max_abs_err": cache_err,
            }
            print(
                f"{system}: 8 steps (compile included) {time.perf_counter() - started:.1f} s, "
                f"logits rel err {err:.1e}, cache abs err {cache_err:.1e}"
            )

        def timed(system):
            fn, cache = systems[system], caches[system]

            def call():  # each call writes the slot after the eight steps, then gives it back
                step(fn, cache, token, args.tokens + 8)
                for layer in cache.layers:
                    layer.crop(-1)

            return call

        by_round = interleave({s: timed(s) for s in systems}, 10, 0.2, "cpu", round_pause_s=1.0)
    for system, rounds in by_round.items():
        samples = [ms for r in rounds for ms in r]
        r = result["results"][system]
        r.update(median_ms=statistics.median(samples), min_ms=min(samples))
        print(f"  {system:14s} median {r['median_ms']:8.3f} ms  min {r['min_ms']:8.3f}")
    peers = [result["results"][s]["median_ms"] for s in ("torch-compile", "eager")]
    result["speedup_vs_best_peer"] = min(peers) / result["results"]["korch"]["median_ms"]
    print(f"  speed-up over the best peer: {result['speedup_vs_best_peer']:.2f}x")
    with open(f"{args.dir}/{name}.json", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
