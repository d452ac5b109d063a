#!/usr/bin/env python3
"""Make tiny random-weight HF checkpoints, one per model family, with reference logits.

For each case below this writes tests/fixtures/families/<case>/ holding what
`save_pretrained` writes for an HF checkpoint, plus a reference:

  config.json              as transformers 5.x writes it (for `minicpm`: the keys
                           MiniCPM's own checkpoints use, see MINICPM below)
  model.safetensors        float32 weights, HF tensor names
  generation_config.json
  tokenizer.json           shared tiny byte-level BPE (see TOKENIZER_TEXT)
  tokenizer_config.json    bos/eos/pad tokens and a small ChatML-like chat template
  ref.safetensors          REF file (format "flowrt-ref/1", see make_reference.py):
                           prompt.{i}.input_ids I64 [T], prompt.{i}.logits_all F32 [T, vocab]
                           computed by transformers in float32, eager attention,
                           one torch thread, from the files just written.

Everything is seeded: rerunning gives byte-identical files (the script checks
the tokenizer and prints sha256 sums; compare them across runs).

Weights: every matrix ~ N(0, std) with the per-case `init` recorded in
ref.safetensors metadata ("init"); RMSNorm weights are 1 + 0.2 * N(0, 1)
(Gemma: 0.2 * N(0, 1), since Gemma's RMSNorm multiplies by 1 + w); biases
0.1 * N(0, 1). The output matrix (or the tied embedding) has a larger std so
that the top-1 logit has a clear margin; the script prints the mean top-1 margin.

Cases:
  llama-tied    LlamaForCausalLM, 16 q : 2 kv heads, head_dim 8, tied embeddings
  llama-untied  same, untied lm_head, attention_bias false, rope_theta 50000
  llama-42l     42 layers, 16 q : 2 kv, hidden 32, head_dim 4, untied
  llama3-rope   rope type llama3 (factor 8, low 1, high 4, original 32); head_dim 16
                so that one frequency falls in the smoothed band
  qwen2         Qwen2ForCausalLM with nonzero q/k/v biases; vocab_size padded
                above the tokenizer's size (rows past the tokenizer are unused ids)
  qwen3         Qwen3ForCausalLM, q/k RMSNorm with non-trivial weights, head_dim 16
                (hidden/heads = 8)
  gemma3        Gemma3ForCausalLM (model_type gemma3_text): sliding window 8 with
                layer_types [S, F, S, S, F], local/global RoPE bases 10000/500000,
                query_pre_attn_scalar 24 (head_dim 16), final_logit_softcapping 8
  mistral       MistralForCausalLM, sliding_window 16 (longest prompt is 48)
  minicpm       model_type "minicpm" (architectures MiniCPMForCausalLM), weights
                named as Llama's. transformers has no `minicpm` model, so the
                reference is computed here on top of transformers' Llama modules
                (see minicpm_forward), following MiniCPM's modeling code:
                  h0 = embed(ids) * scale_emb
                  h += attn(norm(h)) * scale_depth / sqrt(num_hidden_layers)
                  h += mlp(norm(h))  * scale_depth / sqrt(num_hidden_layers)
                  logits = lm_head(norm(h) / (hidden_size / dim_model_base))
                LongRoPE: inv_freq[j] = theta^(-2j/d) / ext_factor[j], and cos/sin
                multiplied by sqrt(1 + ln(max_pos / orig) / ln(orig)). MiniCPM builds
                its cos/sin cache once at init for seq_len = max_position_embeddings
                and only rebuilds for longer inputs, so ext_factor = long_factor
                whenever max_position_embeddings > original_max_position_embeddings,
                for every position and every prompt length (here 256 > 64, while
                all prompts are shorter than 64: a "seq_len > original" rule would
                wrongly pick short_factor).
  granite       GraniteForCausalLM (transformers' own): embedding_multiplier 6,
                attention_multiplier 0.25 (not 1/sqrt(head_dim) = 0.354),
                residual_multiplier 0.45, logits_scaling 3.5, untied
  smollm3       SmolLM3ForCausalLM (transformers' own), 5 layers with an explicit
                no_rope_layers [0, 1, 1, 0, 1] (1 = RoPE, 0 = none: layers 0 and 3
                skip RoPE; layer 0 is not what no_rope_layer_interval 4 would give),
                untied
  qwen3-yarn    Qwen3ForCausalLM with rope_parameters yarn: factor 4,
                original_max_position_embeddings 16 (the 48-token prompt goes past
                it), beta_fast/beta_slow 32/1 (defaults), attention_factor from
                0.1 ln(4) + 1 = 1.1386; head_dim 16 and rope_theta 10 so that the
                ramp runs from dimension 0 to 4: dimension 0 kept, 1-3 blended,
                4-7 divided by 4 (with theta 1e6 no dimension would fall in it)
  phi3          Phi3ForCausalLM (transformers' own), Phi-4-mini style: fused qkv_proj
                and gate_up_proj, partial_rotary_factor 0.75 (12 of head_dim 16 rotate),
                LongRoPE (short/long factors over the 6 rotated pairs,
                original_max_position_embeddings 32, max_position_embeddings 128, so
                cos/sin x sqrt(1 + ln 4 / ln 32)), sliding_window 16, 3 layers, untied.
                transformers picks LongRoPE's factor set per forward call from the
                largest position in it (long when it is >= original), so a whole
                48-token forward would rotate positions 0-31 with the long set too;
                the reference is therefore computed token by token with a KV cache
                (as a generating run does), where position p uses the long set exactly
                when p >= 32: prompts 1 and 2 cross into it.
  qwen3-moe     Qwen3MoeForCausalLM: 3 layers, 8 experts, top-k 2, expert FFN 32,
                norm_topk_prob true; layer 1 dense (mlp_only_layers [1], FFN 96);
                router weights with std 0.5 so that the top-2 choice has a margin
  gpt-oss       GptOssForCausalLM: 4 layers, sliding (window 8) and full alternating
                (layer_types, layer 0 slides), hidden 32 with 4 heads of head_dim 16
                (q width 64 != hidden), 2 KV heads, 8 experts, top-k 2, expert width 32,
                Q/K/V/O, router and expert biases, attention sinks drawn with std 1 (the
                default init leaves them near 0), swiglu_limit 0.6 so that the clamp
                bites on these small activations (alpha 1.702 as shipped), YaRN RoPE as
                the config's default (factor 32 from 4096, truncate false, theta 150000);
                experts saved as transformers 5 writes them (gate_up_proj (E, hidden,
                2I) with gate/up interleaved, down_proj (E, I, hidden))
  lfm2          Lfm2ForCausalLM: 4 layers, layer_types conv, full_attention, conv,
                full_attention; conv_L_cache 3; GQA 4:2 with head_dim 16; intermediate_size
                150 with block_auto_adjust_ff_dim (int(2/3 x 150) = 100, rounded up to
                block_multiple_of 32: the real FFN width is 128); tied embeddings;
                convolution taps with std 0.5 so that the convolution path matters
  lfm2-moe      Lfm2MoeForCausalLM: 4 layers, layer_types conv, full_attention, conv,
                full_attention; num_dense_layers 1 (layer 0 a dense SwiGLU of
                intermediate_size 96, no LFM2 width adjustment), layers 1-3 mixtures of 8
                experts, top-k 2, expert FFN 32; sigmoid router (std 0.5) whose choice adds a
                per-layer expert_bias buffer drawn N(0, 0.3^2) (transformers leaves it 0; a
                nonzero one makes the biased choice differ from plain top-k: the script
                measures and prints how often, and fails below 10 %), norm_topk_prob true
                (sum + 1e-6), routed_scaling_factor 1.7; experts saved as transformers 5
                writes them (feed_forward.experts.{j}.w1/w3/w2); tied embeddings
  lfm2-conv-bias Lfm2ForCausalLM with conv_bias true: biases (std 0.3) on every
                convolution layer's in_proj, depthwise convolution and out_proj; 3 layers
                conv, full_attention, conv; hidden 32
  gemma2        Gemma2ForCausalLM: 4 layers, sliding window 8 on layers 0 and 2 (the
                config's default alternation, written out as layer_types), one RoPE base
                10000, query_pre_attn_scalar 16 = head_dim (as the published 2B and 9B,
                so that llama.cpp runs its packs as written), attention scores soft-capped
                at 1.0 (ATTN_CAP; linear std 0.3 so that scores reach it: the script
                recomputes the reference without the cap and fails unless the logits move
                by a mean KL of at least 1e-3), final_logit_softcapping 8, tied embeddings

Sliding windows (transformers masking_utils): a query at position p attends to
key positions k with p - W < k <= p (W keys, itself included).

Usage:
  .venv-ref/bin/python scripts/make_family_fixtures.py [--out tests/fixtures/families] [--only CASE,...]
"""

