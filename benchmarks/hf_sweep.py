"""Hugging Face transformers architectures through korch's front ends: tiny models with random
weights, built from their configs (no download), lowered through the PyTorch front end and, with
--onnx torchscript|dynamo, exported by one of torch.onnx's exporters and imported as ONNX. Per
model and path: primitives, opaque operators, and the primitive graph's largest relative error
(numpy reference executor) against eager PyTorch, or against ONNX Runtime on the exported file.
`--dtype bfloat16` casts the models and their float inputs (PyTorch front end only: ONNX Runtime has
no bfloat16 kernels on a CPU).
A failure of torch's own exporter is printed as it is (not korch's); korch's refusals say
"refused".
`--optimize SECONDS` also optimizes each model end to end (that profiling budget; every backend,
or `--backends`) and runs the plan: the row then adds the plan's kernels, their backends and its
largest relative error against eager PyTorch (the PyTorch path) or ONNX Runtime on the exported
file.

Needs `transformers` (and `onnxscript` for the dynamo exporter), which korch does not depend on;
a virtual environment that sees korch and torch works:
`python -m venv --system-site-packages ENV && ENV/bin/pip install transformers onnxscript`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import os
import re
import sys
import time
import warnings

import torch

import korch
from korch.frontend.torch.importer import import_torch
from korch.ir import reference
from korch.ir.tensors import to_numpy
from korch.measure import check

LM = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=500)
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
VISION = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    image_size=32,
    patch_size=8,
)
ENC_DEC = dict(
    d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4
)
ENC_DEC.update(encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=500)
STAGES = dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1])


def _ids(n=16):
    return torch.randint(0, 500, (1, n), generator=torch.Generator().manual_seed(n))


def _image(size=32):
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(size))


def models(T) -> dict:
    """name -> (model factory, example inputs); the first output (logits where there are any)."""
    moe = dict(num_key_value_heads=2, num_experts_per_tok=2)
    return {
        "bert": (lambda: T.BertForMaskedLM(T.BertConfig(**LM)), (_ids(),)),
        "roberta": (lambda: T.RobertaForMaskedLM(T.RobertaConfig(**LM)), (_ids(),)),
        "distilbert": (
            lambda: T.DistilBertForMaskedLM(
                T.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=500)
            ),
            (_ids(),),
        ),
        "albert": (lambda: T.AlbertForMaskedLM(T.AlbertConfig(**LM, embedding_size=32)), (_ids(),)),
        "electra": (lambda: T.ElectraForMaskedLM(T.ElectraConfig(**LM, embedding_size=32)), (_ids(),)),
        "deberta-v2": (lambda: T.DebertaV2ForMaskedLM(T.DebertaV2Config(**LM)), (_ids(),)),
        "mobilebert": (
            lambda: T.MobileBertForMaskedLM(
                T.MobileBertConfig(**LM, embedding_size=32, intra_bottleneck_size=32)
            ),
            (_ids(),),
        ),
        "bigbird": (
            lambda: T.BigBirdForMaskedLM(T.BigBirdConfig(**LM, attention_type="original_full")),
            (_ids(),),
        ),
        "gpt2": (
            lambda: T.GPT2LMHeadModel(
                T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=64)
            ),
            (_ids(),),
        ),
        "gptj": (
            lambda: T.GPTJForCausalLM(
                T.GPTJConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=500, rotary_dim=8)
            ),
            (_ids(),),
        ),
        "gpt-neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**LM)), (_ids(),)),
        "opt": (
            lambda: T.OPTForCausalLM(T.OPTConfig(**LM, ffn_dim=128, word_embed_proj_dim=64)),
            (_ids(),),
        ),
        "bloom": (
            lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=500)),
            (_ids(),),
        ),
        "falcon": (lambda: T.FalconForCausalLM(T.FalconConfig(**LM)), (_ids(),)),
        "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(**LM, num_key_value_heads=2)), (_ids(),)),
        # sequence classification: the logits read at each row's last non-padding token
        # (logits[arange(batch), last], an index known only at run time)
        "llama-classifier": (
            lambda: T.LlamaForSequenceClassification(T.LlamaConfig(**LM, num_key_value_heads=2, **TOKENS)),
            (_ids(),),
        ),
        "gpt2-classifier": (
            lambda: T.GPT2ForSequenceClassification(
                T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=64, pad_token_id=0)
            ),
            (_ids(),),
        ),
        "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(**LM, num_key_value_heads=2)), (_ids(),)),
        "qwen2": (lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**LM, num_key_value_heads=2)), (_ids(),)),
        "qwen3": (
            lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**LM, num_key_value_heads=2, head_dim=16)),
            (_ids(),),
        ),
        "phi": (lambda: T.PhiForCausalLM(T.PhiConfig(**LM)), (_ids(),)),
        "phi3": (lambda: T.Phi3ForCausalLM(T.Phi3Config(**LM, num_key_value_heads=2, **TOKENS)), (_ids(),)),
        "gemma": (
            lambda: T.GemmaForCausalLM(T.GemmaConfig(**LM, num_key_value_heads=2, head_dim=16)),
            (_ids(),),
        ),
        "gemma2": (
            lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**LM, num_key_value_heads=2, head_dim=16)),
            (_ids(),),
        ),
        "gemma3": (
            lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(**LM, num_key_value_heads=2, head_dim=16)),
            (_ids(),),
        ),
        "mixtral": (
            lambda: T.MixtralForCausalLM(T.MixtralConfig(**LM, **moe, num_local_experts=4)),
            (_ids(),),
        ),
        "qwen2-moe": (
            lambda: T.Qwen2MoeForCausalLM(
                T.Qwen2MoeConfig(
                    **LM, **moe, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64
                )
            ),
            (_ids(),),
        ),
        "olmoe": (lambda: T.OlmoeForCausalLM(T.OlmoeConfig(**LM, **moe, num_experts=4)), (_ids(),)),
        "deepseek-v3": (
            lambda: T.DeepseekV3ForCausalLM(
                T.DeepseekV3Config(
                    **{**LM, **moe, "num_key_value_heads": 4},
                    n_routed_experts=4,
                    moe_intermediate_size=32,
                    first_k_dense_replace=1,
                    kv_lora_rank=16,
                    q_lora_rank=32,
                    qk_rope_head_dim=8,
                    qk_nope_head_dim=8,
                    v_head_dim=16,
                    n_group=2,
                    topk_group=1,
                )
            ),
            (_ids(),),
        ),
        "mamba": (
            lambda: T.MambaForCausalLM(
                T.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=500, state_size=8)
            ),
            (_ids(),),
        ),
        "t5": (
            lambda: T.T5ForConditionalGeneration(
                T.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=500)
            ),
            (_ids(), _ids(4)),
        ),
        "bart": (lambda: T.BartForConditionalGeneration(T.BartConfig(**ENC_DEC)), (_ids(), _ids(4))),
        "whisper": (
            lambda: T.WhisperForConditionalGeneration(
                T.WhisperConfig(
                    **ENC_DEC,
                    num_mel_bins=16,
                    max_source_positions=32,
                    max_target_positions=32,
                    decoder_start_token_id=1,
                    **TOKENS,
                )
            ),
            (torch.randn(1, 16, 64, generator=torch.Generator().manual_seed(0)), _ids(4)),
        ),
        "wav2vec2": (
            lambda: T.Wav2Vec2Model(
                T.Wav2Vec2Config(
                    hidden_size=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=128,
                    conv_dim=(16, 16),
                    conv_stride=(5, 2),
                    conv_kernel=(10, 3),
                    num_conv_pos_embeddings=16,
                    num_conv_pos_embedding_groups=4,
                )
            ),
            (torch.randn(1, 1600, generator=torch.Generator().manual_seed(0)),),
        ),
        "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(**VISION)), (_image(),)),
        "deit": (lambda: T.DeiTForImageClassification(T.DeiTConfig(**VISION)), (_image(),)),
        "beit": (lambda: T.BeitForImageClassification(T.BeitConfig(**VISION)), (_image(),)),
        "dinov2": (lambda: T.Dinov2Model(T.Dinov2Config(**VISION)), (_image(),)),
        "clip-vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**VISION)), (_image(),)),
        "swin": (
            lambda: T.SwinForImageClassification(
                T.SwinConfig(
                    image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4
                )
            ),
            (_image(),),
        ),
        "convnext": (
            lambda: T.ConvNextForImageClassification(
                T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)
            ),
            (_image(),),
        ),
        "resnet": (
            lambda: T.ResNetForImageClassification(
                T.ResNetConfig(hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16)
            ),
            (_image(),),
        ),
        "regnet": (
            lambda: T.RegNetForImageClassification(
                T.RegNetConfig(hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, embedding_size=16)
            ),
            (_image(64),),
        ),
        "efficientnet": (
            lambda: T.EfficientNetForImageClassification(
                T.EfficientNetConfig(
                    image_size=64, hidden_dim=1280, width_coefficient=1.0, depth_coefficient=1.0
                )
            ),
            (_image(64),),
        ),
        "mobilenet-v2": (
            lambda: T.MobileNetV2ForImageClassification(
                T.MobileNetV2Config(image_size=64, depth_multiplier=0.25)
            ),
            (_image(64),),
        ),
        "mobilevit": (
            lambda: T.MobileViTForImageClassification(
                T.MobileViTConfig(
                    image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]
                )
            ),
            (_image(64),),
        ),
        "levit": (
            lambda: T.LevitForImageClassification(
                T.LevitConfig(
                    image_size=64,
                    hidden_sizes=[32, 48, 64],
                    num_attention_heads=[1, 2, 2],
                    depths=[1, 1, 1],
                    key_dim=[8, 8, 8],
                )
            ),
            (_image(64),),
        ),
        "poolformer": (
            lambda: T.PoolFormerForImageClassification(T.PoolFormerConfig(**STAGES)),
            (_image(64),),
        ),
        "segformer": (
            lambda: T.SegformerForSemanticSegmentation(T.SegformerConfig(**STAGES, decoder_hidden_size=32)),
            (_image(64),),
        ),
        "glpn": (
            lambda: T.GLPNForDepthEstimation(
                T.GLPNConfig(**STAGES, num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=16)
            ),
            (_image(64),),
        ),
    }


class FirstOutput(torch.nn.Module):
    """forward(*inputs) -> the model's first output; two inputs are (encoder input, decoder ids)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        if len(inputs) == 2:
            key = "input_features" if inputs[0].is_floating_point() else "input_ids"
            out = self.model(**{key: inputs[0]}, decoder_input_ids=inputs[1])
        else:
            out = self.model(inputs[0])
        return out[0]


