#!/usr/bin/env python3
"""Random-weight checkpoint with MiniCPM5-2B's geometry, as a plain Llama HF directory.

MiniCPM5-2B (per the port thread in shared/context): 42 layers, hidden 2048,
intermediate 6144, 16 query : 2 KV heads, head_dim 128, vocab 73448, untied
output, no QK-norm, LlamaForCausalLM upstream. Not stated there, so chosen here
(MiniCPM4's values): rope_theta 10000, rms_norm_eps 1e-6,
max_position_embeddings 32768, default RoPE, bos 1, eos 2.

Writes into --out (nothing is committed):
  config.json, generation_config.json
  model-0000k-of-0000n.safetensors + model.safetensors.index.json
                        (weights bf16 by default, --dtype f32; shards of about
                        --shard-gb GB; tensors are generated one at a time, each
                        from its own seeded generator, so memory stays about one
                        shard and the output is reproducible)
  tokenizer.json        byte-level BPE with exactly 73448 ids: <unk> 0, <s> 1,
                        </s> 2, the 256 byte symbols 3..258, programmatic merges
                        up to 73439, then <|im_end|> 73440, <|im_start|> 73441 and
                        <|reserved_0..5|> (every id decodes)
  tokenizer_config.json (ChatML-like chat template), 
  --gguf q4_1,q8_0,...  model-<type>.gguf through scripts/hf_to_gguf.py (tokenizer.ggml.pre
                        "gpt-2", so llama.cpp loads it too; written to a .partial
                        file first, renamed when complete)
  --reuse-weights       keep the tokenizer, config and weights already in --out when
                        they are complete (only the GGUFs are written)
  --ref FILE            REF file (make_reference.py format, f32 logits_all) for 3
                        random-id prompts of 38, 12 and 57 tokens (each starts with
                        <s>), computed by transformers from the HF weights loaded
                        in float32 (eager attention, one thread)

Init: embeddings N(0, 1); q/k/v/gate/up N(0, 0.02); o/down N(0, 0.01);
lm_head N(0, 0.05) (logit std about 2); norms 1 + 0.1 N(0, 1).

Usage:
  .venv-ref/bin/python scripts/make_minicpm5_geometry.py --out /tmp/minicpm5 --gguf q4_1 --ref /tmp/minicpm5/ref.safetensors
"""

from __future__ import annotations

import argparse
import json
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

GEOMETRY = dict(
    num_hidden_layers=42, hidden_size=2048, intermediate_size=6144,
    num_attention_heads=16, num_key_value_heads=2, head_dim=128, vocab_size=73448,
    tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6,
    max_position_embeddings=32768, hidden_act="silu", attention_bias=False, mlp_bias=False,
)
BOS, EOS, UNK = 1, 2, 0
SEED = 5
PROMPT_LENGTHS = [38, 12, 57]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def log(msg: str) -> None:
    print(f"[minicpm5-geometry] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def build_tokenizer(vocab_size: int):
    """Byte-level BPE with exactly vocab_size ids, merges generated breadth-first
    over a set of common symbols (each merge joins an existing token and one symbol)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import AddedToken

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins for bytes
    head = ["<unk>", "<s>", "</s>"]
    tail = ["<|im_end|>", "<|im_start|>"] + [f"<|reserved_{k}|>" for k in range(6)]
    vocab: dict[str, int] = {}
    for t in head + alphabet:
        vocab[t] = len(vocab)
    n_merged = vocab_size - len(vocab) - len(tail)
    symbols = [c for c in "etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ0123456789"] + ["Ġ", "Ċ", ".", ","]
    merges: list[tuple[str, str]] = []
    frontier = list(symbols)
    while len(merges) < n_merged:
        nxt = []
        for t in frontier:
            for c in symbols:
                new = t + c
                if new in vocab:
                    continue
                vocab[new] = len(vocab)
                merges.append((t, c))
                nxt.append(new)
                if len(merges) == n_merged:
                    break
            if len(merges) == n_merged:
                break
        frontier = nxt
    for t in tail:
        vocab[t] = len(vocab)
    assert len(vocab) == vocab_size, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in head + tail])
    # Plain text gets <s> prepended, as Llama-family tokenizer.json files do.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS)])
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} ids, expected {vocab_size}")
    return tok


def write_tokenizer(tok, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "model_max_length": GEOMETRY["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------


def tensor_plan(g: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, init kind) in checkpoint order."""
    h, i, hd = g["hidden_size"], g["intermediate_size"], g["head_dim"]
    q, kv = g["num_attention_heads"] * hd, g["num_key_value_heads"] * hd
    plan = [("model.embed_tokens.weight", (g["vocab_size"], h), "embed")]
    for L in range(g["num_hidden_layers"]):
        p = f"model.layers.{L}."
        plan += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (q, h), "in"),
            (p + "self_attn.k_proj.weight", (kv, h), "in"),
            (p + "self_attn.v_proj.weight", (kv, h), "in"),
            (p + "self_attn.o_proj.weight", (h, q), "out"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate_proj.weight", (i, h), "in"),
            (p + "mlp.up_proj.weight", (i, h), "in"),
            (p + "mlp.down_proj.weight", (h, i), "out"),
        ]
    plan += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (g["vocab_size"], h), "head")]
    return plan


