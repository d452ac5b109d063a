#!/usr/bin/env python3
"""Reproduce the port shims of the MiniCPM5 thread (issue 15) on HF checkpoint directories.

Each shim is an HF directory (config.json, model.safetensors, tokenizer files) made from an
honest source directory:

  qwen3-relabel   a Llama relabelled as Qwen3 with injected all-ones q_norm/k_norm
                  (RMSNorm with gamma = 1 still normalises Q and K: the output changes)
  kv-replicated   KV heads replicated 4x (num_key_value_heads x4, each head's head_dim rows of
                  k_proj / v_proj repeated next to each other, which keeps GQA equivalent)
  tied-duplicated tied embeddings stored twice (lm_head.weight = embed_tokens, untied in config)

Needs only numpy and safetensors (no torch). Default: the tiny fixtures of
tests/fixtures/families/ into tests/fixtures/shims/ (what crates/flowrt-cli/tests/lint.rs uses):

    python scripts/make_port_shims.py
    python scripts/make_port_shims.py --untied SRC_DIR --tied SRC_DIR -o OUT_DIR

--gguf SRC.gguf makes the same three shims of a llama-architecture GGUF file (SmolLM2, the
default model) as GGUF files OUT_DIR/{qwen3-relabel,kv-replicated,tied-duplicated}.gguf,
copying the metadata (tokenizer, chat template) and the stored tensor bytes (no dequantising):

  qwen3-relabel    general.architecture `qwen3`, llama.* keys renamed qwen3.*, all-ones F32
                   blk.N.attn_q_norm / attn_k_norm (head_dim) in every layer. llama GGUF files
                   store attn_q / attn_k rows permuted per head for adjacent-pair RoPE, qwen3
                   files in HF's half-split (NeoX) order, so those rows are moved back (whole
                   byte rows, which works for any row-quantised type): the shim differs from
                   its source only by the injected QK-norm, the thread's one change.
  kv-replicated    attn_k / attn_v rows of each KV head repeated (head_count_kv x FACTOR). The
                   llama permutation stays inside each head, so whole heads are copied as
                   stored. FACTOR is the thread's 4 when the query heads allow it, otherwise
                   the largest that does (SmolLM2's 9 query / 3 KV heads allow only 3: 9:9).
  tied-duplicated  output.weight added as a copy of token_embd.weight's bytes.

The files are ~100 MB each for SmolLM2: write them to a scratch directory, never the repo.
flowrt's own test (crates/flowrt-cli/tests/lint.rs) builds the same shims in Rust. Needs the
`gguf` package (gguf-py, tested with 0.19.0) in the venv:

    .venv-text/bin/pip install gguf==0.19.0
    .venv-text/bin/python scripts/make_port_shims.py --gguf $FLOWRT_SMOLLM2_GGUF -o /tmp/shims
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
TEXT_FILES = ["tokenizer.json", "tokenizer_config.json", "generation_config.json",
              "special_tokens_map.json", "chat_template.jinja"]


def load(src: Path):
    config = json.loads((src / "config.json").read_text())
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        if f.name.startswith("model"):
            tensors.update(load_file(str(f)))
    if not tensors:
        raise SystemExit(f"{src}: no model*.safetensors")
    return config, tensors


def write(out: Path, src: Path, config: dict, tensors: dict):
    out.mkdir(parents=True, exist_ok=True)
    for name in TEXT_FILES:
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {out}")


def layers(config):
    return range(config["num_hidden_layers"])


def head_dim(config):
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def qwen3_relabel(src: Path, out: Path):
    config, t = load(src)
    assert config["model_type"] == "llama", "the relabel shim starts from a Llama"
    config["model_type"] = "qwen3"
    config["architectures"] = ["Qwen3ForCausalLM"]
    config["head_dim"] = head_dim(config)
    config.setdefault("use_sliding_window", False)
    hd = head_dim(config)
    for i in layers(config):
        dt = t[f"model.layers.{i}.input_layernorm.weight"].dtype
        t[f"model.layers.{i}.self_attn.q_norm.weight"] = np.ones(hd, dtype=dt)
        t[f"model.layers.{i}.self_attn.k_norm.weight"] = np.ones(hd, dtype=dt)
    write(out, src, config, t)


def kv_replicated(src: Path, out: Path, factor: int = 4):
    config, t = load(src)
    hd = head_dim(config)
    n_kv = config.get("num_key_value_heads", config["num_attention_heads"])
    assert config["num_attention_heads"] % (n_kv * factor) == 0, "query heads must cover the copies"
    for i in layers(config):
        for p in ("k_proj", "v_proj"):
            for kind in ("weight", "bias"):
                name = f"model.layers.{i}.self_attn.{p}.{kind}"
                if name not in t:
                    continue
                w = t[name]
                heads = w.reshape(n_kv, hd, *w.shape[1:])
                t[name] = np.repeat(heads, factor, axis=0).reshape(n_kv * factor * hd, *w.shape[1:])
    config["num_key_value_heads"] = n_kv * factor
    write(out, src, config, t)


def tied_duplicated(src: Path, out: Path):
    config, t = load(src)
    assert "lm_head.weight" not in t, "the duplication shim starts from tied embeddings"
    t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
    config["tie_word_embeddings"] = False
    write(out, src, config, t)


def gguf_field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def gguf_copy(src: Path, out: Path, arch: str, tensors, rename_keys=lambda k: k, values=None):
    """Write `out` with `src`'s metadata (keys through `rename_keys`, values replaced from
    `values` by new key) and `tensors`: a list of (name, array, ggml type) in file order;
    quantised arrays are uint8 rows of bytes."""
    values = values or {}
    import gguf
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        key = rename_keys(key)
        w.add_key_value(key, values.get(key, f.contents()), vtype, sub_type=sub)
    for name, data, ty in tensors:
        w.add_tensor(name, np.ascontiguousarray(data), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}")


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama GGUF's per-head adjacent-pair row order back to HF's half-split order: stored row
    h*hd + 2i + j holds HF row h*hd + j*hd/2 + i."""
    hd = rows.shape[0] // n_head
    return rows.reshape(n_head, hd // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def gguf_shims(src: Path, out: Path, kv_factor: int | None):
    import gguf
    r = gguf.GGUFReader(str(src))
    arch = gguf_field(r, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"{src}: general.architecture is {arch!r}; the GGUF shims start from llama")
    n_head = int(gguf_field(r, "llama.attention.head_count"))
    n_kv = int(gguf_field(r, "llama.attention.head_count_kv") or n_head)
    n_layer = int(gguf_field(r, "llama.block_count"))
    hidden = int(gguf_field(r, "llama.embedding_length"))
    hd = int(gguf_field(r, "llama.attention.key_length") or hidden // n_head)
    stored = [(t.name, np.asarray(t.data), t.tensor_type) for t in r.tensors]
    names = {n for n, _, _ in stored}
    out.mkdir(parents=True, exist_ok=True)

    # Qwen3 relabel: un-permuted Q/K rows, injected all-ones QK-norm.
    relabel = []
    for name, data, ty in stored:
        if name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = n_head if ".attn_q." in name else n_kv
            data = unpermute_rows(data, heads)
        relabel.append((name, data, ty))
    for i in range(n_layer):
        for norm in ("attn_q_norm", "attn_k_norm"):
            relabel.append((f"blk.{i}.{norm}.weight", np.ones(hd, dtype=np.float32),
                            gguf.GGMLQuantizationType.F32))
    relabel_keys = lambda k: "qwen3." + k[len("llama."):] if k.startswith("llama.") else k  # noqa: E731
    gguf_copy(src, out / "qwen3-relabel.gguf", "qwen3", relabel, relabel_keys)

    # KV heads replicated.
    if kv_factor is None:
        fits = [f for f in range(2, n_head // n_kv + 1) if n_head % (n_kv * f) == 0]
        if not fits:
            raise SystemExit(f"{src}: {n_head} query heads leave no room to replicate {n_kv} KV heads")
        kv_factor = 4 if 4 in fits else fits[-1]
    if n_head % (n_kv * kv_factor):
        raise SystemExit(f"{n_head} query heads are not a multiple of {n_kv} x {kv_factor} KV heads")
    kv = []
    for name, data, ty in stored:
        if name.endswith((".attn_k.weight", ".attn_v.weight")):
            data = np.repeat(data.reshape(n_kv, hd, -1), kv_factor, axis=0).reshape(
                n_kv * kv_factor * hd, -1)
        kv.append((name, data, ty))
    print(f"KV heads {n_kv} -> {n_kv * kv_factor} ({n_head} query heads)")
    gguf_copy(src, out / "kv-replicated.gguf", "llama", kv,
              values={"llama.attention.head_count_kv": n_kv * kv_factor})

    # Tied embeddings stored twice.
    if "output.weight" in names:
        print(f"skipped tied-duplicated.gguf: {src} stores output.weight already (untied "
              "embeddings), and the duplication shim starts from tied ones")
        return
    embd = next((d, ty) for n, d, ty in stored if n == "token_embd.weight")
    gguf_copy(src, out / "tied-duplicated.gguf", "llama",
              stored + [("output.weight", embd[0].copy(), embd[1])])


def main():
    fam = ROOT / "tests/fixtures/families"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--untied", type=Path, default=fam / "llama-untied",
                    help="Llama HF dir for the relabel and KV shims")
    ap.add_argument("--tied", type=Path, default=fam / "llama-tied",
                    help="Llama HF dir with tied embeddings for the duplication shim")
    ap.add_argument("--gguf", type=Path, help="a llama GGUF file: make GGUF shims of it instead")
    ap.add_argument("--kv-factor", type=int, help="KV replication of the GGUF shim (default: 4 "
                    "if the query heads allow it, else the largest factor they allow)")
    ap.add_argument("-o", "--out", type=Path, default=ROOT / "tests/fixtures/shims")
    a = ap.parse_args()
    if a.gguf:
        if a.out == ROOT / "tests/fixtures/shims":
            raise SystemExit("--gguf shims are ~100 MB each: give -o a scratch directory")
        gguf_shims(a.gguf, a.out, a.kv_factor)
        return
    qwen3_relabel(a.untied, a.out / "qwen3-relabel")
    kv_replicated(a.untied, a.out / "kv-replicated")
    tied_duplicated(a.tied, a.out / "tied-duplicated")


if __name__ == "__main__":
    main()
