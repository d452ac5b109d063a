#!/usr/bin/env python3
"""Make the tied-merge tokenizer fixtures that crates/flowrt-text is tested against.

Writes into tests/fixtures/text/ (repository root):

  spm_ties.json   a hand-made SentencePiece-BPE vocab (GGUF `llama`: tokens, scores, types) in
                  which many merges have exactly the same score, and the ids for strings whose
                  tokenisation depends on how those ties are broken
  bpe_ties.json   a hand-made byte-level BPE vocab (GGUF `gpt2`: tokens and ranked merges) in
                  which the same merge applies at several overlapping positions ("aaa", "aaaa")
                  and a later-ranked merge sits left of a better-ranked one, and the ids for
                  strings where that matters

The strings are hand-written cases plus random strings over each group's letters, kept mostly
where another tie rule (rightmost first; for spm also token order, or HF's conversion) cuts them
differently. The file records how many strings each rule changes, and the script stops if a
rightmost-first rule would change fewer than a third of them: the fixture must tell the rules
apart.

Which reference, and why
------------------------
spm_ties.json (tokenizer.ggml.model = "llama").
  A GGUF `llama` vocab is run by llama.cpp's `llm_tokenizer_spm`, a transcription of
  SentencePiece's own BPE encoder (bpe_model.cc): start from single characters, repeatedly merge
  the adjacent pair whose concatenation is the vocab piece with the HIGHEST SCORE, and among
  equal scores the LEFTMOST pair (both use the comparator
  `l.score < r.score || (l.score == r.score && l.left > r.left)`); characters that end up in no
  piece fall back to <0xNN> byte tokens. The model was trained on text tokenised that way, so
  that is the tokenisation its ids mean.
  The ids here come from `sentencepiece` itself, on a ModelProto holding exactly these pieces,
  scores and types (model_type BPE, identity normaliser, dummy prefix, byte fallback). The
  script also runs a line-by-line Python transcription of llama.cpp's `llm_tokenizer_spm` and
  stops unless it gives the same ids for every string, so the two implementations llama.cpp and
  SentencePiece are known to agree on this fixture.
  HF `tokenizers` is NOT the reference for this path: transformers turns a GGUF `llama` vocab
  into a BPE model whose merges are ranked by score, then by longer left part, longer right
  part, and token order (`generate_merges`). A BPE model has one rank per pair, so two
  different pairs with equal scores get an arbitrary fixed order, not the position order
  SentencePiece uses; on tied scores the two disagree (e.g. pieces "bc" then "ab" with the same
  score: SentencePiece cuts "abc" as "ab" "c", HF as "a" "bc"). The fixture records HF's ids
  too (`hf_ids`, from transformers' GGUF converter) and counts where they differ, and carries
  the tokenizer.json that converter makes (`hf_tokenizer_json`), so the test can also show that
  flowrt's tokenizer.json path reproduces HF on the same vocab.

bpe_ties.json (tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre = "gpt2").
  Byte-level BPE has no scores, only ranked merges, and one rank per pair; the only tie is the
  same pair at several positions. HF `tokenizers` (BPE model + GPT-2 ByteLevel pre-tokenizer,
  as transformers builds it for this GGUF) merges the best-ranked pair first and, for equal
  ranks, the leftmost; llama.cpp's `llm_tokenizer_bpe` does the same (comparator
  `l.rank > r.rank || (l.rank == r.rank && l.left > r.left)`). The ids come from HF
  `tokenizers`; a Python transcription of llama.cpp's `llm_tokenizer_bpe` must agree on every
  string, or the script stops.

Run (no network, no model hub, no torch):

  python3.11 -m venv .venv-text
  .venv-text/bin/pip install tokenizers==0.23.3 sentencepiece==0.2.3 protobuf==7.36.2 transformers==5.24.0
  .venv-text/bin/python scripts/make_merge_tie_fixtures.py

The output is deterministic (fixed seeds, no training); two runs give byte-identical files.
"""

from __future__ import annotations

import heapq
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "text"

# GGUF token types (the same numbers as SentencePiece piece types).
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6

# ----------------------------------------------------------------------------------------------
# SentencePiece BPE with tied scores
# ----------------------------------------------------------------------------------------------