STD = {"embed": 1.0, "in": 0.02, "out": 0.01, "head": 0.05}


def make_tensor(idx: int, shape, kind: str, dtype):
    import torch

    gen = torch.Generator().manual_seed(SEED * 1_000_003 + idx)
    z = torch.randn(shape, generator=gen, dtype=torch.float32)
    t = 1.0 + 0.1 * z if kind == "norm" else z.mul_(STD[kind])
    return t.to(dtype).contiguous()


def write_weights(out: Path, dtype_name: str, shard_bytes: int) -> dict:
    import torch
    from safetensors.torch import save_file

    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    esize = 2 if dtype_name == "bf16" else 4
    plan = tensor_plan(GEOMETRY)
    # Group tensors into shards by size, in order.
    shards: list[list[int]] = [[]]
    acc = 0
    for k, (_, shape, _) in enumerate(plan):
        n = esize
        for s in shape:
            n *= s
        if shards[-1] and acc + n > shard_bytes:
            shards.append([])
            acc = 0
        shards[-1].append(k)
        acc += n
    total = len(shards)
    weight_map = {}
    total_size = 0
    for si, idxs in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{total:05d}.safetensors"
        tensors = {}
        for k in idxs:
            name, shape, kind = plan[k]
            tensors[name] = make_tensor(k, shape, kind, dtype)
            total_size += tensors[name].numel() * esize
            weight_map[name] = fname
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        log(f"wrote {fname} ({(out / fname).stat().st_size / 1e9:.2f} GB, {len(idxs)} tensors)")
        del tensors
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"shards": total, "total_size": total_size,
            "params": sum(int(__import__("math").prod(s)) for _, s, _ in plan)}


def write_config(out: Path, dtype_name: str) -> None:
    from transformers import GenerationConfig, LlamaConfig

    cfg = LlamaConfig(**GEOMETRY, bos_token_id=BOS, eos_token_id=EOS,
                      dtype="bfloat16" if dtype_name == "bf16" else "float32")
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(out)
    GenerationConfig(bos_token_id=BOS, eos_token_id=EOS).save_pretrained(out)


# ---------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------