from __future__ import annotations

import argparse
import hashlib
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_reference import FORMAT_VERSION, write_safetensors  # noqa: E402

SEED = 20240611
TOKENIZER_VOCAB = 320
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS, PAD = 0, 1, 2  # ids of the first three special tokens (trainer puts them first)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOKENIZER_TEXT = """
The quick brown fox jumps over the lazy dog. A tiny model has a tiny vocabulary,
and every token in it is learned from this short text. Reference logits come from
transformers; flowrt must reproduce them to within a small tolerance.
Rotary position embeddings rotate pairs of dimensions; grouped query attention
shares each key and value head among several query heads. Sliding window layers
see only the most recent tokens, while global layers see the whole prefix.
0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' " # $ % & @ ^ _ ` | ~
def forward(x): return norm(x) * weight  # Python, Rust: fn main() { println!("hi"); }
Bonjour le monde. Hallo Welt. Hola mundo. Ciao mondo. Olá mundo.
"""

# Prompt lengths (random ids): the last one is longer than every sliding window.
PROMPT_LENGTHS = [20, 33, 48]

# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

LLAMA_BASE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=16,
    num_key_value_heads=2, head_dim=8, hidden_act="silu", max_position_embeddings=128,
    rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False,
)

# Gemma 2's attention soft-cap, small enough to bend these random models' scores (the
# shipped 50 would leave them all but untouched).
ATTN_CAP = 1.0

CASES: dict[str, dict] = {
    "llama-tied": dict(
        arch="LlamaForCausalLM",
        config=dict(LLAMA_BASE, tie_word_embeddings=True, rope_theta=10000.0),
        init=dict(linear=0.08, embed=0.35, head=None),
    ),
    "llama-untied": dict(
        arch="LlamaForCausalLM",
        config=dict(LLAMA_BASE, tie_word_embeddings=False, rope_theta=50000.0, num_hidden_layers=3),
        init=dict(linear=0.08, embed=0.5, head=0.35),
    ),
    "llama-42l": dict(
        arch="LlamaForCausalLM",
        config=dict(LLAMA_BASE, hidden_size=32, intermediate_size=32, num_hidden_layers=42,
                    head_dim=4, tie_word_embeddings=False, rope_theta=10000.0),
        init=dict(linear=0.06, embed=0.5, head=0.5),
    ),
    "llama3-rope": dict(
        arch="LlamaForCausalLM",
        config=dict(LLAMA_BASE, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                         low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=32)),
        init=dict(linear=0.1, embed=0.35, head=None),
    ),
    "qwen2": dict(
        arch="Qwen2ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, hidden_act="silu",
                    max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True, vocab_size=TOKENIZER_VOCAB + 16),
        init=dict(linear=0.08, embed=0.35, head=None, bias=0.1),
    ),
    "qwen3": dict(
        arch="Qwen3ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                    max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=False, attention_bias=False),
        init=dict(linear=0.08, embed=0.5, head=0.35),
    ),
    "gemma3": dict(
        arch="Gemma3ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=5,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=128,
                    rms_norm_eps=1e-6, query_pre_attn_scalar=24, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                 "sliding_attention", "full_attention"],
                    rope_parameters={
                        "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    },
                    final_logit_softcapping=8.0, attn_logit_softcapping=None,
                    tie_word_embeddings=True),
        init=dict(linear=0.08, embed=0.35, head=None, gemma_norm=True),
    ),
    "mistral": dict(
        arch="MistralForCausalLM",
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=8, hidden_act="silu",
                    max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                    sliding_window=16, tie_word_embeddings=False),
        init=dict(linear=0.08, embed=0.5, head=0.35),
    ),
    "minicpm": dict(
        arch="MiniCPMForCausalLM",
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=2, hidden_act="silu",
                    max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                    tie_word_embeddings=False,
                    scale_emb=12.0, scale_depth=1.4, dim_model_base=16,
                    rope_scaling={"rope_type": "longrope",
                                  "long_factor": [1.0, 1.7, 3.1, 6.5],
                                  "short_factor": [1.0, 1.2, 1.5, 2.25],
                                  "original_max_position_embeddings": 64}),
        init=dict(linear=0.1, embed=0.05, head=1.2),
    ),
    # Cases below were added after the ones above; appended so that every earlier case keeps
    # its seed (SEED + 100 * (index + 1)).
    "granite": dict(
        arch="GraniteForCausalLM",
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=2, hidden_act="silu",
                    max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                    embedding_multiplier=6.0, attention_multiplier=0.25,
                    residual_multiplier=0.45, logits_scaling=3.5),
        init=dict(linear=0.1, embed=0.06, head=1.0),
    ),
    "smollm3": dict(
        arch="SmolLM3ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=5,
                    num_attention_heads=8, num_key_value_heads=2, hidden_act="silu",
                    max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                    no_rope_layers=[0, 1, 1, 0, 1], no_rope_layer_interval=4),
        init=dict(linear=0.08, embed=0.5, head=0.35),
    ),
    "qwen3-yarn": dict(
        arch="Qwen3ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                    max_position_embeddings=64, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10.0, factor=4.0,
                                         original_max_position_embeddings=16),
                    tie_word_embeddings=False, attention_bias=False),
        init=dict(linear=0.08, embed=0.5, head=0.35),
    ),
    "phi3": dict(
        arch="Phi3ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                    max_position_embeddings=128, original_max_position_embeddings=32,
                    rms_norm_eps=1e-5, sliding_window=16, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                         partial_rotary_factor=0.75,
                                         short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                         long_factor=[1.0, 1.5, 2.4, 3.9, 6.1, 9.5],
                                         original_max_position_embeddings=32)),
        init=dict(linear=0.08, embed=0.5, head=0.35),
        incremental=True,
    ),
    "qwen3-moe": dict(
        arch="Qwen3MoeForCausalLM",
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                    max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=False, attention_bias=False,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                    router_aux_loss_coef=0.0),
        init=dict(linear=0.08, embed=0.5, head=0.35, router=0.5),
    ),
    "gpt-oss": dict(
        arch="GptOssForCausalLM",
        config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"] * 2,
                    num_local_experts=8, num_experts_per_tok=2, swiglu_limit=0.6,
                    tie_word_embeddings=False, attention_bias=True, router_aux_loss_coef=0.0),
        init=dict(linear=0.1, embed=0.5, head=0.35, router=0.5, sinks=1.0),
    ),
    "lfm2": dict(
        arch="Lfm2ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=150, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=128, norm_eps=1e-5,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    tie_word_embeddings=True, conv_bias=False, conv_L_cache=3,
                    block_multiple_of=32, block_ffn_dim_multiplier=1.0,
                    block_auto_adjust_ff_dim=True,
                    layer_types=["conv", "full_attention", "conv", "full_attention"]),
        init=dict(linear=0.08, embed=0.5, head=0.35, conv=0.5),
    ),
    "lfm2-moe": dict(
        arch="Lfm2MoeForCausalLM",
        config=dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=128, norm_eps=1e-5,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    tie_word_embeddings=True, conv_bias=False, conv_L_cache=3,
                    num_dense_layers=1, num_experts=8, num_experts_per_tok=2,
                    use_expert_bias=True, norm_topk_prob=True, routed_scaling_factor=1.7,
                    layer_types=["conv", "full_attention", "conv", "full_attention"]),
        init=dict(linear=0.08, embed=0.5, head=0.35, conv=0.5, router=0.5, expert_bias=0.3),
    ),
    "lfm2-conv-bias": dict(
        arch="Lfm2ForCausalLM",
        config=dict(hidden_size=32, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=128, norm_eps=1e-5,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    tie_word_embeddings=True, conv_bias=True, conv_L_cache=3,
                    block_multiple_of=32, block_ffn_dim_multiplier=1.0,
                    block_auto_adjust_ff_dim=True,
                    layer_types=["conv", "full_attention", "conv"]),
        init=dict(linear=0.1, embed=0.5, head=0.35, conv=0.5, bias=0.3),
    ),
    "gemma2": dict(
        arch="Gemma2ForCausalLM",
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=128,
                    rms_norm_eps=1e-6, query_pre_attn_scalar=16, sliding_window=8,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    final_logit_softcapping=8.0, attn_logit_softcapping=ATTN_CAP,
                    tie_word_embeddings=True),
        init=dict(linear=0.3, embed=0.35, head=None, gemma_norm=True),
        # The attention cap must change the reference: recomputed without it, the logits
        # must move by at least this mean KL.
        cap_bites=1e-3,
    ),
}


def log(msg: str) -> None:
    print(f"[families] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [ln for ln in TOKENIZER_TEXT.strip().splitlines()]
    tok.train_from_iterator(lines * 4, trainer=trainer)
    n = tok.get_vocab_size()
    if n != TOKENIZER_VOCAB:
        raise SystemExit(f"tokenizer trained to {n} ids, expected {TOKENIZER_VOCAB}")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise SystemExit(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def write_tokenizer(tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    cfg = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": SPECIAL_TOKENS[BOS],
        "eos_token": SPECIAL_TOKENS[EOS],
        "pad_token": SPECIAL_TOKENS[PAD],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 128,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def make_config(case: dict):
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    kw = dict(case["config"])
    kw.setdefault("vocab_size", TOKENIZER_VOCAB)
    kw.update(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    arch = case["arch"]
    if arch == "MiniCPMForCausalLM":
        # The Llama skeleton MiniCPM is computed on (same tensor names); the scales and
        # LongRoPE are applied in minicpm_forward.
        for k in ("scale_emb", "scale_depth", "dim_model_base", "rope_scaling"):
            kw.pop(k)
        kw["head_dim"] = kw["hidden_size"] // kw["num_attention_heads"]
        return LlamaConfig(**kw)
    if arch in ("GraniteForCausalLM", "SmolLM3ForCausalLM", "Phi3ForCausalLM", "Qwen3MoeForCausalLM",
                "GptOssForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Gemma2ForCausalLM"):
        import transformers

        return getattr(transformers, arch.replace("ForCausalLM", "Config"))(**kw)
    cls = {"LlamaForCausalLM": LlamaConfig, "Qwen2ForCausalLM": Qwen2Config,
           "Qwen3ForCausalLM": Qwen3Config, "Gemma3ForCausalLM": Gemma3TextConfig,
           "MistralForCausalLM": MistralConfig}[arch]
    return cls(**kw)


def init_weights(model, init: dict, seed: int) -> None:
    """Deterministic init, parameter by parameter in named_parameters() order."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("conv.conv.weight") and "conv" in init:
                val = init["conv"] * z  # LFM2 convolution taps
            elif (name.endswith(("mlp.gate.weight", "mlp.router.weight", "feed_forward.gate.weight"))
                  and "router" in init):
                val = init["router"] * z  # MoE router: a clear top-k margin
            elif name.endswith("self_attn.sinks") and "sinks" in init:
                val = init["sinks"] * z  # gpt-oss: sinks that matter
            elif name.endswith("norm.weight"):
                val = 0.2 * z if init.get("gemma_norm") else 1.0 + 0.2 * z
            elif name.endswith(".bias"):
                val = init.get("bias", 0.1) * z
            elif "embed_tokens" in name:
                val = init["embed"] * z
            elif name.startswith("lm_head"):
                val = init["head"] * z
            else:
                val = init["linear"] * z
            p.copy_(val)
        # Buffers that are weights too (LFM2-MoE's expert_bias), after every parameter so
        # that the parameters' draws do not depend on them.
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias") and "expert_bias" in init:
                buf.copy_(init["expert_bias"] * torch.randn(buf.shape, generator=g, dtype=torch.float32))


