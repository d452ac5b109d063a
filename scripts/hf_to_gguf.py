#!/usr/bin/env python3
"""Convert a small Hugging Face checkpoint directory to GGUF (flowrt's own converter).

Supported: LlamaForCausalLM (arch "llama"), Qwen2ForCausalLM ("qwen2"),
Qwen3ForCausalLM ("qwen3"), Qwen3MoeForCausalLM ("qwen3moe": expert_count,
expert_used_count, expert_feed_forward_length, expert_weights_norm, flowrt's
mlp_only_layers; blk.N.ffn_gate_inp and the 3-D blk.N.ffn_{gate,up,down}_exps),
GptOssForCausalLM ("gpt-oss", llama.cpp's names: attention.sliding_window (llama.cpp
slides every other layer from 0; the converter refuses other layer_types), attn_sinks,
attn_output.bias, post_attention_norm (the FFN's input norm; llama.cpp refuses ffn_norm),
ffn_gate_inp + .bias, ffn_{gate,up,down}_exps + .bias with HF's interleaved gate/up split
apart and every expert matrix transposed to (out, in); YaRN as rope.scaling.* plus flowrt's
rope.scaling.yarn_truncate (llama.cpp has none and always truncates); flowrt's
swiglu_alpha / swiglu_limit when they differ from llama.cpp's fixed 1.702 / 7.0), with
default RoPE otherwise (no other rope scaling),
Lfm2ForCausalLM ("lfm2", as llama.cpp writes it: lfm2.shortconv.l_cache, a per-layer
attention.head_count_kv list with 0 on convolution layers, feed_forward_length the
real (auto-adjusted) FFN width, blk.N.shortconv.{in_proj,conv,out_proj} with the
conv taps kept f32 [L, hidden], the final norm as token_embd_norm; with conv_bias, flowrt's
blk.N.shortconv.{in_proj,conv,out_proj}.bias, which llama.cpp has no names for),
Lfm2MoeForCausalLM ("lfm2moe", llama.cpp's keys: LFM2's, feed_forward_length the dense
layers' intermediate_size as it is, leading_dense_block_count (num_dense_layers),
expert_count, expert_used_count, expert_feed_forward_length, expert_gating_func 2
(sigmoid), expert_weights_norm (norm_topk_prob), expert_weights_scale
(routed_scaling_factor); blk.N.ffn_gate_inp, the 3-D blk.N.ffn_{gate,up,down}_exps from
feed_forward.experts.{j}.w1/w3/w2, blk.N.exp_probs_b.bias (expert_bias, f32)), with
default RoPE (no rope scaling). Weights come
from model.safetensors or sharded model-*.safetensors + model.safetensors.index.json,
read tensor by tensor (memory stays about one tensor).

GGUF written (gguf-py's GGUFWriter, v3):
  {arch}.context_length / embedding_length / block_count / feed_forward_length /
  attention.head_count / attention.head_count_kv / attention.layer_norm_rms_epsilon /
  attention.key_length / attention.value_length / rope.freq_base /
  rope.dimension_count / vocab_size, general.name, general.file_type
  tensors: token_embd.weight, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
  ffn_norm, ffn_gate, ffn_up, ffn_down}.weight, (qwen2) blk.N.attn_{q,k,v}.bias,
  (qwen3) blk.N.attn_{q,k}_norm.weight, output_norm.weight, output.weight
  (omitted when the embeddings are tied).
  llama only: attn_q / attn_k rows are permuted per head the way llama.cpp's
  convert_hf_to_gguf.py does (GGUF llama rotates adjacent pairs (2i, 2i+1); HF
  rotates (i, i + d/2)): rows [h, half, pair] <- HF rows [h, pair, half].
  qwen2/qwen3 keep HF's row order (llama.cpp uses NEOX rotation for them).
  --outtype f32|f16|q8_0|q4_0|q4_1|mxfp4_moe (experts MXFP4, the rest q8_0) applies to 2-D weights (quantised with
  gguf.quants.quantize, MXFP4 with quantize_mxfp4: the same bytes, faster; a matrix whose
  row length is not a multiple of 32 falls back to f16 for q* types, and is reported); norms
  and biases stay f32.
  Tokenizer (from tokenizer.json / tokenizer_config.json, byte-level BPE only):
  tokenizer.ggml.model "gpt2", tokenizer.ggml.pre (--pre, default "gpt-2", the name llama.cpp knows),
  tokens, token_type (1 normal, 3 control = special added token, 4 user-defined
  = other added token, 5 unused = padding ids past the tokenizer up to
  vocab_size, named "[PAD{id}]"), merges, bos/eos/padding ids, add_bos_token,
  add_eos_token, tokenizer.chat_template.

--ref FILE writes the GGUF's own reference logits (REF format, f32 logits_all,
transformers' dequantisation, checked against make_reference.verify_dequant) on
the input ids of <dir>/ref.safetensors.

--verify loads the GGUF back with transformers (`from_pretrained(dir,
gguf_file=...)`) and compares its logits with the HF checkpoint's on a few
random id sequences (and on the prompts of <dir>/ref.safetensors if present).

Usage:
  .venv-ref/bin/python scripts/hf_to_gguf.py MODEL_DIR --outtype q4_1 --out model-q4_1.gguf [--verify]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

ARCHES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
          "Qwen3MoeForCausalLM": "qwen3moe", "GptOssForCausalLM": "gpt-oss",
          "Lfm2ForCausalLM": "lfm2", "Lfm2MoeForCausalLM": "lfm2moe"}
# LFM2's own HF names (inside model.layers.{i}.) -> GGUF names (inside blk.{i}.)
LFM2_LAYER_TENSORS = {
    "operator_norm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.conv.weight": "shortconv.conv.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
    # conv_bias (flowrt's names; llama.cpp's lfm2 has none)
    "conv.in_proj.bias": "shortconv.in_proj.bias",
    "conv.conv.bias": "shortconv.conv.bias",
    "conv.out_proj.bias": "shortconv.out_proj.bias",
    # lfm2moe: the router and its selection bias
    "feed_forward.gate.weight": "ffn_gate_inp.weight",
    "feed_forward.expert_bias": "exp_probs_b.bias",
}
# lfm2moe's per-expert tensors inside model.layers.{i}.feed_forward.experts.{j}.
LFM2_EXPERT_TENSORS = {
    "w1.weight": "ffn_gate_exps.weight",
    "w3.weight": "ffn_up_exps.weight",
    "w2.weight": "ffn_down_exps.weight",
}


def lfm2_ff_dim(cfg: dict) -> int:
    """LFM2's real FFN width, as transformers' Lfm2MLP computes it."""
    ff = int(cfg.get("intermediate_size") or cfg["block_ff_dim"])
    if cfg.get("block_auto_adjust_ff_dim", True):
        ff = int(2 * ff / 3)
        mult = cfg.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            ff = int(mult * ff)
            m = int(cfg.get("block_multiple_of", 256))
            ff = m * ((ff + m - 1) // m)
    return ff
# Mixture of experts (qwen3moe): HF's per-expert tensors inside model.layers.{i}.mlp.experts.{j}.
# stacked into one 3-D GGUF tensor per role (one matrix per expert, ggml dims [in, out, experts]).
EXPERT_TENSORS = {
    "gate_proj.weight": "ffn_gate_exps.weight",
    "up_proj.weight": "ffn_up_exps.weight",
    "down_proj.weight": "ffn_down_exps.weight",
}
OUTTYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "mxfp4_moe")

# HF name (inside model.layers.{i}.) -> GGUF name (inside blk.{i}.)
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",  # the MoE router
    # gpt-oss
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


class ConvertError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[hf_to_gguf] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Reading the HF directory
# ---------------------------------------------------------------------------


def weight_files(model_dir: Path) -> dict[str, Path]:
    """HF tensor name -> file holding it."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        wm = json.loads(index.read_text())["weight_map"]
        return {k: model_dir / v for k, v in wm.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise ConvertError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


class TensorSource:
    """Reads one tensor at a time as float32 numpy (bf16 handled through torch)."""

    def __init__(self, model_dir: Path):
        self.where = weight_files(model_dir)
        self._open: dict[Path, object] = {}

    def names(self) -> set[str]:
        return set(self.where)

    def get(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        path = self.where[name]
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt")
        t = self._open[path].get_tensor(name)
        return t.float().numpy()


def rope_theta(cfg: dict) -> float:
    rp = cfg.get("rope_parameters") or {}
    rs = cfg.get("rope_scaling") or {}
    kind = rp.get("rope_type") or rs.get("rope_type") or rs.get("type") or "default"
    if kind not in ("default", "yarn"):
        raise ConvertError(f"rope type {kind!r} is not supported by this converter")
    return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF (rotate-half) row order -> GGUF llama (adjacent pairs) row order, per head."""
    rows = w.shape[0]
    head_dim = rows // n_head
    return (w.reshape(n_head, 2, head_dim // 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def tokenizer_metadata(model_dir: Path, vocab_size: int, cfg: dict, pre: str) -> dict:
    tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if tj["model"]["type"] != "BPE":
        raise ConvertError(f"tokenizer model {tj['model']['type']!r} not supported (byte-level BPE only)")
    tc_path = model_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.is_file() else {}
    by_id: dict[int, str] = {v: k for k, v in tj["model"]["vocab"].items()}
    types: dict[int, int] = {}
    for at in tj.get("added_tokens", []):
        by_id[at["id"]] = at["content"]
        types[at["id"]] = 3 if at.get("special") else 4
    n_tok = max(by_id) + 1
    if n_tok > vocab_size:
        raise ConvertError(f"tokenizer has {n_tok} ids but the model's vocab_size is {vocab_size}")
    tokens, token_type = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            token_type.append(types.get(i, 1))
        else:
            tokens.append(f"[PAD{i}]")
            token_type.append(5)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"].get("merges", [])]

    def special_id(key: str) -> int | None:
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            ids = [i for i, t in by_id.items() if t == v]
            if ids:
                return ids[0]
        alt = cfg.get(f"{key}_id")
        return alt if isinstance(alt, int) else (alt[0] if isinstance(alt, list) and alt else None)

    template = tc.get("chat_template")
    jinja = model_dir / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return {
        "tokens": tokens, "token_type": token_type, "merges": merges, "pre": pre,
        "bos": special_id("bos_token"), "eos": special_id("eos_token"), "pad": special_id("pad_token"),
        "add_bos": bool(tc.get("add_bos_token", False)), "add_eos": bool(tc.get("add_eos_token", False)),
        "chat_template": template,
    }


# ---------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------


# Midpoints between the E2M1 magnitudes 0, 1, 2, 3, 4, 6, 8, 12 (MXFP4's values over its scale).
MXFP4_MIDPOINTS = np.array([0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0], dtype=np.float32)


def quantize_mxfp4(a: np.ndarray) -> np.ndarray:
    """MXFP4 blocks, byte for byte what gguf.quants.quantize(a, MXFP4) writes, about ten times
    faster (gguf-py measures the error to all 16 values of every element). Its rule: the
    nearest value over the block's power-of-two scale d, ties to the smaller magnitude, and
    +0 for -0 and for negatives that round to 0. With d a power of two, x / d is exact and
    so is every |k - x/d| gguf-py compares, so thresholds at the midpoints choose the same.
    Blocks whose scale would be subnormal go to gguf-py itself."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import MXFP4, quantize

    a = np.ascontiguousarray(a, dtype=np.float32)
    rows = a.reshape(-1, a.shape[-1])
    out = np.empty((rows.shape[0], rows.shape[1] // 32 * 17), dtype=np.uint8)
    step = max(1, (1 << 22) // rows.shape[1])  # about 16 MB of f32 at a time
    for r0 in range(0, rows.shape[0], step):
        part = rows[r0:r0 + step]
        b = part.reshape(-1, 32)
        amax = np.abs(b).max(axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
        if np.any((e < 2) & (amax > 0)):
            out[r0:r0 + step] = quantize(part, Q.MXFP4).reshape(part.shape[0], -1)
            continue
        y = b / MXFP4.e8m0_to_fp32_half(e)
        ay = np.abs(y)
        mag = np.zeros(ay.shape, dtype=np.uint8)
        for m in MXFP4_MIDPOINTS:
            mag += ay > m
        idx = np.where((y < 0) & (mag > 0), mag + np.uint8(8), mag).astype(np.uint8).reshape(-1, 2, 16)
        qs = idx[:, 0] | (idx[:, 1] << np.uint8(4))
        out[r0:r0 + step] = np.concatenate([e, qs], axis=-1).reshape(part.shape[0], -1)
    return out.reshape(*a.shape[:-1], a.shape[-1] // 32 * 17)


def qtype_for(outtype: str):
    from gguf import GGMLQuantizationType as Q

    # mxfp4_moe: expert matrices in MXFP4, every other matrix in Q8_0 (llama.cpp's MXFP4_MOE)
    return {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1,
            "mxfp4_moe": Q.Q8_0}[outtype]


def file_type(outtype: str) -> int:
    from gguf import LlamaFileType as F

    return {"f32": F.ALL_F32, "f16": F.MOSTLY_F16, "q8_0": F.MOSTLY_Q8_0,
            "q4_0": F.MOSTLY_Q4_0, "q4_1": F.MOSTLY_Q4_1, "mxfp4_moe": F.MOSTLY_MXFP4_MOE}[outtype]


def convert(model_dir: Path, out: Path, outtype: str, pre: str = "gpt-2", name: str | None = None) -> dict:
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    cfg = json.loads((model_dir / "config.json").read_text())
    archs = cfg.get("architectures") or []
    if not archs or archs[0] not in ARCHES:
        raise ConvertError(f"{model_dir}: architectures {archs} not supported (supported: {sorted(ARCHES)})")
    arch = ARCHES[archs[0]]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    n_layer = cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    theta = rope_theta(cfg)

    src = TensorSource(model_dir)
    names = src.names()
    tied = "lm_head.weight" not in names
    if not tied and cfg.get("tie_word_embeddings", False):
        log("note: config says tied but lm_head.weight is present; writing output.weight")

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name or model_dir.name)
    w.add_file_type(int(file_type(outtype)))
    w.add_context_length(int(cfg.get("max_position_embeddings", 2048)))
    w.add_embedding_length(hidden)
    w.add_block_count(n_layer)
    lfm2 = arch in ("lfm2", "lfm2moe")
    if lfm2:
        kinds = cfg.get("layer_types") or [
            "full_attention" if i in (cfg.get("full_attn_idxs") or range(n_layer)) else "conv"
            for i in range(n_layer)]
        # LFM2-MoE's dense layers use intermediate_size as it is.
        w.add_feed_forward_length(lfm2_ff_dim(cfg) if arch == "lfm2" else int(cfg["intermediate_size"]))
        w.add_head_count(n_head)
        w.add_head_count_kv([0 if k == "conv" else n_kv for k in kinds])
        w.add_uint32(f"{arch}.shortconv.l_cache", int(cfg.get("conv_L_cache", 3)))
        w.add_layer_norm_rms_eps(float(cfg.get("norm_eps", 1e-5)))
    else:
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(vocab)
    n_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if arch == "qwen3moe":
        w.add_expert_count(int(n_experts))
        w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
        w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))
        # llama.cpp always renormalises qwen3moe's top-k weights; say so when the model does not.
        w.add_bool(f"{arch}.expert_weights_norm", bool(cfg.get("norm_topk_prob", False)))
        step = int(cfg.get("decoder_sparse_step", 1))
        only = set(cfg.get("mlp_only_layers") or [])
        dense = [i for i in range(n_layer) if i in only or (i + 1) % step != 0]
        if dense:
            # flowrt's key (HF's mlp_only_layers); llama.cpp has none.
            w.add_array(f"{arch}.mlp_only_layers", dense)
    if arch == "lfm2moe":
        w.add_expert_count(int(n_experts))
        w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
        w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))
        w.add_leading_dense_block_count(int(cfg.get("num_dense_layers", 2)))
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", True)))
        w.add_expert_weights_scale(float(cfg.get("routed_scaling_factor", 1.0)))
    if arch == "gpt-oss":
        w.add_expert_count(int(n_experts))
        w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
        w.add_expert_feed_forward_length(int(cfg["intermediate_size"]))
        w.add_sliding_window(int(cfg["sliding_window"]))
        want = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layer)]
        if cfg.get("layer_types", want) != want:
            raise ConvertError(f"layer_types {cfg['layer_types']} are not llama.cpp's gpt-oss pattern {want}")
        for k, fixed in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)):
            if float(cfg.get(k, fixed)) != fixed:
                w.add_float32(f"{arch}.{k}", float(cfg[k]))  # flowrt's key
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if (rp.get("rope_type") or rp.get("type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rp["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rp["original_max_position_embeddings"]))
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_fast", float(rp.get("beta_fast", 32.0)))
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_slow", float(rp.get("beta_slow", 1.0)))
        if "attention_factor" in rp:
            w.add_float32(f"{arch}.rope.scaling.yarn_attn_factor", float(rp["attention_factor"]))
        # flowrt's key: transformers' `truncate` (llama.cpp always truncates).
        w.add_bool(f"{arch}.rope.scaling.yarn_truncate", bool(rp.get("truncate", True)))

    tk = tokenizer_metadata(model_dir, vocab, cfg, pre)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tk["pre"])
    w.add_token_list(tk["tokens"])
    w.add_token_types(tk["token_type"])
    w.add_token_merges(tk["merges"])
    if tk["bos"] is not None:
        w.add_bos_token_id(tk["bos"])
    if tk["eos"] is not None:
        w.add_eos_token_id(tk["eos"])
    if tk["pad"] is not None:
        w.add_pad_token_id(tk["pad"])
    w.add_add_bos_token(tk["add_bos"])
    w.add_add_eos_token(tk["add_eos"])
    if tk["chat_template"]:
        w.add_chat_template(tk["chat_template"])

    # (HF name, or the per-expert names stacked into one tensor; GGUF name)
    plan: list = [("model.embed_tokens.weight", "token_embd.weight")]
    fused: set[str] = set()  # HF tensors read by the derived (callable) entries
    for i in range(n_layer):
        for h, g in (LFM2_LAYER_TENSORS if lfm2 else LAYER_TENSORS).items():
            hn = f"model.layers.{i}.{h}"
            if arch == "gpt-oss" and g == "ffn_norm.weight":
                g = "post_attention_norm.weight"  # llama.cpp's gpt-oss name for the FFN's input norm
            if hn in names:
                plan.append((hn, f"blk.{i}.{g}"))
        experts_at, expert_tensors = (("feed_forward", LFM2_EXPERT_TENSORS) if lfm2
                                      else ("mlp", EXPERT_TENSORS))
        for h, g in expert_tensors.items():
            hns = tuple(f"model.layers.{i}.{experts_at}.experts.{j}.{h}" for j in range(int(n_experts or 0)))
            if hns and hns[0] in names:
                plan.append((hns, f"blk.{i}.{g}"))
        # gpt-oss: fused, transposed experts (E, in, out), gate/up interleaved on the last dim.
        pre = f"model.layers.{i}.mlp.experts."
        if pre + "gate_up_proj" in names:
            gu, gub = pre + "gate_up_proj", pre + "gate_up_proj_bias"
            dn, dnb = pre + "down_proj", pre + "down_proj_bias"
            fused.update({gu, gub, dn, dnb})
            tr = lambda a: np.ascontiguousarray(np.swapaxes(a, 1, 2))  # noqa: E731
            plan += [
                (lambda gu=gu: tr(src.get(gu)[..., ::2]), f"blk.{i}.ffn_gate_exps.weight"),
                (lambda gu=gu: tr(src.get(gu)[..., 1::2]), f"blk.{i}.ffn_up_exps.weight"),
                (lambda dn=dn: tr(src.get(dn)), f"blk.{i}.ffn_down_exps.weight"),
                (lambda b=gub: src.get(b)[..., ::2], f"blk.{i}.ffn_gate_exps.bias"),
                (lambda b=gub: src.get(b)[..., 1::2], f"blk.{i}.ffn_up_exps.bias"),
                (lambda b=dnb: src.get(b), f"blk.{i}.ffn_down_exps.bias"),
            ]
    if lfm2:
        plan.append(("model.embedding_norm.weight", "token_embd_norm.weight"))
    else:
        plan.append(("model.norm.weight", "output_norm.weight"))
    if not tied:
        plan.append(("lm_head.weight", "output.weight"))
    unused = names - fused - {n for h, _ in plan if not callable(h) for n in ((h,) if isinstance(h, str) else h)}
    if unused:
        raise ConvertError(f"tensors this converter does not map: {sorted(unused)[:8]}")

    qt = qtype_for(outtype)
    counts: dict[str, int] = {}
    fallbacks = []
    for hname, gname in plan:
        if callable(hname):
            t = hname()
        else:
            t = src.get(hname) if isinstance(hname, str) else np.stack([src.get(n) for n in hname])
        if gname.endswith("shortconv.conv.weight"):
            # HF (hidden, 1, L) -> ggml [L, hidden], kept f32 as llama.cpp keeps it.
            w.add_tensor(gname, np.ascontiguousarray(t.reshape(t.shape[0], t.shape[-1]), dtype=np.float32))
            counts["F32"] = counts.get("F32", 0) + 1
            continue
        if arch == "llama" and gname.endswith("attn_q.weight"):
            t = permute_qk(t, n_head)
        elif arch == "llama" and gname.endswith("attn_k.weight"):
            t = permute_qk(t, n_kv)
        if t.ndim in (2, 3) and qt != Q.F32 and not gname.endswith(".bias"):
            want = Q.MXFP4 if outtype == "mxfp4_moe" and gname.endswith("_exps.weight") else qt
            if want not in (Q.F16,) and t.shape[-1] % 32 != 0:
                want = Q.F16
                fallbacks.append(gname)
            if want == Q.MXFP4:
                data = quantize_mxfp4(t)
            else:
                data = quantize(np.ascontiguousarray(t, dtype=np.float32), want)
            if want in (Q.F16,):
                w.add_tensor(gname, data)
            else:
                w.add_tensor(gname, data, raw_dtype=want)
            counts[want.name] = counts.get(want.name, 0) + 1
        else:
            w.add_tensor(gname, np.ascontiguousarray(t, dtype=np.float32))
            counts["F32"] = counts.get("F32", 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if fallbacks:
        log(f"row length not a multiple of 32, stored as F16: {fallbacks}")
    return {"arch": arch, "tensors": counts, "tied": tied, "bytes": out.stat().st_size}


# ---------------------------------------------------------------------------
# Verification with transformers
# ---------------------------------------------------------------------------


def verify(model_dir: Path, gguf_path: Path, n_random: int = 2) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, **kw).eval()
    gg = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, **kw).eval()
    seqs = []
    ref = model_dir / "ref.safetensors"
    if ref.is_file():
        from safetensors import safe_open

        with safe_open(str(ref), framework="pt") as f:
            seqs += [f.get_tensor(k).tolist() for k in sorted(f.keys()) if k.endswith(".input_ids")]
    g = torch.Generator().manual_seed(0)
    for n in range(n_random):
        seqs.append(torch.randint(0, hf.config.vocab_size, (24 + 8 * n,), generator=g).tolist())
    max_abs, agree, total, rel = 0.0, 0, 0, 0.0
    with torch.no_grad():
        for ids in seqs:
            x = torch.tensor([ids])
            a = hf(input_ids=x, use_cache=False).logits[0]
            b = gg(input_ids=x, use_cache=False).logits[0]
            max_abs = max(max_abs, float((a - b).abs().max()))
            rel = max(rel, float((a - b).abs().max() / a.abs().max()))
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += len(ids)
    return {"sequences": len(seqs), "positions": total, "max_abs_logit_diff": max_abs,
            "max_abs_diff_over_max_abs_logit": rel, "top1_agreement": agree / total}


