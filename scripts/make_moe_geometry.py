#!/usr/bin/env python3
"""Random-weight mixture-of-experts checkpoints at a published model's width with fewer layers.

--family qwen3-moe (the default): Qwen3-30B-A3B's width (Qwen3-MoE HF directory).
--family gpt-oss: gpt-oss-20b's width (GptOss HF directory), see GPT_OSS below.

Qwen3-30B-A3B (its published config): hidden 2048, 32 query : 4 KV heads, head_dim 128,
QK-norm, 128 experts of which 8 are active per token (softmax router, top-k renormalised),
expert FFN 768, vocab 151936, untied output, rope_theta 1e6, rms_norm_eps 1e-6, 48 layers.
Here: the same width and experts with --layers layers (default 4), every layer sparse, so a
benchmark measures what a token of the real model reads per layer (about 57 M active
parameters a layer, of 604 M in the layer's experts) without its 48 layers' 60 GB.

Writes into --out (nothing is committed):
  config.json, generation_config.json (Qwen3MoeForCausalLM)
  model-0000k-of-0000n.safetensors + model.safetensors.index.json (bf16, per-expert
      tensors model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight as transformers
      saves them; tensors made one at a time from seeded generators: memory about one shard)
  tokenizer.json, tokenizer_config.json (the byte-level BPE of make_minicpm5_geometry.py,
      with exactly 151936 ids)
  --gguf q4_0,q8_0,...  model-<type>.gguf through scripts/hf_to_gguf.py (arch qwen3moe;
      written to a .partial file first, renamed when complete)
  --reuse-weights       keep the tokenizer, config and weights already in --out

Init as make_minicpm5_geometry.py (embeddings N(0, 1), in-projections N(0, 0.02),
out-projections N(0, 0.01), lm_head N(0, 0.05), norms 1 + 0.1 N(0, 1)); the router
N(0, 0.05) so that routing differs from token to token.

gpt-oss-20b (its published config): hidden 2880, 64 query : 8 KV heads, head_dim 64, Q/K/V/O
biases and a learned sink logit per head, 32 experts of which 4 are active per token (router
with a bias, softmax over the top-k logits), expert FFN 2880 with biases and the clamped SwiGLU
(swiglu_alpha 1.702, swiglu_limit 7.0), vocab 201088, untied output, sliding window 128 on
every other layer from layer 0, YaRN RoPE (theta 150000, factor 32 over 4096 positions, beta
32 / 1, truncate false), rms_norm_eps 1e-5, 24 layers. Here the same width with --layers
layers (default 4): about 126 M parameters a layer that a token reads (attention 26.5 M,
its 4 experts 99.5 M), of 796 M in the layer's experts. Weights as transformers 5 saves
GptOssForCausalLM: the experts fused per layer, model.layers.{i}.mlp.experts.gate_up_proj
[E, hidden, 2 * I] (gate and up interleaved on the last dimension), .gate_up_proj_bias
[E, 2 * I], .down_proj [E, I, hidden], .down_proj_bias [E, hidden]; mlp.router.{weight,bias};
self_attn.{q,k,v,o}_proj.{weight,bias}; self_attn.sinks [heads]. Init as above, plus sinks
N(0, 1) and every bias N(0, 0.01). One fused gate_up tensor is about 1.06 GB in bf16: it is
made and written alone (memory about one shard plus one f32 tensor). GGUF type mxfp4_moe:
experts MXFP4, the rest q8_0 (llama.cpp's MXFP4_MOE mix).

Usage:
  .venv-ref/bin/python scripts/make_moe_geometry.py --out .flowrt-cache/qwen3moe --gguf q4_0
  .venv-ref/bin/python scripts/make_moe_geometry.py --family gpt-oss --out .flowrt-cache/gptoss \
      --gguf mxfp4_moe
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_minicpm5_geometry as dense  # noqa: E402  (tokenizer and seeded tensors)

GEOMETRY = dict(
    hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
    vocab_size=151936, tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
    max_position_embeddings=40960, hidden_act="silu", attention_bias=False, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[],
)
STD = {**dense.STD, "router": 0.05, "sink": 1.0, "bias": 0.01}

# gpt-oss-20b's published width (GptOssConfig's keys); num_hidden_layers comes from --layers.
GPT_OSS = dict(
    hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
    num_local_experts=32, num_experts_per_tok=4, intermediate_size=2880,
    vocab_size=201088, tie_word_embeddings=False, rms_norm_eps=1e-5,
    max_position_embeddings=131072, sliding_window=128, attention_bias=True,
    swiglu_alpha=1.702, swiglu_limit=7.0, router_aux_loss_coef=0.0,
    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                         original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                         truncate=False),
)


def log(msg: str) -> None:
    print(f"[moe-geometry] {msg}", file=sys.stderr, flush=True)


def tensor_plan(g: dict, layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, init kind) in checkpoint order."""
    h, e, ff, hd = g["hidden_size"], g["num_experts"], g["moe_intermediate_size"], g["head_dim"]
    q, kv = g["num_attention_heads"] * hd, g["num_key_value_heads"] * hd
    plan = [("model.embed_tokens.weight", (g["vocab_size"], h), "embed")]
    for L in range(layers):
        p = f"model.layers.{L}."
        plan += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (q, h), "in"),
            (p + "self_attn.k_proj.weight", (kv, h), "in"),
            (p + "self_attn.v_proj.weight", (kv, h), "in"),
            (p + "self_attn.q_norm.weight", (hd,), "norm"),
            (p + "self_attn.k_norm.weight", (hd,), "norm"),
            (p + "self_attn.o_proj.weight", (h, q), "out"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate.weight", (e, h), "router"),
        ]
        for j in range(e):
            x = f"{p}mlp.experts.{j}."
            plan += [
                (x + "gate_proj.weight", (ff, h), "in"),
                (x + "up_proj.weight", (ff, h), "in"),
                (x + "down_proj.weight", (h, ff), "out"),
            ]
    plan += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (g["vocab_size"], h), "head")]
    return plan