# Pieces in id order, with their scores, in tiers: every piece of a tier has exactly the same
# score. Each group of pieces sets up one kind of tie (characters mostly differ between groups):
SPM_CHARS = list("\u2581abcdefghijknpqrswxyz")
SPM_PIECES: list[tuple[str, float]] = [
    # Two different pairs overlap in "abc" / "cab", and the ids run against the positions ("bc"
    # before "ab", "ab" before "ca"): leftmost gives "ab" "c", rightmost and token order "a" "bc".
    ("bc", -1.0),
    ("ab", -1.0),
    ("ca", -1.0),
    # The same piece at overlapping positions: "aaa" is "aa" "a" leftmost, "a" "aa" rightmost.
    ("aa", -1.0),
    ("aaaa", -2.0),
    # Ids in position order: token order agrees with leftmost here, rightmost does not.
    ("de", -1.0),
    ("ef", -1.0),
    # A chain of three, ids out of order ("hi" first): "ghi" is "gh" "i" leftmost, "g" "hi" by id.
    ("hi", -1.0),
    ("ij", -1.0),
    ("gh", -1.0),
    # Ties between parts of different lengths, after a first merge: in "xyzw" ("x" "y" "zw") the
    # tied pairs are x+y and y+zw (HF's ranking prefers the longer right part); in "rpqs"
    # ("r" "pq" "s") they are r+pq and pq+s (HF prefers the longer left part).
    ("zw", -1.0),
    ("yzw", -2.0),
    ("xy", -2.0),
    ("pq", -1.0),
    ("pqs", -2.0),
    ("rpq", -2.0),
    # Word-start pieces tied with word-inside pieces.
    ("\u2581k", -1.0),
    ("kk", -1.0),
    # A word: ties at two tiers, some pieces reachable two ways.
    ("na", -1.0),
    ("an", -1.0),
    ("nan", -2.0),
    ("ana", -2.0),
    ("\u2581b", -2.0),
    ("\u2581ban", -3.0),
    ("anana", -3.0),
    ("nas", -3.0),
    ("\u2581banana", -4.0),
]