def write_gguf_ref(model_dir: Path, gguf_path: Path, out: Path) -> dict:
    """REF file (see make_reference.py) for the GGUF as transformers dequantises it,
    on the input ids of <model_dir>/ref.safetensors; also runs make_reference's
    independent dequantisation check (llama arch)."""
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_reference import FORMAT_VERSION, sha256_file, verify_dequant, write_safetensors

    torch.set_num_threads(1)
    ref = model_dir / "ref.safetensors"
    with safe_open(str(ref), framework="pt") as f:
        n = int(f.metadata()["n_prompts"])
        seqs = [f.get_tensor(f"prompt.{i}.input_ids").tolist() for i in range(n)]
    lm = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                              dtype=torch.float32, attn_implementation="eager").eval()
    dq = verify_dequant(gguf_path, lm)
    tensors = []
    with torch.no_grad():
        for i, ids in enumerate(seqs):
            logits = lm(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
            tensors.append((f"prompt.{i}.input_ids", np.asarray(ids, dtype="<i8"), "I64"))
            tensors.append((f"prompt.{i}.logits_all", logits.numpy().astype("<f4"), "F32"))
    meta = {
        "format": FORMAT_VERSION, "model_file": gguf_path.name, "model_sha256": sha256_file(gguf_path),
        "model_format": "gguf", "generator": "scripts/hf_to_gguf.py --ref",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "torch_threads": "1", "compute_dtype": "f32", "logits_dtype": "f32", "n_prompts": str(len(seqs)),
        "prompts": f"input ids of {ref.name}", "prompt_token_counts": json.dumps([len(s) for s in seqs]),
        "total_token_counts": json.dumps([len(s) for s in seqs]), "append_greedy": json.dumps([0] * len(seqs)),
        "vocab_size": str(lm.config.vocab_size),
        "dequant_check": json.dumps({k: v for k, v in dq.items() if k != "details"}),
    }
    write_safetensors(out, tensors, meta)
    return {"ref": str(out), "bytes": out.stat().st_size, "dequant_ok": dq["ok"],
            "dequant_tensors": dq["tensors_checked"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Convert a small HF llama/qwen2/qwen3 directory to GGUF.")
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--outtype", choices=OUTTYPES, default="f32")
    ap.add_argument("--pre", default="gpt-2",
                    help='tokenizer.ggml.pre value (default "gpt-2", the name llama.cpp knows)')
    ap.add_argument("--name", help="general.name (default: the directory's name)")
    ap.add_argument("--ref", type=Path, metavar="FILE",
                    help="also write a REF file of the GGUF's logits (as transformers dequantises it) "
                         "on the input ids of MODEL_DIR/ref.safetensors")
    ap.add_argument("--verify", action="store_true",
                    help="load the GGUF with transformers and compare logits with the HF checkpoint")
    args = ap.parse_args(argv)
    try:
        info = convert(args.model_dir, args.out, args.outtype, args.pre, args.name)
        log(f"wrote {args.out}: {info}")
        if args.verify:
            res = verify(args.model_dir, args.out)
            log(f"verify: {json.dumps(res)}")
            print(json.dumps({"out": str(args.out), **info, "verify": res}))
        if args.ref:
            log(f"ref: {json.dumps(write_gguf_ref(args.model_dir, args.out, args.ref))}")
    except ConvertError as e:
        print(f"hf_to_gguf.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
