#!/usr/bin/env python3
"""Make the Hugging Face tokenizer-directory fixtures that crates/flowrt-text is tested against.

Writes crates/flowrt-text/tests/fixtures/hf/<name>/ for each fixture: the files a checkpoint
directory carries (tokenizer.json, tokenizer_config.json, generation_config.json and, for one,
chat_template.jinja) plus golden.json: what HF does with them.

  bytelevel  byte-level BPE (GPT-2 style) trained here; ChatML special tokens; BOS comes from
             the tokenizer.json post-processor (TemplateProcessing), as tokenizer_config.json
             has no add_bos_token; eos_token written as an {"content": ...} object; a
             non-special added token <think>; chat template in chat_template.jinja.
  spm        SentencePiece-style BPE: Metaspace(prepend_scheme="first") pre-tokenizer,
             <0x00>..<0xFF> byte-fallback tokens, <unk>/<s>/</s>, Gemma-style
             <start_of_turn>/<end_of_turn>; decoder Replace("\u2581", " ") + ByteFallback + Fuse +
             Strip(" ", 1, 0) (Llama's); BOS from a TemplateProcessing post-processor, and
             add_bos_token=true in tokenizer_config.json; chat template as a list of
             {name, template} in tokenizer_config.json.
  spm_gemma  the spm vocab with Gemma's pipeline: normalizer Replace(" ", "\u2581"), no
             pre-tokenizer, decoder without Strip; chat_template a plain string;
             generation_config eos_token_id a list.

References (golden.json), all from transformers 5 AutoTokenizer.from_pretrained(<dir>) (a
PreTrainedTokenizerFast over tokenizers' Rust core), for every string of
scripts/make_text_goldens.py's corpus plus a few more:
  ids                    tok(text, add_special_tokens=False)
  ids_no_parse_special   the same with special tokens taken as text (split_special_tokens)
  ids_add_special        tok(text)["input_ids"]  (what HF adds: BOS / post-processor)
  decoded, decoded_skip_special   tok.decode(ids, skip_special_tokens=False / True)
and chat renders: tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=...).

Run (no network, no hub):
  .venv-ref/bin/python scripts/make_hf_tokenizer_fixtures.py
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "flowrt-text" / "tests" / "fixtures" / "hf"
sys.path.insert(0, str(ROOT / "scripts"))

from make_text_goldens import CONVERSATIONS, corpus  # noqa: E402

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

GEMMA_LIKE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

TOOL_TEMPLATE = "{{ bos_token }}TOOLS{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{{ eos_token }}"


def training_text() -> str:
    rng = random.Random(11)
    base = [
        "the quick brown fox jumps over the lazy dog",
        "hello world this is a small training text for a tokenizer",
        "tokenizers split text into pieces and pieces into ids",
        "numbers like 12 345 and 2024 appear sometimes",
        "café naïve résumé über straße",
        "привет мир как дела",
        "你好世界 日本語",
        "def main(): return 0",
        "    indented code line",
        "I'm here, you're there; it's fine.",
        "The model says: Hello! How can I help?",
    ]
    return "\n".join(" ".join(rng.choice(base) for _ in range(rng.randint(1, 3))) for _ in range(3000)) + "\n"


def train_bytelevel():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text().splitlines(), trainer=trainer)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    eot = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", eot)]
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": True},
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    gen = {"bos_token_id": eot, "eos_token_id": tok.token_to_id("<|im_end|>")}
    return tok, config, gen, {"chat_template.jinja": CHATML}


def train_spm(gemma_pipeline: bool):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    # Train merges on Metaspace-split text, then lay the vocab out as SentencePiece does:
    # <unk> <s> </s>, the 256 byte tokens, then the learned pieces.
    scratch = Tokenizer(models.BPE(unk_token="<unk>"))
    scratch.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    scratch.train_from_iterator(training_text().splitlines(), trainer=trainer)
    learned = json.loads(scratch.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in learned["merges"]]

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if gemma_pipeline:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"]]
    )
    tok.add_tokens([AddedToken("<sep>", special=False, normalized=False)])
    # BOS from the post-processor, as in Llama's and Gemma's tokenizer.json.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
    }
    files = {}
    if not gemma_pipeline:
        # Agrees with the post-processor. (transformers 5 ignores these two keys when a
        # tokenizer.json exists; transformers 4's Llama/Gemma classes rebuilt the
        # post-processor from them. flowrt follows the keys when present.)
        config["add_bos_token"] = True
        config["add_eos_token"] = False
    if gemma_pipeline:
        config["chat_template"] = GEMMA_LIKE
        gen = {"bos_token_id": 1, "eos_token_id": [tok.token_to_id("</s>"), tok.token_to_id("<end_of_turn>")]}
    else:
        config["chat_template"] = [
            {"name": "tool_use", "template": TOOL_TEMPLATE},
            {"name": "default", "template": GEMMA_LIKE},
        ]
        gen = {"eos_token_id": 2}
    return tok, config, gen, files


EXTRA_TEXTS = [
    "<s>hello</s>",
    "hello <end_of_turn> world",
    "<start_of_turn>user\nHi<end_of_turn>\n",
    "a<sep>b <sep> c",
    "<think>hmm</think>",
    "unknown: \u01c5 \u2603 \U0001d11e",
    "\u2581leading metaspace",
]


def goldens(d: Path) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d))
    backend = tok.backend_tokenizer
    cases = []
    for text in corpus() + EXTRA_TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        backend.encode_special_tokens = True
        plain = backend.encode(text, add_special_tokens=False).ids
        backend.encode_special_tokens = False
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_parse_special": plain,
                "ids_add_special": tok(text)["input_ids"],
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    chats = []
    for conv in CONVERSATIONS:
        for add_gen in (False, True):
            try:
                out = {"expected": tok.apply_chat_template(conv["messages"], tokenize=False, add_generation_prompt=add_gen)}
            except Exception as exc:  # the template raised
                out = {"error": str(exc)}
            chats.append({"name": conv["name"], "add_generation_prompt": add_gen, "messages": conv["messages"], **out})
    return {
        "reference": "transformers AutoTokenizer.from_pretrained(dir)",
        "transformers_version": __import__("transformers").__version__,
        "tokenizers_version": __import__("tokenizers").__version__,
        "vocab_size": len(tok),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "special_ids": sorted(tok.all_special_ids),
        "cases": cases,
        "chats": chats,
    }


def write_dir(name: str, tok, config: dict, gen: dict, files: dict) -> None:
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    for fname, text in files.items():
        (d / fname).write_text(text, encoding="utf-8")
    g = goldens(d)
    (d / "golden.json").write_text(json.dumps(g, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    size = sum(p.stat().st_size for p in d.iterdir())
    print(f"{name}: {len(g['cases'])} strings, {len(g['chats'])} chats, {size} bytes", file=sys.stderr)


def main() -> None:
    write_dir("bytelevel", *train_bytelevel())
    write_dir("spm", *train_spm(gemma_pipeline=False))
    write_dir("spm_gemma", *train_spm(gemma_pipeline=True))


if __name__ == "__main__":
    main()