def _randomize_zeros(model) -> None:
    """Weights that some models start at zero (a classifier, a norm's scale) make every output
    zero, which compares equal to anything: give them random values."""
    generator = torch.Generator().manual_seed(0)
    for p in model.parameters():
        if not p.detach().abs().sum():
            p.data.copy_(torch.randn(p.shape, generator=generator) * 0.1)


def torch_path(module, inputs, optimize: dict | None = None) -> str:
    result = import_torch(module, inputs)
    feeds = {name: to_numpy(x) for name, x in zip(result.graph.inputs, inputs)}
    got = reference.run(result.graph, feeds)[result.graph.output_names[0]]
    with torch.no_grad():
        want = to_numpy(module(*inputs))
    row = _row(result, check.rel_err(got, want))
    if optimize is None:
        return row
    plan = korch.optimize(module, inputs, **optimize)
    return f"{row} {_plan_row(plan, check.rel_err(to_numpy(plan(*inputs)[0]), want))}"


def _plan_row(plan, err: float) -> str:
    backends = ",".join(sorted({k.backend for k in plan.kernels}))
    return f"{len(plan.kernels):7d} {backends:28s} {err:9.1e}"


def onnx_path(module, inputs, dynamo: bool = False, optimize: dict | None = None) -> str:
    import onnx

    with torch.no_grad(), _quiet():
        if dynamo:  # (opset 23: attention as one Attention node, as torch.onnx writes it)
            model = torch.onnx.export(module, inputs, dynamo=True, opset_version=23).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(module, inputs, buffer, opset_version=17, dynamo=False)
            model = onnx.load_from_string(buffer.getvalue())
    result = korch.fission(model)
    row = _row(result, korch.check_fission(result))
    if optimize is None:
        return row
    plan = korch.optimize(model, **optimize)
    return f"{row} {_plan_row(plan, plan.verify())}"