def gpt_oss_plan(g: dict, layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, init kind) of a GptOssForCausalLM checkpoint, as transformers 5 names
    and shapes them (experts fused: gate_up_proj [E, hidden, 2I], down_proj [E, I, hidden])."""
    h, e, ff, hd = g["hidden_size"], g["num_local_experts"], g["intermediate_size"], g["head_dim"]
    n_head = g["num_attention_heads"]
    q, kv = n_head * hd, g["num_key_value_heads"] * hd
    plan = [("model.embed_tokens.weight", (g["vocab_size"], h), "embed")]
    for L in range(layers):
        p = f"model.layers.{L}."
        plan += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (q, h), "in"),
            (p + "self_attn.q_proj.bias", (q,), "bias"),
            (p + "self_attn.k_proj.weight", (kv, h), "in"),
            (p + "self_attn.k_proj.bias", (kv,), "bias"),
            (p + "self_attn.v_proj.weight", (kv, h), "in"),
            (p + "self_attn.v_proj.bias", (kv,), "bias"),
            (p + "self_attn.o_proj.weight", (h, q), "out"),
            (p + "self_attn.o_proj.bias", (h,), "bias"),
            (p + "self_attn.sinks", (n_head,), "sink"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.router.weight", (e, h), "router"),
            (p + "mlp.router.bias", (e,), "bias"),
            (p + "mlp.experts.gate_up_proj", (e, h, 2 * ff), "in"),
            (p + "mlp.experts.gate_up_proj_bias", (e, 2 * ff), "bias"),
            (p + "mlp.experts.down_proj", (e, ff, h), "out"),
            (p + "mlp.experts.down_proj_bias", (e, h), "bias"),
        ]
    plan += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (g["vocab_size"], h), "head")]
    return plan


FAMILIES = {
    # geometry, tensor plan, transformers config class, architecture
    "qwen3-moe": (GEOMETRY, tensor_plan, "Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gpt-oss": (GPT_OSS, gpt_oss_plan, "GptOssConfig", "GptOssForCausalLM"),
}


def make_tensor(idx: int, shape, kind: str, dtype):
    import torch

    gen = torch.Generator().manual_seed(dense.SEED * 1_000_003 + idx)
    z = torch.randn(shape, generator=gen, dtype=torch.float32)
    t = 1.0 + 0.1 * z if kind == "norm" else z.mul_(STD[kind])
    return t.to(dtype).contiguous()


def write_weights(out: Path, layers: int, shard_bytes: int, family: str = "qwen3-moe") -> dict:
    import torch
    from safetensors.torch import save_file

    g, plan_of, _, _ = FAMILIES[family]
    plan = plan_of(g, layers)
    shards: list[list[int]] = [[]]
    acc = 0
    for k, (_, shape, _) in enumerate(plan):
        n = 2 * math.prod(shape)
        if shards[-1] and acc + n > shard_bytes:
            shards.append([])
            acc = 0
        shards[-1].append(k)
        acc += n
    weight_map, total_size = {}, 0
    for si, idxs in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for k in idxs:
            name, shape, kind = plan[k]
            tensors[name] = make_tensor(k, shape, kind, torch.bfloat16)
            total_size += tensors[name].numel() * 2
            weight_map[name] = fname
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        log(f"wrote {fname} ({(out / fname).stat().st_size / 1e9:.2f} GB, {len(idxs)} tensors)")
        del tensors
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"shards": len(shards), "total_size": total_size, "params": sum(math.prod(s) for _, s, _ in plan)}


def write_config(out: Path, layers: int, family: str = "qwen3-moe") -> None:
    import transformers
    from transformers import GenerationConfig

    g, _, config_class, arch = FAMILIES[family]
    extra = {}
    if family == "gpt-oss":
        # llama.cpp's gpt-oss pattern (and what hf_to_gguf.py accepts): layer 0 slides.
        extra["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    cfg = getattr(transformers, config_class)(**g, **extra, num_hidden_layers=layers, bos_token_id=dense.BOS,
                                              eos_token_id=dense.EOS, dtype="bfloat16")
    cfg.architectures = [arch]
    cfg.save_pretrained(out)
    GenerationConfig(bos_token_id=dense.BOS, eos_token_id=dense.EOS).save_pretrained(out)


def active_params(g: dict, layers: int) -> dict:
    """Parameters one token reads: attention, router, its k experts per layer, embeddings row, output
    (matrices only: norms, biases and sinks are left out)."""
    h, hd = g["hidden_size"], g["head_dim"]
    q, kv = g["num_attention_heads"] * hd, g["num_key_value_heads"] * hd
    attn = h * q + 2 * h * kv + q * h
    n_exp = g.get("num_experts", g.get("num_local_experts"))
    expert = 3 * h * g.get("moe_intermediate_size", g["intermediate_size"])
    per_layer = attn + n_exp * h + g["num_experts_per_tok"] * expert
    return {"per_layer_active": per_layer, "per_layer_experts": n_exp * expert,
            "active_total": layers * per_layer + g["vocab_size"] * h}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Random MoE checkpoint at Qwen3-30B-A3B's (default) or "
                                             "gpt-oss-20b's width with fewer layers.")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen3-moe")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--gguf", default="", help="comma-separated GGUF types to write (f16,q8_0,q4_0,q4_1,mxfp4_moe)")
    ap.add_argument("--reuse-weights", action="store_true")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    g = FAMILIES[args.family][0]
    info = {"family": args.family, "geometry": {**g, "num_hidden_layers": args.layers},
            **active_params(g, args.layers)}
    if args.reuse_weights and dense.hf_dir_complete(args.out):
        log(f"reusing the tokenizer, config and weights in {args.out}")
    else:
        tok = dense.build_tokenizer(g["vocab_size"])
        dense.write_tokenizer(tok, args.out)
        write_config(args.out, args.layers, args.family)
        info["weights"] = write_weights(args.out, args.layers, int(args.shard_gb * 1e9), args.family)
        log(f"HF directory written in {time.perf_counter() - t0:.0f} s")
    from hf_to_gguf import convert

    for t in [t.strip() for t in args.gguf.split(",") if t.strip()]:
        dst = args.out / f"model-{t}.gguf"
        tmp = dst.with_suffix(".gguf.partial")
        t1 = time.perf_counter()
        convert(args.out, tmp, t)
        tmp.rename(dst)
        info[f"gguf_{t}"] = {"path": str(dst), "bytes": dst.stat().st_size, "seconds": round(time.perf_counter() - t1)}
        log(f"wrote {dst} ({dst.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t1:.0f} s")
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
