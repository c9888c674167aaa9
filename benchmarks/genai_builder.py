"""Language models as onnxruntime-genai's model builder writes them for ONNX Runtime
(`python -m onnxruntime_genai.models.builder -p fp32 -e cpu`, what the ONNX files of Phi, LLaMA,
Qwen, Mistral and Gemma on the Hugging Face hub are made with): com.microsoft's
GroupQueryAttention (rotary embedding, KV cache, sliding window, soft-capping, attention sinks
inside) and SkipSimplifiedLayerNormalization between plain MatMuls. The models are Hugging Face
transformers configurations with random weights, `tiny` (hf_sweep.py's) or `base` (hidden 512,
4 layers, 8 query and 2 key/value heads: hf_decoder_bench.py's), saved with a word-level tokenizer
and built by the model builder.

Each model is optimized twice, as generation runs it: the prompt (batch 1, --tokens tokens, an
empty cache) and one decode step (one token after --tokens - 1 cached). The attention mask is
pinned to ones (`values={"attention_mask": 1}`: one unpadded sequence, so every cache length is
known at compile time); multimodal position_ids [3, batch, seq] are pinned too, and a
convolution's or linear attention's state (past.N.conv, past.N.recurrent) is a random input of
its fixed size. Per step, as quantized_zoo.py: primitives, opaque operators, the primitive
graph's error against ONNX Runtime, the plan's kernels and backends, `plan.verify()`, medians of
korch and ONNX Runtime (`korch.cli.bench.bench`, interleaved) and their ratio.

The builder needs transformers >= 5 and onnxruntime-genai, which are not korch dependencies: in an
environment that sees korch (`python -m venv --system-site-packages ENV`), `ENV/bin/pip install
transformers tokenizers onnx_ir` and `ENV/bin/pip install --no-deps onnxruntime-genai` (its own
onnxruntime would replace korch's). Usage: `PYTHONPATH=. ENV/bin/python
benchmarks/genai_builder.py [MODEL ...] --dir DIR [--size tiny|base] [--precision fp32|int4]
[--tokens N] [--time-budget S] [--cache DB] [--backends a,b]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from hf_decoder_bench import BASE
from hf_sweep import LM, TOKENS
from quantized_zoo import MEASURED, measure

import korch

SIZES = {"tiny": dict(LM, num_key_value_heads=2), "base": BASE}  # (hf_sweep's, hf_decoder_bench's)
# (8 of each head's features rotated; a vision tower that the builder leaves out)
VL = dict(
    mrope_section=[2, 1, 1],
    vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64),
)
QWEN35 = dict(
    TOKENS,
    **VL,
    layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)
# name -> (transformers model class, its config class, settings beyond the size's; layer_types
# repeat to the size's depth; with vision_config, the rest is the text_config)
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 6}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {}),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", TOKENS),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", {}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"sliding_window": 6}),
    "gpt-oss": (
        "GptOssForCausalLM",
        "GptOssConfig",
        {"sliding_window": 6, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "granite": ("GraniteForCausalLM", "GraniteConfig", {}),
    "olmo": ("OlmoForCausalLM", "OlmoConfig", {}),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", TOKENS),
    # an attention layer, then a short-convolution layer (CausalConvWithState, its state an input)
    "lfm2": ("Lfm2ForCausalLM", "Lfm2Config", dict(TOKENS, layer_types=["full_attention", "conv"])),
    "lfm2-moe": (  # the convolution layer's MLP a mixture of experts (MoE; int4: QMoE)
        "Lfm2MoeForCausalLM",
        "Lfm2MoeConfig",
        dict(
            TOKENS,
            layer_types=["full_attention", "conv"],
            num_dense_layers=1,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
        ),
    ),
    "ernie4.5": ("Ernie4_5ForCausalLM", "Ernie4_5Config", TOKENS),
    "hunyuan": ("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", TOKENS),
    # (the builder's GroupQueryAttention needs whole rotations here: a partial one's tables are 4 wide)
    "nemotron": ("NemotronForCausalLM", "NemotronConfig", dict(TOKENS, partial_rotary_factor=1.0)),
    "phi": ("PhiForCausalLM", "PhiConfig", dict(TOKENS, partial_rotary_factor=1.0)),
    # the text models of vision-language checkpoints: multimodal rotary positions (MRotaryEmbedding,
    # position_ids [3, batch, seq]), in sections (Qwen2.5-VL) or interleaved (Qwen3-VL)
    "qwen2.5-vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", dict(TOKENS, **VL)),
    "qwen3-vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig", dict(TOKENS, **VL)),
    # Gated DeltaNet layers (LinearAttention, its gates and norm, CausalConvWithState; the states
    # inputs) between attention layers with multimodal rotary positions (MRotaryEmbedding;
    # position_ids [3, batch, seq]); the text model of a vision-language checkpoint
    "qwen3.5": ("Qwen3_5ForConditionalGeneration", "Qwen3_5Config", QWEN35),
    "qwen3.5-moe": (  # its MLPs a mixture of experts (MoE, QMoE) plus a gated shared one (GatedAdd)
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeConfig",
        dict(
            QWEN35,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
        ),
    ),
}


def save_checkpoint(name: str, size: str, out: Path) -> None:
    """A random-weight checkpoint with a word-level tokenizer (the builder reads both)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    model_class, config_class, extra = MODELS[name]
    dims, extra = SIZES[size], dict(extra)
    text = dict(dims, head_dim=dims["hidden_size"] // dims["num_attention_heads"])
    if "layer_types" in extra:
        pattern = extra.pop("layer_types")
        text["layer_types"] = [pattern[i % len(pattern)] for i in range(dims["num_hidden_layers"])]
    if "mrope_section" in extra:
        sections = extra.pop("mrope_section")
        rotated = 2 * sum(sections) / text["head_dim"]
        text["rope_parameters"] = dict(
            rope_type="default", rope_theta=10000.0, partial_rotary_factor=rotated, mrope_section=sections
        )
    vision = extra.pop("vision_config", None)
    text.update(extra)
    config_type = getattr(transformers, config_class)
    config = config_type(text_config=text, vision_config=vision) if vision else config_type(**text)
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).eval().save_pretrained(out)
    vocab = {f"t{i}": i for i in range(dims["vocab_size"])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    names = dict(unk_token="t0", bos_token="t1", eos_token="t2", pad_token="t0")
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, **names).save_pretrained(out)


