#!/usr/bin/env python3
"""Write teacher-forced reference logits ("REF" files) for flowrt golden tests.

The reference is Hugging Face `transformers` running the model in float32 on the
CPU with one torch thread. For a GGUF file, transformers dequantises every tensor
to float (and un-permutes llama Q/K), so the reference sees exactly the GGUF's
dequantised weights; `--verify-dequant` checks that claim against an independent
decoder of the GGUF blocks.

REF format (safetensors), for each prompt i = 0, 1, ...:
  prompt.{i}.input_ids   I64 [T]          the exact token ids fed to the model
                                          (BOS / chat-template tokens included;
                                          flowrt must add nothing)
  prompt.{i}.logits_all  F32|F16|BF16 [T, vocab]
                                          logits at every position for those ids
Compact variant for big vocabularies (--topk K): instead of logits_all,
  prompt.{i}.topk_ids    I64 [T, K]       ids of the K largest logits per position,
                                          sorted by logit, descending (torch.topk)
  prompt.{i}.topk_logits F32 [T, K]       those logits (f32, as computed)
  prompt.{i}.logsumexp   F32 [T]          logsumexp of the full f32 logits row, so
                                          log-probabilities of the stored ids are
                                          topk_logits - logsumexp
and the metadata records "topk" (K) with "logits_dtype" "topk-f32".

The `__metadata__` map (strings) records the model file and its sha256, the
library versions, the prompts (JSON), which were chat-templated, how many ids of
each sequence came from the prompt (the rest are greedy tokens appended with
--append-greedy), and the settings used.

Setup (once; needs PyPI):
  python3 -m venv .venv-ref
  .venv-ref/bin/pip install -r scripts/requirements-reference.txt

Example:
  .venv-ref/bin/python scripts/make_reference.py \\
      --model SmolLM2-135M-Instruct.Q4_1.gguf \\
      --prompts tests/fixtures/ref/smollm2-q4_1.prompts.json \\
      --out tests/fixtures/ref/smollm2-q4_1.safetensors \\
      --logits-dtype f16 --append-greedy 24 --verify-dequant

Prompts file: a JSON list of objects
  {"text": "...", "chat": false}                      plain completion
  {"text": "...", "chat": true, "system": "..."}      chat; "system" optional
  optional per prompt: "append_greedy": N             overrides --append-greedy
Chat prompts are rendered with the tokenizer's chat template (or the Jinja file
given with --chat-template, for GGUF files that carry none; recorded in the
metadata as "chat_template_override"; add_generation_prompt=True) and then tokenised without adding special tokens.
Plain prompts are tokenised with only the BOS token the tokenizer adds by
default (none if it adds none); any other special tokens it would add are not
added.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

# Never reach for the network: everything must come from local files.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FORMAT_VERSION = "flowrt-ref/1"
LOGITS_DTYPES = ("f32", "f16", "bf16")


class RefError(Exception):
    """An error the user can fix (bad path, bad prompts file, ...)."""


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="make_reference.py",
        description=(
            "Write teacher-forced HF transformers reference logits (safetensors) "
            "for a GGUF file or an HF model directory and a list of prompts."
        ),
        epilog=(
            "Output tensors per prompt i: prompt.{i}.input_ids (I64 [T]) and "
            "prompt.{i}.logits_all ([T, vocab]), or with --topk K prompt.{i}.topk_ids, "
            "prompt.{i}.topk_logits ([T, K]) and prompt.{i}.logsumexp ([T]). See the "
            "module docstring for the prompts file format."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        type=Path,
        help="a .gguf file, or a Hugging Face model directory (config.json + weights + tokenizer)",
    )
    p.add_argument(
        "--prompts",
        required=True,
        type=Path,
        help='JSON list of {"text": str, "chat": bool, "system": str (optional), "append_greedy": int (optional)}',
    )
    p.add_argument("--out", required=True, type=Path, help="output .safetensors path")
    p.add_argument(
        "--logits-dtype",
        choices=LOGITS_DTYPES,
        default="f32",
        help="dtype the logits are stored in (computed in f32 either way; default f32)",
    )
    p.add_argument(
        "--append-greedy",
        type=int,
        default=0,
        metavar="N",
        help=(
            "after each prompt, append up to N greedy tokens generated by the reference "
            "model (stops after an EOS token); their logits are stored too (default 0)"
        ),
    )
    p.add_argument(
        "--no-stop-at-eos",
        action="store_true",
        help="with --append-greedy, keep generating past an EOS token",
    )
    p.add_argument(
        "--summary",
        type=Path,
        help=(
            "also write a small JSON summary: per prompt the token counts, the decoded "
            "greedy continuation and the top-5 ids/logits at the last prompt position"
        ),
    )
    p.add_argument(
        "--verify-dequant",
        action="store_true",
        help=(
            "GGUF (llama arch) only: check that the weights transformers loaded equal an "
            "independent dequantisation of the GGUF blocks (with the Q/K un-permutation); "
            "fails if not, and records the result in the metadata"
        ),
    )
    p.add_argument(
        "--topk",
        type=int,
        default=0,
        metavar="K",
        help=(
            "store only the K largest logits per position (prompt.{i}.topk_ids, "
            "prompt.{i}.topk_logits, F32) and the full-row logsumexp (prompt.{i}.logsumexp) "
            "instead of logits_all; for big vocabularies (default 0: store logits_all)"
        ),
    )
    p.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="Jinja chat template to use instead of the tokenizer's own (e.g. a GGUF without one)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1, which is what the committed fixtures use)",
    )
    args = p.parse_args(argv)
    if args.append_greedy < 0:
        p.error("--append-greedy must be >= 0")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.topk < 0:
        p.error("--topk must be >= 0")
    if args.topk and args.logits_dtype != "f32":
        p.error("--topk stores f32 logits; leave --logits-dtype at f32")
    return args


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------


def load_prompts(path: Path, default_greedy: int) -> list[dict]:
    if not path.is_file():
        raise RefError(f"prompts file not found: {path}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RefError(f"prompts file {path} is not valid JSON: {e}") from e
    if not isinstance(raw, list) or not raw:
        raise RefError(f"prompts file {path} must hold a non-empty JSON list")
    prompts = []
    allowed = {"text", "chat", "system", "append_greedy"}
    for i, item in enumerate(raw):
        where = f"{path}: prompt {i}"
        if not isinstance(item, dict):
            raise RefError(f"{where}: expected an object, got {type(item).__name__}")
        extra = set(item) - allowed
        if extra:
            raise RefError(f"{where}: unknown keys {sorted(extra)} (allowed: {sorted(allowed)})")
        text = item.get("text")
        if not isinstance(text, str) or not text:
            raise RefError(f'{where}: "text" must be a non-empty string')
        chat = item.get("chat", False)
        if not isinstance(chat, bool):
            raise RefError(f'{where}: "chat" must be true or false')
        system = item.get("system")
        if system is not None and (not isinstance(system, str) or not chat):
            raise RefError(f'{where}: "system" must be a string and needs "chat": true')
        greedy = item.get("append_greedy", default_greedy)
        if not isinstance(greedy, int) or isinstance(greedy, bool) or greedy < 0:
            raise RefError(f'{where}: "append_greedy" must be an integer >= 0')
        prompts.append({"text": text, "chat": chat, "system": system, "append_greedy": greedy})
    return prompts


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_model(model: Path) -> dict:
    """Name and content hash of the model (for a directory: of its weight files)."""
    if model.is_file():
        return {"model_file": model.name, "model_sha256": sha256_file(model), "model_format": "gguf"}
    weights = sorted(
        p for p in model.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt")
    )
    if not weights:
        raise RefError(f"no weight files (*.safetensors, *.bin) in model directory {model}")
    manifest = "".join(f"{sha256_file(p)}  {p.name}\n" for p in weights)
    return {
        "model_file": model.name,
        "model_sha256": hashlib.sha256(manifest.encode()).hexdigest(),
        "model_format": "hf",
        "model_files": manifest,
    }


def check_model_path(model: Path) -> None:
    if not model.exists():
        raise RefError(f"model not found: {model}")
    if model.is_file():
        with model.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise RefError(f"{model} is not a GGUF file (no GGUF magic); pass a .gguf file or an HF directory")
    elif not (model / "config.json").is_file():
        raise RefError(f"{model} is a directory without config.json; is it an HF model directory?")


def load_model(model: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model.is_file():
        kw = {"gguf_file": model.name}
        where = str(model.parent)
    else:
        kw = {}
        where = str(model)
    tok = AutoTokenizer.from_pretrained(where, **kw)
    lm = AutoModelForCausalLM.from_pretrained(
        where, dtype=torch.float32, attn_implementation="eager", **kw
    )
    lm.eval()
    return tok, lm


# --------------------------------------------------------------------------
# Tokenisation
# --------------------------------------------------------------------------


def tokenize_prompt(tok, prompt: dict) -> tuple[list[int], str]:
    """Return (ids, the text that was tokenised)."""
    if prompt["chat"]:
        if not getattr(tok, "chat_template", None):
            raise RefError("a prompt has \"chat\": true but the tokenizer has no chat template")
        messages = []
        if prompt["system"] is not None:
            messages.append({"role": "system", "content": prompt["system"]})
        messages.append({"role": "user", "content": prompt["text"]})
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # The template already holds whatever BOS it wants: add nothing more.
        return list(tok(rendered, add_special_tokens=False)["input_ids"]), rendered
    text = prompt["text"]
    plain = list(tok(text, add_special_tokens=False)["input_ids"])
    default = list(tok(text)["input_ids"])
    bos = tok.bos_token_id
    if bos is not None and default[:1] == [bos] and plain[:1] != [bos]:
        return [bos] + plain, text
    return plain, text


# --------------------------------------------------------------------------
# Forward passes
# --------------------------------------------------------------------------


def full_logits(lm, ids: list[int]):
    """Teacher-forced logits [T, vocab] in float32 for `ids` (one forward, no cache)."""
    import torch

    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long)
        out = lm(input_ids=x, use_cache=False)
    return out.logits[0].float()


def append_greedy(lm, ids: list[int], n: int, eos: set[int]) -> list[int]:
    """Extend `ids` by up to n argmax tokens, recomputing the whole sequence each step
    (no KV cache), so each choice is the argmax of the same computation that is stored."""
    seq = list(ids)
    for _ in range(n):
        nxt = int(full_logits(lm, seq)[-1].argmax())
        seq.append(nxt)
        if nxt in eos:
            break
    return seq


# --------------------------------------------------------------------------
# GGUF dequantisation check
# --------------------------------------------------------------------------

QK = 32  # elements per block for Q4_0 / Q4_1 / Q8_0


def decode_gguf_blocks(ttype: str, raw, n_elems: int):
    """Independent float decode of GGUF block data (flat, row-major), numpy only."""
    import numpy as np

    raw = np.asarray(raw).view(np.uint8).reshape(-1)
    if ttype == "F32":
        return raw.view("<f4")[:n_elems].astype(np.float64)
    if ttype == "F16":
        return raw.view("<f2")[:n_elems].astype(np.float64)
    if ttype == "Q8_0":  # f16 scale d, 32 x int8 q; x = d * q
        b = raw.reshape(-1, 2 + QK)
        d = b[:, :2].copy().view("<f2").astype(np.float64)
        q = b[:, 2:].view(np.int8).astype(np.float64)
        return (d * q).reshape(-1)[:n_elems]
    if ttype == "Q4_0":  # f16 d, 16 bytes of nibbles; x = d * (nibble - 8)
        b = raw.reshape(-1, 2 + QK // 2)
        d = b[:, :2].copy().view("<f2").astype(np.float64)
        qs = b[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64) - 8.0
        return (d * q).reshape(-1)[:n_elems]
    if ttype == "Q4_1":  # f16 d, f16 m, 16 bytes of nibbles; x = d * nibble + m
        b = raw.reshape(-1, 4 + QK // 2)
        d = b[:, 0:2].copy().view("<f2").astype(np.float64)
        m = b[:, 2:4].copy().view("<f2").astype(np.float64)
        qs = b[:, 4:]
        # low nibbles are elements 0..15 of the block, high nibbles 16..31
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
        return (d * q + m).reshape(-1)[:n_elems]
    return None


def unpermute_rows(w, n_head: int):
    """Undo the GGUF llama Q/K row permutation (GGUF rows pair rotary dims as
    adjacent pairs per head; HF pairs the two halves of each head)."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def verify_dequant(gguf_path: Path, lm, n_layers_checked: int = 2) -> dict:
    """Compare transformers' loaded weights with an independent decode of the GGUF."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise RefError(f"--verify-dequant supports llama-arch GGUF only (this is {arch!r})")
    n_head = int(reader.fields["llama.attention.head_count"].contents())
    n_kv = int(reader.fields["llama.attention.head_count_kv"].contents())
    n_layer = int(reader.fields["llama.block_count"].contents())
    sd = lm.state_dict()
    per_block = {
        "attn_q": ("self_attn.q_proj", n_head),
        "attn_k": ("self_attn.k_proj", n_kv),
        "attn_v": ("self_attn.v_proj", None),
        "attn_output": ("self_attn.o_proj", None),
        "ffn_gate": ("mlp.gate_proj", None),
        "ffn_up": ("mlp.up_proj", None),
        "ffn_down": ("mlp.down_proj", None),
        "attn_norm": ("input_layernorm", None),
        "ffn_norm": ("post_attention_layernorm", None),
    }
    layers = sorted({0, n_layer - 1} | set(range(min(n_layers_checked, n_layer))))
    plan = {"token_embd.weight": ("model.embed_tokens.weight", None), "output_norm.weight": ("model.norm.weight", None)}
    for i in layers:
        for g, (h, perm) in per_block.items():
            plan[f"blk.{i}.{g}.weight"] = (f"model.layers.{i}.{h}.weight", perm)
    by_name = {t.name: t for t in reader.tensors}
    if "output.weight" in by_name:
        plan["output.weight"] = ("lm_head.weight", None)
    results = []
    for gname, (hname, perm) in plan.items():
        if gname not in by_name:
            raise RefError(f"--verify-dequant: tensor {gname} missing from {gguf_path.name}")
        t = by_name[gname]
        ttype = t.tensor_type.name
        shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists ne0 (fastest) first
        n = int(np.prod(shape))
        ours = decode_gguf_blocks(ttype, t.data, n)
        ref_lib = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
        if ours is None:
            ours_arr = ref_lib
            decoder = "gguf.quants"
        else:
            ours_arr = ours.reshape(shape)
            decoder = "own"
            if not np.array_equal(ours_arr, ref_lib):
                raise RefError(f"own {ttype} decode of {gname} differs from gguf.quants.dequantize")
        if perm is not None:
            ours_arr = unpermute_rows(ours_arr, perm)
        if hname not in sd:
            raise RefError(f"--verify-dequant: transformers has no tensor {hname}")
        theirs = sd[hname].detach().cpu().numpy().astype(np.float64)
        if theirs.shape != ours_arr.shape:
            raise RefError(f"{gname} -> {hname}: shape {theirs.shape} != GGUF {ours_arr.shape}")
        # transformers holds f32; our decode is f64 of the same f32/f16 products.
        max_abs = float(np.max(np.abs(theirs - ours_arr.astype(np.float32).astype(np.float64))))
        results.append({"gguf": gname, "hf": hname, "type": ttype, "decoder": decoder,
                        "unpermuted": perm is not None, "max_abs_diff": max_abs})
    tied = bool(getattr(lm.config, "tie_word_embeddings", False))
    if tied and "output.weight" not in by_name:
        emb = sd["model.embed_tokens.weight"]
        head = lm.get_output_embeddings().weight
        if not bool((emb == head).all()):
            raise RefError("tied embeddings: lm_head weight differs from token_embd")
    bad = [r for r in results if r["max_abs_diff"] != 0.0]
    summary = {
        "ok": not bad,
        "tensors_checked": len(results),
        "types": sorted({r["type"] for r in results}),
        "layers_checked": layers,
        "tied_lm_head_equals_token_embd": tied and "output.weight" not in by_name,
        "worst_max_abs_diff": max(r["max_abs_diff"] for r in results),
        "details": results,
    }
    if bad:
        raise RefError("dequantisation mismatch:\n" + json.dumps(bad, indent=1))
    return summary


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def write_safetensors(path: Path, tensors: list[tuple[str, "np.ndarray", str]], metadata: dict) -> None:
    """Deterministic safetensors writer: keys in the given order, data in that order,
    header JSON with sorted keys, padded with spaces to a multiple of 8 bytes."""
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    blobs = []
    for name, arr, st_dtype in tensors:
        data = arr.tobytes(order="C")
        header[name] = {"dtype": st_dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    hjson = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(len(hjson).to_bytes(8, "little"))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    tmp.replace(path)


def to_storage(logits, dtype: str):
    """float32 torch tensor -> (numpy array of the stored bits, safetensors dtype)."""
    import numpy as np
    import torch

    if dtype == "f32":
        return logits.numpy().astype("<f4"), "F32"
    if dtype == "f16":
        arr = logits.to(torch.float16)
        if not bool(torch.isfinite(arr).all()):
            raise RefError("logits overflow F16; use --logits-dtype f32 or bf16")
        return arr.numpy().astype("<f2"), "F16"
    # bf16: keep the raw 16-bit patterns (round-to-nearest-even by torch)
    bits = logits.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").view(np.uint16)
    return bits, "BF16"


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    check_model_path(args.model)
    prompts = load_prompts(args.prompts, args.append_greedy)
    if args.verify_dequant and not args.model.is_file():
        raise RefError("--verify-dequant needs a GGUF file as --model")

    import numpy as np  # noqa: F401  (checked here so a missing install fails early)
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    info = describe_model(args.model)
    log(f"model {args.model} sha256 {info['model_sha256']}")
    tok, lm = load_model(args.model)
    template_override = None
    if args.chat_template is not None:
        if not args.chat_template.is_file():
            raise RefError(f"chat template file not found: {args.chat_template}")
        template_override = args.chat_template.read_text(encoding="utf-8")
        tok.chat_template = template_override
    t_load = time.perf_counter()
    log(f"loaded in {t_load - t0:.1f}s: {lm.config.model_type}, {lm.config.num_hidden_layers} layers, "
        f"vocab {lm.config.vocab_size}")

    dequant = None
    if args.verify_dequant:
        dequant = verify_dequant(args.model, lm)
        log(f"dequant check ok: {dequant['tensors_checked']} tensors ({', '.join(dequant['types'])}), "
            f"worst max|diff| {dequant['worst_max_abs_diff']}")

    eos: set[int] = set()
    if not args.no_stop_at_eos:
        for e in (tok.eos_token_id, getattr(lm.generation_config, "eos_token_id", None)):
            if isinstance(e, int):
                eos.add(e)
            elif isinstance(e, (list, tuple)):
                eos.update(int(x) for x in e)

    tensors = []
    summary_prompts = []
    prompt_lens = []
    total_len = []
    rendered_texts = []
    for i, pr in enumerate(prompts):
        ids, rendered = tokenize_prompt(tok, pr)
        if not ids:
            raise RefError(f"prompt {i} tokenised to zero tokens")
        seq = append_greedy(lm, ids, pr["append_greedy"], eos) if pr["append_greedy"] else ids
        logits = full_logits(lm, seq)  # [T, vocab] f32
        vocab = logits.shape[1]
        # The stored logits must reproduce the greedy choices (guards near-ties).
        for p in range(len(ids), len(seq)):
            if int(logits[p - 1].argmax()) != seq[p]:
                log(f"warning: prompt {i} position {p - 1}: argmax of stored logits "
                    f"{int(logits[p - 1].argmax())} != greedy token {seq[p]} (near-tie)")
        tensors.append((f"prompt.{i}.input_ids", np.asarray(seq, dtype="<i8"), "I64"))
        if args.topk:
            k = min(args.topk, vocab)
            top_all = torch.topk(logits, k, dim=-1, largest=True, sorted=True)
            lse = torch.logsumexp(logits, dim=-1)
            tensors.append((f"prompt.{i}.topk_ids", top_all.indices.numpy().astype("<i8"), "I64"))
            tensors.append((f"prompt.{i}.topk_logits", top_all.values.numpy().astype("<f4"), "F32"))
            tensors.append((f"prompt.{i}.logsumexp", lse.numpy().astype("<f4"), "F32"))
        else:
            arr, st_dtype = to_storage(logits, args.logits_dtype)
            tensors.append((f"prompt.{i}.logits_all", arr, st_dtype))
        prompt_lens.append(len(ids))
        total_len.append(len(seq))
        rendered_texts.append(rendered)
        last = logits[len(ids) - 1]
        top = torch.topk(last, 5)
        summary_prompts.append({
            "index": i,
            "text": pr["text"],
            "chat": pr["chat"],
            "prompt_tokens": len(ids),
            "total_tokens": len(seq),
            "vocab": int(vocab),
            "greedy_ids": seq[len(ids):],
            "greedy_text": tok.decode(seq[len(ids):], skip_special_tokens=False),
            "top5_at_last_prompt_position": {
                "ids": [int(x) for x in top.indices],
                "logits": [float(x) for x in top.values],
                "tokens": [tok.decode([int(x)]) for x in top.indices],
            },
        })
        log(f"prompt {i}: {len(ids)} prompt + {len(seq) - len(ids)} greedy = {len(seq)} positions")

    metadata = {
        "format": FORMAT_VERSION,
        **info,
        "generator": "scripts/make_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": str(args.threads),
        "compute_dtype": "f32",
        "logits_dtype": "topk-f32" if args.topk else args.logits_dtype,
        "n_prompts": str(len(prompts)),
        "prompts": json.dumps(
            [{"text": p["text"], "chat": p["chat"], "system": p["system"]} for p in prompts],
            ensure_ascii=False),
        "chat_templated": json.dumps([p["chat"] for p in prompts]),
        "rendered_prompts": json.dumps(rendered_texts, ensure_ascii=False),
        "prompt_token_counts": json.dumps(prompt_lens),
        "total_token_counts": json.dumps(total_len),
        "append_greedy": json.dumps([p["append_greedy"] for p in prompts]),
        "greedy_stops_at_eos": json.dumps(sorted(eos)),
        "vocab_size": str(int(lm.config.vocab_size)),
    }
    try:
        import gguf

        metadata["gguf_version"] = getattr(gguf, "__version__", None) or _dist_version("gguf")
    except ImportError:
        pass
    if args.topk:
        metadata["topk"] = str(args.topk)
    if template_override is not None:
        metadata["chat_template_override"] = template_override
    if dequant is not None:
        metadata["dequant_check"] = json.dumps(
            {k: v for k, v in dequant.items() if k != "details"})

    write_safetensors(args.out, tensors, metadata)
    t_end = time.perf_counter()
    log(f"wrote {args.out} ({args.out.stat().st_size} bytes, {sum(total_len)} positions) "
        f"in {t_end - t0:.1f}s total ({t_end - t_load:.1f}s after loading)")

    if args.summary is not None:
        out = {
            "ref": str(args.out),
            "model_file": info["model_file"],
            "model_sha256": info["model_sha256"],
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "prompts": summary_prompts,
        }
        if dequant is not None:
            out["dequant_check"] = dequant
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        log(f"wrote summary {args.summary}")
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def log(msg: str) -> None:
    print(f"[make_reference] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except RefError as e:
        print(f"make_reference.py: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(
            f"make_reference.py: error: {e}\n"
            "install the reference tooling first:\n"
            "  python3 -m venv .venv-ref && .venv-ref/bin/pip install -r scripts/requirements-reference.txt",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
