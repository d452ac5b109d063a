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


def main():
    fam = ROOT / "tests/fixtures/families"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--untied", type=Path, default=fam / "llama-untied",
                    help="Llama HF dir for the relabel and KV shims")
    ap.add_argument("--tied", type=Path, default=fam / "llama-tied",
                    help="Llama HF dir with tied embeddings for the duplication shim")
    ap.add_argument("-o", "--out", type=Path, default=ROOT / "tests/fixtures/shims")
    a = ap.parse_args()
    qwen3_relabel(a.untied, a.out / "qwen3-relabel")
    kv_replicated(a.untied, a.out / "kv-replicated")
    tied_duplicated(a.tied, a.out / "tied-duplicated")


if __name__ == "__main__":
    main()