def build(checkpoint: Path, out: Path, precision: str) -> str | None:
    """The model builder's CPU model of the checkpoint (fp32, or int4: MatMulNBits weights, A
    rounded to 8 bits, the builder's CPU default); its error's last line if it fails."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(checkpoint)]
    command += ["-i", str(checkpoint), "-o", str(out), "-p", precision, "-e", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode or not (out / "model.onnx").exists():
        return (done.stderr.strip().splitlines() or ["no model.onnx"])[-1][:100]
    return None


def pins(out: Path, tokens: int, decode: bool) -> dict:
    """Shapes and values of one step: the prompt (`tokens` new, an empty cache) or a decode step
    (one new after tokens - 1 cached); the attention mask all ones."""
    config = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    past = tokens - 1 if decode else 0
    new = tokens - past
    # layers with a window-sized cache (sliding_window_cache) hold window + slack rows throughout
    window = config.get("sliding_window") or {}
    windowed = set(window.get("layers", ()))
    capacity = window.get("window_size", 0) + window.get("cache_slack", 0)
    shapes, values = {}, {"attention_mask": 1}
    for inp in onnx.load(out / "model.onnx", load_external_data=False).graph.input:
        if inp.name == "input_ids":
            shapes[inp.name] = (1, new)
        elif inp.name == "attention_mask":
            shapes[inp.name] = (1, past + new)
        elif inp.name.startswith("past_key_values."):
            rows = capacity if int(inp.name.split(".")[1]) in windowed else past
            shapes[inp.name] = (1, config["num_key_value_heads"], rows, config["head_size"])
        elif inp.name.startswith("past.") and inp.name.split(".")[-1] in ("conv", "recurrent"):
            # a convolution's or a linear attention's state, [batch, ...] of fixed sizes
            shapes[inp.name] = (1, *(d.dim_value for d in inp.type.tensor_type.shape.dim[1:]))
        elif inp.name == "position_ids":  # [batch, seq], or [3, batch, seq] (multimodal rotary)
            streams = (3,) * (len(inp.type.tensor_type.shape.dim) == 3)
            shapes[inp.name] = (*streams, 1, new)
            values[inp.name] = np.broadcast_to(np.arange(past, past + new), shapes[inp.name]).copy()
        else:
            raise korch.KorchError(f"the model builder's input {inp.name} is new to this script")
    return {"shapes": shapes, "values": values}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", help=f"default: {' '.join(MODELS)}")
    parser.add_argument("--dir", required=True, help="where the checkpoints and built models go")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--tokens", type=int, default=16, help="prompt length; decode after one fewer")
    parser.add_argument("--time-budget", type=float, default=20.0, help="profiling seconds per step")
    parser.add_argument("--cache", help="profile database (default: korch's)")
    parser.add_argument("--precision", choices=["fp32", "int4"], default="fp32", help="the builder's -p")
    parser.add_argument("--backends", help="korch's (default: its own; inductor,vendor: a GPU's kind)")
    args = parser.parse_args()
    backends = args.backends.split(",") if args.backends else None
    import onnxruntime_genai
    import transformers

    transformers.logging.set_verbosity_error()
    print(
        f"transformers {transformers.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}, "
        f"korch {korch.__version__}; {args.size} {args.precision}, {args.tokens} tokens, "
        f"backends {args.backends or 'default'}"
    )
    print(f"{'model':16s} {MEASURED} {'s':>5s}")
    for name in args.models or MODELS:
        suffix = "" if args.precision == "fp32" else f"-{args.precision}"
        checkpoint, out = (
            Path(args.dir) / "hf" / f"{name}-{args.size}",
            Path(args.dir) / f"{name}-{args.size}{suffix}",
        )
        if not (out / "model.onnx").exists():
            if not (checkpoint / "config.json").exists():
                save_checkpoint(name, args.size, checkpoint)
            failed = build(checkpoint, out, args.precision)
            if failed:
                print(f"{name:16s} the model builder failed: {failed}", flush=True)
                continue
        for step in ("prompt", "decode"):
            started = time.perf_counter()
            try:
                line = measure(
                    out / "model.onnx",
                    args.time_budget,
                    args.cache,
                    backends,
                    **pins(out, args.tokens, step == "decode"),
                )
            except korch.KorchError as e:
                line = f"refused: {e}"
            print(f"{name + ' ' + step:16s} {line} {time.perf_counter() - started:5.1f}", flush=True)


if __name__ == "__main__":
    main()