def spm_vocab() -> dict:
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [UNKNOWN, CONTROL, CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(BYTE)
    # Characters rank below every merge, as in a trained vocab.
    for i, c in enumerate(SPM_CHARS):
        tokens.append(c)
        scores.append(-100.0 - i)
        types.append(NORMAL)
    for piece, score in SPM_PIECES:
        tokens.append(piece)
        scores.append(score)
        types.append(NORMAL)
    assert len(set(tokens)) == len(tokens), "duplicate token"
    return {
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


def sentencepiece_processor(v: dict):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for tok, score, ty in zip(v["tokens"], v["scores"], v["token_types"]):
        p = m.pieces.add()
        p.piece, p.score, p.type = tok, score, ty
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def llama_cpp_spm(v: dict, text: str, tie: str = "left") -> list[int]:
    """llama.cpp's llm_tokenizer_spm_session::tokenize (src/llama-vocab.cpp), line by line.

    `tie` picks the rule among equal scores: "left" is llama.cpp's (and SentencePiece's);
    "right" and "id" (lower token id first, then leftmost) exist only to show that the fixture
    tells the rules apart.
    """
    # llama.cpp: text = " " + text when add_space_prefix, then every " " -> "\u2581".
    text = ("\u2581" + text.replace(" ", "\u2581")) if text else ""
    token_to_id: dict[str, int] = {}
    for i, t in enumerate(v["tokens"]):
        token_to_id.setdefault(t, i)
    chars = list(text)
    # symbols: [start, n] in chars, prev, next
    syms = [[i, 1, i - 1, i + 1 if i + 1 < len(chars) else -1] for i in range(len(chars))]
    queue: list = []
    seq = 0

    def s_text(i: int, n: int) -> str:
        return "".join(chars[syms[i][0] : syms[i][0] + n])

    def try_add_bigram(left: int, right: int) -> None:
        nonlocal seq
        if left == -1 or right == -1:
            return
        t = s_text(left, syms[left][1] + syms[right][1])
        tok = token_to_id.get(t)
        if tok is None:
            return
        score = v["scores"][tok]
        key = {"left": (-score, left), "right": (-score, -left), "id": (-score, tok, left)}[tie]
        heapq.heappush(queue, (key, seq, left, right, len(t)))
        seq += 1

    for i in range(1, len(syms)):
        try_add_bigram(i - 1, i)
    while queue:
        _, _, left, right, size = heapq.heappop(queue)
        ls, rs = syms[left], syms[right]
        if ls[1] == 0 or rs[1] == 0 or ls[1] + rs[1] != size:
            continue
        ls[1] += rs[1]
        rs[1] = 0
        ls[3] = rs[3]
        if rs[3] >= 0:
            syms[rs[3]][2] = left
        try_add_bigram(ls[2], left)
        try_add_bigram(left, ls[3])
    out: list[int] = []
    i = 0 if syms else -1
    while i != -1:
        t = s_text(i, syms[i][1])
        if t in token_to_id:
            out.append(token_to_id[t])
        else:  # never merged, so one character: its UTF-8 bytes as <0xNN> tokens
            out.extend(token_to_id[f"<0x{b:02X}>"] for b in t.encode("utf-8"))
        i = syms[i][3]
    return out


def hf_from_gguf(v: dict):
    """What transformers builds from this GGUF vocab (AutoTokenizer.from_pretrained(gguf_file=))."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    backend, _ = convert_gguf_tokenizer(
        "llama",
        {
            "tokenizer_type": "llama",
            "tokens": v["tokens"],
            "scores": v["scores"],
            "token_type": v["token_types"],
            "bos_token_id": v["bos"],
            "eos_token_id": v["eos"],
            "unk_token_id": v["unk"],
            "add_prefix_space": True,
        },
    )
    return backend


SPM_HAND = [
    "abc",
    "cab",
    "cabc",
    "abcab",
    "aaa",
    "aaaaa",
    "aaaaaaa",
    " aaa",
    "aaa aaa",
    "def",
    "defef",
    "ghi",
    "ghij",
    "hij",
    "ghighi",
    "xyzw",
    "xyzwxyzw",
    "rpqs",
    "rpqsrpqs",
    "kk",
    "kkk",
    "kk kkk k",
    "banana",
    "bananas",
    "ananas",
    "nanana",
    "bananabanana",
    "abc def ghi xyzw rpqs",
    "ab\u2603c",  # a character outside the vocab (byte fallback) next to tied merges
    "\u2603abc\u2603",
]


def random_strings(alphabet: str, n: int, seed: int, max_len: int = 12) -> list[str]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, max_len)))
        if s not in out:
            out.append(s)
    return out


def make_spm() -> dict:
    import sentencepiece as spm

    v = spm_vocab()
    sp = sentencepiece_processor(v)
    hf = hf_from_gguf(v)
    texts = list(SPM_HAND)
    # Random strings over each group's letters: all that some other tie rule (or HF's conversion)
    # would cut differently, up to 12 a group, plus 3 that no rule changes.
    for alphabet, seed in [("abc", 20), ("abc ", 21), ("def", 22), ("ghij", 23), ("xyzw", 24), ("pqrs", 25),
                           ("k ", 26), ("bans", 27), ("abcdefghijknpqrswxyz ", 28)]:
        sensitive, plain = [], []
        for s in random_strings(alphabet, 80, seed=seed):
            if s in texts:
                continue
            ids = llama_cpp_spm(v, s)
            differs = any(llama_cpp_spm(v, s, tie=t) != ids for t in ("right", "id"))
            differs = differs or hf.encode(s, add_special_tokens=False).ids != ids
            if differs and len(sensitive) < 12:
                sensitive.append(s)
            elif not differs and len(plain) < 3:
                plain.append(s)
        texts += sensitive + plain
    cases = []
    n_right = n_id = n_hf = 0
    for text in texts:
        ids = sp.encode(text)
        ref_cpp = llama_cpp_spm(v, text)
        if ref_cpp != ids:
            sys.exit(f"spm: llama.cpp transcription and sentencepiece disagree on {text!r}:\n  sp  {ids}\n  cpp {ref_cpp}")
        right = llama_cpp_spm(v, text, tie="right")
        by_id = llama_cpp_spm(v, text, tie="id")
        hf_ids = hf.encode(text, add_special_tokens=False).ids
        decoded = sp.decode(ids)
        if decoded != text:
            sys.exit(f"spm: sentencepiece does not round-trip {text!r}: {decoded!r}")
        n_right += right != ids
        n_id += by_id != ids
        # Text that starts with a space differs anyway: HF's Metaspace(prepend_scheme="first")
        # adds no "\u2581" there, SentencePiece does (see make_text_goldens.py); count ties only.
        n_hf += hf_ids != ids and not text[:1].isspace()
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_parse_special": ids,
                "decoded": decoded,
                "decoded_skip_special": decoded,
                "pieces": [v["tokens"][i] for i in ids],
                "hf_ids": hf_ids,
                "hf_decoded": hf.decode(hf_ids, skip_special_tokens=False),
            }
        )
    n = len(cases)
    print(
        f"spm: {n} strings; tie-break rightmost-first changes {n_right}, by-token-id changes {n_id}; "
        f"HF's GGUF conversion differs from sentencepiece on {n_hf} (not counting text that starts with a space)",
        file=sys.stderr,
    )
    if 3 * n_right < n or n_id < 10:
        sys.exit("spm: too few strings depend on the tie-break; the fixture would not catch a flipped rule")
    return {
        "reference": "sentencepiece (BPE ModelProto of these pieces), checked equal to a transcription of "
        "llama.cpp's llm_tokenizer_spm on every string; hf_ids: transformers' GGUF conversion (not the reference)",
        "sentencepiece_version": spm.__version__,
        "tokenizers_version": __import__("tokenizers").__version__,
        "transformers_version": __import__("transformers").__version__,
        "changed_by_rightmost_tie_break": n_right,
        "changed_by_token_id_tie_break": n_id,
        "hf_conversion_disagreements": n_hf,
        "vocab": v,
        "hf_tokenizer_json": hf.to_str(),
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------
# Byte-level BPE with one rank at several positions
# ----------------------------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# Merges best first. "a a" is first, so in "aaa" it applies at two overlapping positions and
# only the leftmost may win ("aa" "a" -> "aaa"; rightmost would leave "a" "aa", as there is no
# "a aa"); likewise "x x" in "xxx", "o o" in "looo", "na na" in "nanana". "b c" ranks above
# "a b": in "abc" the better rank wins over the leftmost position.
BPE_MERGES = [
    ("a", "a"),
    ("b", "c"),
    ("a", "b"),
    ("aa", "a"),
    ("aa", "aa"),
    ("n", "a"),
    ("a", "n"),
    ("Ġ", "a"),
    ("Ġa", "a"),
    ("b", "an"),
    ("an", "a"),
    ("na", "na"),
    ("ban", "ana"),
    ("x", "x"),
    ("xx", "x"),
    ("c", "a"),
    ("ca", "b"),
    ("aaa", "a"),
    ("o", "o"),
    ("l", "o"),
    ("lo", "o"),
]


def bpe_vocab() -> dict:
    alphabet = bytes_to_unicode()
    tokens = ["<|endoftext|>"] + [alphabet[b] for b in range(256)]
    types = [CONTROL] + [NORMAL] * 256
    for left, right in BPE_MERGES:
        merged = left + right
        if merged not in tokens:
            tokens.append(merged)
            types.append(NORMAL)
    return {
        "model": "gpt2",
        "pre": "gpt2",
        "tokens": tokens,
        "token_types": types,
        "merges": [f"{l} {r}" for l, r in BPE_MERGES],
        "bos": 0,
        "eos": 0,
        "add_bos": False,
    }


def hf_bytelevel(v: dict):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


def llama_cpp_bpe(v: dict, words: list[str], tie: str = "left") -> list[int]:
    """llama.cpp's llm_tokenizer_bpe_session::tokenize (src/llama-vocab.cpp) on pre-split words
    in byte-alphabet spelling. `tie` as in llama_cpp_spm ("right": rightmost first)."""
    token_to_id = {t: i for i, t in enumerate(v["tokens"])}
    ranks = {tuple(m.split(" ", 1)): i for i, m in reversed(list(enumerate(v["merges"])))}
    out: list[int] = []
    for word in words:
        chars = list(word)
        syms = [[i, 1, i - 1, i + 1 if i + 1 < len(chars) else -1] for i in range(len(chars))]
        queue: list = []

        def s_text(i: int, n: int) -> str:
            return "".join(chars[syms[i][0] : syms[i][0] + n])

        def add_bigram(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            lt, rt = s_text(left, syms[left][1]), s_text(right, syms[right][1])
            rank = ranks.get((lt, rt))
            if rank is None:
                return
            key = (rank, left) if tie == "left" else (rank, -left)
            heapq.heappush(queue, (key, left, right, lt + rt))

        for i in range(1, len(syms)):
            add_bigram(i - 1, i)
        while queue:
            _, left, right, text = heapq.heappop(queue)
            ls, rs = syms[left], syms[right]
            if ls[1] == 0 or rs[1] == 0:
                continue
            if s_text(left, ls[1]) + s_text(right, rs[1]) != text:
                continue
            ls[1] += rs[1]
            rs[1] = 0
            ls[3] = rs[3]
            if rs[3] >= 0:
                syms[rs[3]][2] = left
            add_bigram(ls[2], left)
            add_bigram(left, ls[3])
        i = 0 if syms else -1
        while i != -1:
            t = s_text(i, syms[i][1])
            if t in token_to_id:
                out.append(token_to_id[t])
            else:
                out.extend(token_to_id[c] for c in t)
            i = syms[i][3]
    return out


BPE_HAND = [
    "aaa",
    "aaaa",
    "aaaaa",
    "aaaaaa",
    "aaaaaaa",
    " aaa",
    " aaaa",
    "aaa aaa aaaa",
    "abc",
    "abcabc",
    "cab",
    "cabc",
    "aabc",
    "banana",
    " banana",
    "bananana",
    "nanana",
    "xxx",
    "xxxx",
    "xxxxx",
    "loo",
    "looo",
    "lool",
]


def make_bpe() -> dict:
    v = bpe_vocab()
    hf = hf_bytelevel(v)
    texts = list(BPE_HAND)
    # As for spm: random strings that a rightmost-first rule would cut differently, up to 15 an
    # alphabet, plus 3 it would not.
    for alphabet, seed in [("ax ", 30), ("anb", 31), ("abc", 32), ("lo", 33), ("abcnxlo ", 34)]:
        sensitive, plain = [], []
        for s in random_strings(alphabet, 80, seed=seed):
            if s in texts:
                continue
            words = [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(s)]
            differs = llama_cpp_bpe(v, words, tie="right") != llama_cpp_bpe(v, words)
            if differs and len(sensitive) < 15:
                sensitive.append(s)
            elif not differs and len(plain) < 3:
                plain.append(s)
        texts += sensitive + plain
    cases = []
    n_right = 0
    for text in texts:
        enc = hf.encode(text, add_special_tokens=False)
        ids = enc.ids
        words = [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(text)]
        ref_cpp = llama_cpp_bpe(v, words)
        if ref_cpp != ids:
            sys.exit(f"bpe: llama.cpp transcription and HF disagree on {text!r}:\n  hf  {ids}\n  cpp {ref_cpp}")
        n_right += llama_cpp_bpe(v, words, tie="right") != ids
        decoded = hf.decode(ids, skip_special_tokens=False)
        if decoded != text:
            sys.exit(f"bpe: HF does not round-trip {text!r}: {decoded!r}")
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_parse_special": ids,
                "decoded": decoded,
                "decoded_skip_special": decoded,
                "pieces": enc.tokens,
            }
        )
    n = len(cases)
    print(f"bpe: {n} strings; tie-break rightmost-first (same rank) changes {n_right}", file=sys.stderr)
    if 3 * n_right < n:
        sys.exit("bpe: too few strings depend on the tie-break; the fixture would not catch a flipped rule")
    return {
        "reference": "HF tokenizers (BPE + GPT-2 ByteLevel), checked equal to a transcription of "
        "llama.cpp's llm_tokenizer_bpe on every string",
        "tokenizers_version": __import__("tokenizers").__version__,
        "changed_by_rightmost_tie_break": n_right,
        "vocab": v,
        "hf_tokenizer_json": hf.to_str(),
        "cases": cases,
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)

    def write(name: str, obj: dict) -> None:
        path = OUT / name
        path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)", file=sys.stderr)

    write("spm_ties.json", make_spm())
    write("bpe_ties.json", make_bpe())


if __name__ == "__main__":
    main()