def lfm2_moe_biased_choice_share(lm, prompts) -> float:
    """Share of (token, sparse layer) pairs whose top-k experts chosen with the
    expert_bias differ from a plain top-k of the sigmoid scores."""
    import torch

    differ, total, hooks = 0, 0, []

    def hook(block, args):
        nonlocal differ, total
        x = args[0].reshape(-1, args[0].shape[-1])
        scores = torch.nn.functional.linear(x, block.gate.weight).sigmoid()
        k = block.gate.top_k
        plain = torch.topk(scores, k, dim=-1).indices.sort(dim=-1).values
        biased = torch.topk(scores + block.expert_bias, k, dim=-1).indices.sort(dim=-1).values
        differ += int((plain != biased).any(dim=-1).sum())
        total += x.shape[0]

    for layer in lm.model.layers:
        if hasattr(layer.feed_forward, "expert_bias"):
            hooks.append(layer.feed_forward.register_forward_pre_hook(hook))
    with torch.no_grad():
        for ids in prompts:
            lm(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    return differ / max(total, 1)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def minicpm_config_json(case: dict, transformers_version: str) -> dict:
    """config.json with the keys MiniCPM (MiniCPM-2B / MiniCPM4) checkpoints use.
    No auto_map: no remote modeling code ships with the fixture."""
    c = case["config"]
    return {
        "architectures": ["MiniCPMForCausalLM"],
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "hidden_act": c["hidden_act"],
        "hidden_size": c["hidden_size"],
        "initializer_range": 0.1,
        "intermediate_size": c["intermediate_size"],
        "max_position_embeddings": c["max_position_embeddings"],
        "model_type": "minicpm",
        "num_attention_heads": c["num_attention_heads"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_scaling": c["rope_scaling"],
        "rope_theta": c["rope_theta"],
        "scale_emb": c["scale_emb"],
        "dim_model_base": c["dim_model_base"],
        "scale_depth": c["scale_depth"],
        "tie_word_embeddings": c["tie_word_embeddings"],
        "torch_dtype": "float32",
        "transformers_version": transformers_version,
        "use_cache": True,
        "vocab_size": TOKENIZER_VOCAB,
    }


def minicpm_longrope_cos_sin(cfg: dict, positions):
    """cos, sin [T, head_dim] as MiniCPM's MiniCPMLongRoPE builds them (float32)."""
    import torch

    d = cfg["hidden_size"] // cfg["num_attention_heads"]
    rs = cfg["rope_scaling"]
    orig = rs["original_max_position_embeddings"]
    max_pos = cfg["max_position_embeddings"]
    scale = max_pos / orig
    mscale = math.sqrt(1 + math.log(scale) / math.log(orig))
    # Cache built once for seq_len = max_position_embeddings (see module docstring).
    factors = rs["long_factor"] if max_pos > orig else rs["short_factor"]
    if len(factors) != d // 2:
        raise SystemExit(f"LongRoPE factors need {d // 2} entries, got {len(factors)}")
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    ext = torch.tensor(factors, dtype=torch.float32)
    t = positions.to(torch.float32)
    freqs = torch.outer(t, 1.0 / ext) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * mscale, emb.sin() * mscale


def minicpm_forward(lm, cfg: dict, ids: list[int]):
    """MiniCPM logits [T, vocab] (float32) using the Llama modules of `lm`."""
    import torch

    L = cfg["num_hidden_layers"]
    res_scale = cfg["scale_depth"] / math.sqrt(L)
    T = len(ids)
    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long)
        h = lm.model.embed_tokens(x) * cfg["scale_emb"]
        cos, sin = minicpm_longrope_cos_sin(cfg, torch.arange(T))
        pos_emb = (cos[None], sin[None])
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        for layer in lm.model.layers:
            a, _ = layer.self_attn(hidden_states=layer.input_layernorm(h),
                                   position_embeddings=pos_emb, attention_mask=mask)
            h = h + a * res_scale
            m = layer.mlp(layer.post_attention_layernorm(h))
            h = h + m * res_scale
        h = lm.model.norm(h)
        logits = lm.lm_head(h / (cfg["hidden_size"] / cfg["dim_model_base"]))
    return logits[0].float()


def check_minicpm_wrapper(lm) -> float:
    """With all MiniCPM scales neutral and LongRoPE factors 1 (max == original, so
    the cos/sin scale is 1), minicpm_forward must equal transformers' Llama."""
    import torch

    c = lm.config
    neutral = {
        "hidden_size": c.hidden_size, "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": c.num_hidden_layers, "rope_theta": c.rope_parameters["rope_theta"],
        "max_position_embeddings": 64, "scale_emb": 1.0,
        "scale_depth": math.sqrt(c.num_hidden_layers), "dim_model_base": c.hidden_size,
        "rope_scaling": {"long_factor": [1.0] * (c.head_dim // 2),
                         "short_factor": [1.0] * (c.head_dim // 2),
                         "original_max_position_embeddings": 64},
    }
    ids = list(range(5, 40))
    ours = minicpm_forward(lm, neutral, ids)
    with torch.no_grad():
        theirs = lm(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    return float((ours - theirs).abs().max())


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def make_prompts(vocab: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    prompts = []
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        if i == 0:
            ids[0] = BOS
        prompts.append(ids)
    return prompts


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_case(name: str, case: dict, tok, out_root: Path, prompts: list[list[int]], case_seed: int) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaForCausalLM

    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("chat_template.jinja", "special_tokens_map.json"):
        (out / stale).unlink(missing_ok=True)
    cfg = make_config(case)
    is_minicpm = case["arch"] == "MiniCPMForCausalLM"
    if is_minicpm:
        model = LlamaForCausalLM(cfg)
    else:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.float().eval()
    init_weights(model, case["init"], case_seed)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD).save_pretrained(out)
    write_tokenizer(tok, out)
    if is_minicpm:
        cj = minicpm_config_json(case, transformers.__version__)
        (out / "config.json").write_text(json.dumps(cj, indent=2) + "\n", encoding="utf-8")

    # Reference from the files on disk.
    if is_minicpm:
        lm = LlamaForCausalLM.from_pretrained(out, config=cfg, dtype=torch.float32,
                                              attn_implementation="eager").eval()
        wrapper_err = check_minicpm_wrapper(lm)
        if wrapper_err > 1e-5:
            raise SystemExit(f"minicpm wrapper disagrees with Llama at neutral settings: {wrapper_err}")
        run = lambda ids: minicpm_forward(lm, case["config"], ids)  # noqa: E731
    else:
        lm = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
        wrapper_err = None
        if "expert_bias" in case["init"]:
            # The bias must survive the save/load round trip and change the choice.
            for (na, a), (nb, b) in zip(model.named_buffers(), lm.named_buffers()):
                if na.endswith("expert_bias") and not torch.equal(a, b):
                    raise SystemExit(f"{name}: {na} did not load as saved")
            share = lfm2_moe_biased_choice_share(lm, prompts)
            log(f"{name}: expert_bias changes the top-k choice of {100 * share:.1f} % of (token, sparse layer) pairs")
            if share < 0.10:
                raise SystemExit(f"{name}: expert_bias changes only {100 * share:.1f} % of choices")

        def run(ids):
            with torch.no_grad():
                if not case.get("incremental"):
                    return lm(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
                # Token by token with a KV cache (see the phi3 case in the docstring).
                cache, rows = None, []
                for t, tok_id in enumerate(ids):
                    o = lm(input_ids=torch.tensor([[tok_id]]), position_ids=torch.tensor([[t]]),
                           past_key_values=cache, use_cache=True)
                    cache = o.past_key_values
                    rows.append(o.logits[0, -1].float())
                return torch.stack(rows)

    uncapped = None
    if "cap_bites" in case:
        # The same model with every attention module's cap removed (transformers copies the
        # config's value into each module).
        capped = [m for m in lm.modules() if getattr(m, "attn_logit_softcapping", None) is not None]
        if not capped:
            raise SystemExit(f"{name}: no module carries attn_logit_softcapping")
        for m in capped:
            m.attn_logit_softcapping = None
        uncapped = [run(ids) for ids in prompts]
        for m in capped:
            m.attn_logit_softcapping = case["config"]["attn_logit_softcapping"]
    tensors, margins, top1_frac_std, cap_kl = [], [], [], []
    for i, ids in enumerate(prompts):
        logits = run(ids)
        if uncapped is not None:
            lp, lq = torch.log_softmax(logits, -1), torch.log_softmax(uncapped[i], -1)
            cap_kl.append(float((lp.exp() * (lp - lq)).sum(-1).mean()))
        top2 = torch.topk(logits, 2, dim=-1).values
        margins.append(float((top2[:, 0] - top2[:, 1]).mean()))
        top1_frac_std.append(float(logits.std(dim=-1).mean()))
        tensors.append((f"prompt.{i}.input_ids", __import__("numpy").asarray(ids, dtype="<i8"), "I64"))
        tensors.append((f"prompt.{i}.logits_all", logits.numpy().astype("<f4"), "F32"))
    if cap_kl:
        kl = sum(cap_kl) / len(cap_kl)
        log(f"{name}: without the attention soft-cap the logits move by mean KL {kl:.3g}")
        if kl < case["cap_bites"]:
            raise SystemExit(f"{name}: the attention soft-cap moves the logits by only {kl:.3g}")
    vocab = int(logits.shape[1])
    meta = {
        "format": FORMAT_VERSION,
        "model": f"tests/fixtures/families/{name}",
        "model_format": "hf",
        "architecture": case["arch"],
        "generator": "scripts/make_family_fixtures.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": "1",
        "compute_dtype": "f32",
        "logits_dtype": "f32",
        "attn_implementation": "eager",
        "n_prompts": str(len(prompts)),
        "prompts": "random ids (seeded); see prompt_token_counts",
        "prompt_token_counts": json.dumps([len(p) for p in prompts]),
        "total_token_counts": json.dumps([len(p) for p in prompts]),
        "append_greedy": json.dumps([0] * len(prompts)),
        "reference_run": "token by token with a KV cache" if case.get("incremental") else "one forward per prompt",
        "vocab_size": str(vocab),
        "tokenizer_vocab_size": str(TOKENIZER_VOCAB),
        "seed": str(case_seed),
        "init": json.dumps(case["init"], sort_keys=True),
        "model_files": "".join(f"{sha256(out / f)}  {f}\n" for f in ["model.safetensors"]),
    }
    if is_minicpm:
        rs = case["config"]["rope_scaling"]
        meta["minicpm_rules"] = (
            "h=embed*scale_emb; h+=attn(norm(h))*scale_depth/sqrt(L); h+=mlp(norm(h))*scale_depth/sqrt(L); "
            "logits=lm_head(norm(h)/(hidden_size/dim_model_base)); LongRoPE inv_freq/factor, cos&sin*"
            "sqrt(1+ln(max_pos/orig)/ln(orig)); factors="
            + ("long_factor" if case["config"]["max_position_embeddings"] > rs["original_max_position_embeddings"]
               else "short_factor") + " (max_position_embeddings > original_max_position_embeddings)")
        meta["minicpm_wrapper_check_max_abs"] = f"{wrapper_err:.3g}"
    write_safetensors(out / "ref.safetensors", tensors, meta)
    files = {f.name: f.stat().st_size for f in sorted(out.iterdir()) if f.is_file()}
    return {
        "case": name, "arch": case["arch"], "params": n_params(model), "vocab": vocab,
        "mean_top1_margin": sum(margins) / len(margins), "mean_logit_std": sum(top1_frac_std) / len(top1_frac_std),
        "files": files, "sha_model": sha256(out / "model.safetensors")[:16],
        "sha_ref": sha256(out / "ref.safetensors")[:16], "wrapper_err": wrapper_err,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/families")
    ap.add_argument("--only", help="comma-separated case names")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    tok = build_tokenizer()
    tok_again = build_tokenizer()
    if tok.to_str() != tok_again.to_str():
        raise SystemExit("BPE training is not deterministic on this machine")
    prompts = make_prompts(TOKENIZER_VOCAB)
    names = list(CASES) if not args.only else args.only.split(",")
    rows = []
    for k, name in enumerate(CASES):
        if name not in names:
            continue
        rows.append(build_case(name, CASES[name], tok, args.out, prompts, SEED + 100 * (k + 1)))
        log(f"{name}: done ({time.perf_counter() - t0:.1f}s)")

    total = 0
    print(f"{'case':<14}{'arch':<20}{'params':>9}{'vocab':>7}{'model.st':>10}{'ref.st':>9}{'dir total':>11}"
          f"{'top1 margin':>12}{'logit std':>10}  sha256(model)[:16]")
    for r in rows:
        d = sum(r["files"].values())
        total += d
        print(f"{r['case']:<14}{r['arch']:<20}{r['params']:>9}{r['vocab']:>7}{r['files']['model.safetensors']:>10}"
              f"{r['files']['ref.safetensors']:>9}{d:>11}{r['mean_top1_margin']:>12.3f}{r['mean_logit_std']:>10.3f}"
              f"  {r['sha_model']}" + (f"  (wrapper check {r['wrapper_err']:.2g})" if r["wrapper_err"] is not None else ""))
    print(f"total bytes in {len(rows)} case directories: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