def write_ref(out_dir: Path, ref: Path) -> dict:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from make_reference import FORMAT_VERSION, describe_model, write_safetensors

    g = torch.Generator().manual_seed(SEED + 1)
    prompts = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(3, 73440, (n,), generator=g).tolist()
        ids[0] = BOS
        prompts.append(ids)
    lm = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    tensors, stats = [], []
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            logits = lm(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
            top2 = torch.topk(logits, 2, dim=-1).values
            stats.append({"len": len(ids), "logit_std": float(logits.std(-1).mean()),
                          "top1_margin": float((top2[:, 0] - top2[:, 1]).mean())})
            tensors.append((f"prompt.{i}.input_ids", np.asarray(ids, dtype="<i8"), "I64"))
            tensors.append((f"prompt.{i}.logits_all", logits.numpy().astype("<f4"), "F32"))
    info = describe_model(out_dir)
    meta = {
        "format": FORMAT_VERSION, **info, "generator": "scripts/make_minicpm5_geometry.py",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "torch_threads": "1", "compute_dtype": "f32", "logits_dtype": "f32",
        "n_prompts": str(len(prompts)), "prompts": "random ids (seeded), first id <s>",
        "prompt_token_counts": json.dumps(PROMPT_LENGTHS), "total_token_counts": json.dumps(PROMPT_LENGTHS),
        "append_greedy": json.dumps([0] * len(prompts)), "vocab_size": str(GEOMETRY["vocab_size"]),
    }
    write_safetensors(ref, tensors, meta)
    return {"ref": str(ref), "bytes": ref.stat().st_size, "prompts": stats}


def hf_dir_complete(out: Path) -> bool:
    """Whether out holds config, tokenizer and every shard its safetensors index names."""
    index = out / "model.safetensors.index.json"
    needed = [out / "config.json", out / "tokenizer.json", out / "tokenizer_config.json", index]
    if not all(p.exists() for p in needed):
        return False
    shards = set(json.loads(index.read_text())["weight_map"].values())
    return all((out / s).exists() for s in shards)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="MiniCPM5-2B-geometry random checkpoint (Llama HF directory).")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--shard-gb", type=float, default=2.0, help="max shard size in GB (default 2)")
    ap.add_argument("--gguf", default="", help="comma-separated GGUF types to write (f32,f16,q8_0,q4_0,q4_1)")
    ap.add_argument("--ref", type=Path, help="write a REF file (f32 logits) here")
    ap.add_argument("--reuse-weights", action="store_true",
                    help="keep the tokenizer, config and weights already in --out when complete")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    times = {}
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reuse_weights and hf_dir_complete(args.out):
        log(f"reusing the tokenizer, config and weights in {args.out}")
    else:
        tok = build_tokenizer(GEOMETRY["vocab_size"])
        bad = [i for i in range(GEOMETRY["vocab_size"]) if tok.id_to_token(i) is None]
        if bad:
            raise SystemExit(f"ids without a token: {bad[:5]}")
        write_tokenizer(tok, args.out)
        write_config(args.out, args.dtype)
        times["tokenizer+config"] = time.perf_counter() - t0
        w = write_weights(args.out, args.dtype, int(args.shard_gb * 1e9))
        times["weights"] = time.perf_counter() - t0 - sum(times.values())
        log(f"weights: {w}")
    for t in [s for s in args.gguf.split(",") if s]:
        from hf_to_gguf import convert

        t1 = time.perf_counter()
        final = args.out / f"model-{t}.gguf"
        partial = final.with_name(final.name + ".partial")
        info = convert(args.out, partial, t, pre="gpt-2", name="minicpm5-2b-geometry-random")
        partial.replace(final)
        times[f"gguf {t}"] = time.perf_counter() - t1
        log(f"gguf {t}: {info}")
    if args.ref:
        t1 = time.perf_counter()
        r = write_ref(args.out, args.ref)
        times["ref"] = time.perf_counter() - t1
        log(f"ref: {json.dumps(r)}")
    times["total"] = time.perf_counter() - t0
    print(json.dumps({"out": str(args.out), "times_s": {k: round(v, 1) for k, v in times.items()},
                      "files": {p.name: p.stat().st_size for p in sorted(args.out.iterdir())}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