@contextlib.contextmanager
def _quiet():
    """The exporter prints its whole TorchScript graph when it fails."""
    sys.stdout.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _row(result, err: float) -> str:
    return f"{len(result.graph.nodes):6d} {result.graph.by_kind()['opaque']:6d} {err:9.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", help="model names (default: all)")
    parser.add_argument(
        "--onnx",
        choices=("torchscript", "dynamo"),
        action="append",
        default=[],
        help="also export with torch.onnx (the TorchScript exporter at opset 17, or the dynamo exporter "
        "at opset 23, which needs onnxscript) and import the ONNX file; may be given twice",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument(
        "--optimize", type=float, metavar="SECONDS", help="also optimize (budget) and run the plan"
    )
    parser.add_argument("--cache", help="profile database for --optimize (default: korch's)")
    parser.add_argument("--backends", help="backends for --optimize (default: korch's)")
    args = parser.parse_args()
    if args.onnx and args.dtype == "bfloat16":
        parser.error("--onnx checks against ONNX Runtime, which has no bfloat16 kernels on a CPU")
    dtype = getattr(torch, args.dtype)
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)  # (the dynamo exporter logs every step)
    table = models(transformers)
    unknown = sorted(set(args.models) - set(table))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(table)}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, korch {korch.__version__}")
    optimize = None
    width = max(len(name) for name in table)  # (the model column fits every name)
    header = f"{'model':{width}s} {'path':8s} {'prims':>6s} {'opaque':>6s} {'rel err':>9s}"
    if args.optimize is not None:
        optimize = dict(time_budget=args.optimize, cache=args.cache, progress=False)
        if args.backends:
            optimize["backends"] = args.backends
        header += f" {'kernels':>7s} {'backends':28s} {'plan err':>9s}"
    print(f"{header} {'s':>5s}")
    for name in args.models or table:
        make, inputs = table[name]
        torch.manual_seed(0)
        module = FirstOutput(make()).eval()
        _randomize_zeros(module)
        module = module.to(dtype)
        inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
        paths = [("torch", functools.partial(torch_path, optimize=optimize))] + [
            (
                {"torchscript": "onnx-ts", "dynamo": "onnx-dyn"}[exporter],
                functools.partial(onnx_path, dynamo=exporter == "dynamo", optimize=optimize),
            )
            for exporter in args.onnx
        ]
        for path, run in paths:
            started = time.perf_counter()
            try:
                line = run(module, inputs)
            except korch.KorchError as e:
                line = f"refused: {e}"
            except Exception as e:  # (the exporter's own failures: not korch's)
                first = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines()[0]  # (no terminal colours)
                line = f"{type(e).__name__}: {first[:120]}"
            print(f"{name:{width}s} {path:8s} {line} {time.perf_counter() - started:5.1f}", flush=True)


if __name__ == "__main__":
    main()
