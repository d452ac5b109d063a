#!/usr/bin/env python3
"""Do `flowrt pack`'s GGUF files load in llama.cpp, and do both runtimes give the same tokens?

For every source x type: `flowrt pack SRC -o TMP/x.gguf --quant TYPE` with pack's own gate
(a gate refusal is noted and the file packed again with --no-gate: the gate compares the pack
with its source, which is not what is tested here), then on that one file:

- tokenisation: each prompt tokenised by llama.cpp (`tokenize(add_bos=True, special=True)`)
  and by flowrt (`flowrt run --raw --print-token-ids`) must give the same ids;
- greedy: N new tokens (--new, default 32) by argmax from each runtime, end-of-generation
  ignored: flowrt through `flowrt run --raw --temperature 0 --ignore-eos --print-token-ids`,
  llama.cpp through `Llama.eval` with logits_all and an argmax taken here (no sampler). At the
  first token where they differ the row shows llama.cpp's gap: its logit for its own pick
  minus its logit for flowrt's, at that step (and the same in one batched pass over flowrt's
  tokens, whose prefix is identical up to there);
- llama.cpp against itself: its logits at each greedy step (one token at a time) against one
  batched pass over the prompt and the same greedy tokens: top-1 agreement, mean KL and the
  positions where the argmax differs. This is the yardstick for the two rows above: the
  noise between llama.cpp's own two paths over the same ids;
- teacher-forced: llama.cpp's logits over prompt + flowrt's continuation are written as a
  REF file (tests/fixtures/ref/README.md) and `flowrt verify` runs the same ids: top-1
  agreement, mean KL(llama.cpp || flowrt) and max |dlogit| over every position.

First, as a yardstick, both runtimes run the transformers REF files of the GGUF sources as
published (tests/fixtures/ref) teacher-forced: llama.cpp's own distance from exact math
(8-bit activations in its quantised matmuls), and transformers' gap wherever llama.cpp's
top-1 differs. The near-tie defaults come from that table.

Both runtimes use the same threads (--threads, default 2) and KV precision (--kv, default
f16, each runtime's default). llama.cpp runs in a child process per file, so a file that
makes it abort is reported, not fatal.

Verdicts. `ok`: the file loads, the prompt ids agree, greedy is identical and the teacher-
forced mean KL is within --max-mean-kl-float (F32, F16, BF16) or --max-mean-kl (quantised).
`near-tie`: the same, except that greedy differs at steps where llama.cpp's gap is at most
--tie-gap, with teacher-forced top-1 at least --min-top1. `caveat`: pack printed that
llama.cpp would not run the model as written (its `llama.cpp:` lines, shown in the pack cell);
the figures are shown but the row is not a pass. `refused`: pack refused the source (reported, not a pass). `FAIL`:
anything else (a missing source, a load failure, a tokenisation difference, a divergence or
KL beyond the bounds). Prints Markdown tables; exits 1 when any row is FAIL.

llama.cpp comes from the same place as for scripts/compare_peers.py: llama-cpp-python==0.3.36
built from source into .venv-peer (`python3 scripts/compare_peers.py --install`, or --install
here: the same function). This script needs only the standard library; the llama.cpp side
runs under --peer-python (default .venv-peer/bin/python).

Usage:
  python3 scripts/check_packs_llamacpp.py                       # the full matrix (30 min on 2 cores)
  python3 scripts/check_packs_llamacpp.py --sources llama-untied --types F16,Q4_0
Sources: smollm2-135m ($FLOWRT_SMOLLM2_GGUF), gemma3-270m ($FLOWRT_GEMMA3_GGUF) and every directory of
tests/fixtures/families (by name). flowrt: $FLOWRT, else target/ci/flowrt.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_llamacpp import PEER_PACKAGE, PEER_VENV, ROOT, install  # noqa: E402

FAMILIES = ROOT / "tests" / "fixtures" / "families"
# Named apart from the family fixtures (tests/fixtures/families/gemma3 is another source).
GGUF_SOURCES = {"smollm2-135m": "FLOWRT_SMOLLM2_GGUF", "gemma3-270m": "FLOWRT_GEMMA3_GGUF"}
# transformers' logits on the GGUF sources as published (tests/fixtures/ref/README.md)
REFS = {"smollm2-135m": ROOT / "tests/fixtures/ref/smollm2-q4_1.safetensors",
        "gemma3-270m": ROOT / "tests/fixtures/ref/gemma3-270m-q4_k_m.topk.safetensors"}
TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
FIXTURE_TYPES = ["F32"] + TYPES
FLOAT_TYPES = {"F32", "F16", "BF16"}
VERDICTS = ["ok", "near-tie", "caveat", "refused", "FAIL"]
CAVEAT = "llama.cpp: would not run this model as written:"
PROMPTS = ["The capital of France is", "def add(a, b):\n    return a + b\n\nprint(add(12, 30))\n"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tail(text: str, n: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


# ---------------------------------------------------------------- llama.cpp side (child process)

def write_ref(path: Path, seqs: list[list[int]], logits: list, meta: dict) -> None:
    """A flowrt-ref/1 safetensors file: prompt.{i}.input_ids (I64 [T]) and
    prompt.{i}.logits_all (F32 [T, vocab])."""
    import numpy as np

    header: dict = {"__metadata__": {k: str(v) for k, v in meta.items()}}
    blobs = []
    off = 0
    for i, (ids, lg) in enumerate(zip(seqs, logits)):
        for name, arr, dtype in [(f"prompt.{i}.input_ids", np.asarray(ids, dtype="<i8"), "I64"),
                                 (f"prompt.{i}.logits_all", np.ascontiguousarray(lg, dtype="<f4"), "F32")]:
            b = arr.tobytes()
            header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def peer_worker(spec_path: str) -> None:
    """Loads spec["model"] in llama.cpp, tokenises, decodes greedily and runs the forced
    sequences; prints one JSON object. A load failure exits 3 (llama.cpp's log on stderr)."""
    import numpy as np
    import llama_cpp

    spec = json.loads(Path(spec_path).read_text())
    kv = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[spec["kv"]]
    try:
        llm = llama_cpp.Llama(model_path=spec["model"], n_ctx=spec["n_ctx"], n_batch=spec["n_ctx"],
                              n_ubatch=spec["n_ctx"], n_threads=spec["threads"],
                              n_threads_batch=spec["threads"], logits_all=True, type_k=kv, type_v=kv,
                              verbose=True)
    except Exception as e:  # llama.cpp logged why to stderr
        print(f"llama.cpp could not load the file: {e}", file=sys.stderr)
        sys.exit(3)
    vocab = llm.n_vocab()
    prompt_ids = [llm.tokenize(p.encode(), add_bos=True, special=True) for p in spec["prompts"]]
    greedy, steps, decoded = [], [], []
    for ids, theirs in zip(prompt_ids, spec["flowrt_new"]):
        llm.reset()
        llm.eval(ids)
        out: list[int] = []
        rows = []  # llama.cpp's logits at each step, one token at a time
        step = None  # llama.cpp's logits where it first differs from flowrt's continuation
        for k in range(spec["n_new"]):
            row = llm.scores[llm.n_tokens - 1]
            rows.append(np.array(row, dtype=np.float64))
            out.append(int(np.argmax(row)))
            if step is None and k < len(theirs) and out[-1] != theirs[k]:
                step = {"at": k, "gap": float(row[out[-1]] - row[theirs[k]])}
            if k + 1 < spec["n_new"]:
                llm.eval([out[-1]])
        greedy.append(out)
        steps.append(step)
        decoded.append(rows)
    # llama.cpp against itself: its logits one token at a time (above) against one batched
    # pass over the same ids (prompt + its own greedy tokens). Both are llama.cpp's answers for
    # the same positions; how far they differ is its own rounding noise between the two paths.
    own = {"positions": 0, "agree": 0, "kl": 0.0, "max_dlogit": 0.0, "flips": []}
    for i, (ids, out, rows) in enumerate(zip(prompt_ids, greedy, decoded)):
        if not rows:
            continue
        llm.reset()
        llm.eval(ids + out[:-1])
        lg = np.array(llm.scores[: len(ids) + len(out) - 1], dtype=np.float64)
        for k, a in enumerate(rows):
            b = lg[len(ids) - 1 + k]
            la, lb = log_softmax(a), log_softmax(b)
            own["kl"] += float((np.exp(la) * (la - lb)).sum())
            own["positions"] += 1
            own["max_dlogit"] = max(own["max_dlogit"], float(np.abs(a - b).max()))
            if int(a.argmax()) == int(b.argmax()):
                own["agree"] += 1
            else:
                own["flips"].append({"prompt": i, "at": k, "gap": float(b.max() - b[int(a.argmax())])})
    forced = []
    logits = []
    for seq, ids, step, mine in zip(spec["forced"], prompt_ids, steps, greedy):
        llm.reset()
        llm.eval(seq)
        lg = np.array(llm.scores[: len(seq)], dtype=np.float32)
        logits.append(lg)
        if step is not None and seq[: len(ids)] == ids:
            # The same divergence in one batched pass over flowrt's tokens: the prefix up to it
            # is the same, so this is llama.cpp's decision again, batched instead of one by one.
            p = len(ids) + step["at"] - 1
            step["forced_gap"] = float(lg[p, mine[step["at"]]] - lg[p, seq[p + 1]])
            step["forced_argmax"] = int(lg[p].argmax())
    write_ref(Path(spec["ref_out"]), spec["forced"], logits,
              {"format": "flowrt-ref/1", "model_file": spec["model"], "model_format": "gguf",
               "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
               "n_prompts": len(spec["forced"]), "vocab_size": vocab, "logits_dtype": "f32",
               "kv_type": spec["kv"], "threads": spec["threads"]})
    print(json.dumps({"vocab": vocab, "prompt_ids": prompt_ids, "greedy": greedy, "steps": steps,
                      "own": own, "version": llama_cpp.__version__}))


def log_softmax(x):
    import numpy as np

    m = x.max(axis=-1, keepdims=True)
    return x - (np.log(np.exp(x - m).sum(axis=-1, keepdims=True)) + m)


def peer_vs_ref(gguf: str, ref: str, threads: int) -> None:
    """llama.cpp teacher-forced on a REF file's ids (tests/fixtures/ref/README.md: full logits
    or the top-K form) against the REF's logits (transformers, exact f32 math on the same
    weights): the figures `flowrt verify` gives, plus the reference's own gap at every position
    where llama.cpp's top-1 differs. Prints one JSON object."""
    import numpy as np
    import llama_cpp

    raw = Path(ref).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])

    def tensor(name):
        e = header[name]
        a, b = e["data_offsets"]
        dt = {"I64": "<i8", "F32": "<f4", "F16": "<f2"}[e["dtype"]]
        return np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(e["shape"]).astype(
            np.int64 if e["dtype"] == "I64" else np.float64)

    llm = llama_cpp.Llama(model_path=gguf, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False)
    kls, gaps, top1, positions, max_err = [], [], 0, 0, 0.0
    i = 0
    while f"prompt.{i}.input_ids" in header:
        ids = [int(t) for t in tensor(f"prompt.{i}.input_ids")]
        llm.reset()
        llm.eval(ids)
        ours = np.array(llm.scores[: len(ids)], dtype=np.float64)
        lo = log_softmax(ours)
        if f"prompt.{i}.logits_all" in header:
            r = tensor(f"prompt.{i}.logits_all")
            lr = log_softmax(r)
            kls += list(np.maximum((np.exp(lr) * (lr - lo)).sum(axis=1), 0.0))
            max_err = max(max_err, float(np.abs(r - ours).max()))
            for p in range(len(ids)):
                if r[p].argmax() == ours[p].argmax():
                    top1 += 1
                else:
                    gaps.append(float(r[p].max() - r[p, ours[p].argmax()]))
        else:  # top-K: KL over the K ids plus one bucket for the rest (as flowrt verify does)
            k_ids, k_logits = tensor(f"prompt.{i}.topk_ids"), tensor(f"prompt.{i}.topk_logits")
            lse = tensor(f"prompt.{i}.logsumexp")
            for p in range(len(ids)):
                lr, o = k_logits[p] - lse[p], lo[p, k_ids[p]]
                kl = float((np.exp(lr) * (lr - o)).sum())
                tail_r, tail_o = max(1 - np.exp(lr).sum(), 0.0), max(1 - np.exp(o).sum(), 1e-300)
                if tail_r > 0:
                    kl += tail_r * (np.log(tail_r) - np.log(tail_o))
                kls.append(max(kl, 0.0))
                max_err = max(max_err, float(np.abs(k_logits[p] - ours[p, k_ids[p]]).max()))
                mine = int(ours[p].argmax())
                if mine == k_ids[p][0]:
                    top1 += 1
                else:
                    w = np.nonzero(k_ids[p] == mine)[0]
                    gaps.append(float(k_logits[p][0] - k_logits[p][w[0]]) if len(w) else float("inf"))
        positions += len(ids)
        i += 1
    print(json.dumps({"positions": positions, "top1": top1 / positions, "mean_kl": float(np.mean(kls)),
                      "max_kl": float(np.max(kls)), "max_abs_logit_err": max_err, "flip_gaps": sorted(gaps)}))


# ---------------------------------------------------------------- flowrt side and the comparison

def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          env=dict(os.environ, FLOWRT_LOG="off"), **kw)


def error_lines(stderr: str) -> str:
    """The lines of a flowrt stderr that say why it failed (else its tail)."""
    keep = [l.strip() for l in stderr.splitlines()
            if l.startswith(("error:", "pack refused:", "Error:")) or "panicked" in l]
    return " | ".join(keep) if keep else tail(stderr)


def llama_error(stderr: str, rc: int) -> str:
    """Why llama.cpp refused or crashed, from its log."""
    keys = ("error", "failed", "GGML_ASSERT", "missing", "wrong", "unknown", "invalid")
    keep = [l.strip() for l in stderr.splitlines() if any(k in l for k in keys)]
    what = f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}"
    return f"{what}: " + (" | ".join(dict.fromkeys(keep)) if keep else tail(stderr))


def flowrt_engine_args(a) -> list[str]:
    return ["--threads", a.threads, "--kv-type", a.kv] + (["--act-quant", a.act_quant] if a.act_quant else [])


def flowrt_greedy(flowrt: str, model: Path, prompt: str, a) -> tuple[list[int], list[int]]:
    r = run([flowrt, "run", model, prompt, "--raw", "--temperature", "0", "--max-tokens", a.new,
             "--ignore-eos", "--print-token-ids"] + flowrt_engine_args(a))
    if r.returncode != 0:
        raise RuntimeError(f"flowrt run exited {r.returncode}: {error_lines(r.stderr)}")
    ids = {}
    for line in r.stderr.splitlines():
        for key in ("prompt token ids:", "generated token ids:"):
            if line.startswith(key):
                ids[key] = [int(t) for t in line[len(key):].split()]
    if len(ids) != 2:
        raise RuntimeError(f"flowrt run printed no token ids: {tail(r.stderr)}")
    return ids["prompt token ids:"], ids["generated token ids:"]


def divergence_text(d: dict) -> str:
    if "note" in d:
        return f"prompt {d['prompt']}: {d['note']}"
    t = (f"prompt {d['prompt']} token {d['at']}: flowrt {d['flowrt']}, llama.cpp {d['llama_cpp']}, "
         f"llama.cpp's gap {d['gap']:.3f}")
    if "forced_gap" in d:
        t += f" (batched: {d['forced_gap']:.3f}"
        t += ", picks flowrt's)" if d["forced_argmax"] == d["flowrt"] else ")"
    return t


def check_file(flowrt: str, gguf: Path, tmp: Path, a, row: dict) -> None:
    """Compares flowrt and llama.cpp on one GGUF file, adding the figures to row."""
    fl = [flowrt_greedy(flowrt, gguf, p, a) for p in PROMPTS]
    seqs = [p + g for p, g in fl]
    n_ctx = max(len(s) for s in seqs) + int(a.new) + 16
    spec = {"model": str(gguf), "prompts": PROMPTS, "n_new": int(a.new), "n_ctx": n_ctx,
            "threads": int(a.threads), "kv": a.kv, "flowrt_new": [g for _, g in fl], "forced": seqs,
            "ref_out": str(tmp / "ref.safetensors")}
    (tmp / "spec.json").write_text(json.dumps(spec))
    r = run([a.peer_python, __file__, "--peer-worker", tmp / "spec.json"])
    if r.returncode != 0:
        row["loads"] = f"n ({llama_error(r.stderr, r.returncode)})"
        row["verdict"] = "FAIL"
        return
    row["loads"] = "y"
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    row["llama_cpp_version"] = peer["version"]
    tok_diffs = [i for i, (p, (fp, _)) in enumerate(zip(peer["prompt_ids"], fl)) if p != fp]
    row["tokens"] = "y" if not tok_diffs else "n: " + "; ".join(
        f"prompt {i}: llama.cpp {peer['prompt_ids'][i][:12]} flowrt {fl[i][0][:12]}" for i in tok_diffs)
    divergences = []
    for i, ((_, fg), lg, step) in enumerate(zip(fl, peer["greedy"], peer["steps"])):
        if step is not None:
            divergences.append(dict(step, prompt=i, flowrt=fg[step["at"]], llama_cpp=lg[step["at"]]))
        elif len(fg) != len(lg):
            divergences.append({"prompt": i, "gap": None, "note": f"{len(fg)} tokens from flowrt, {len(lg)} "
                                                                 "from llama.cpp, the same as far as both go"})
    own = peer["own"]
    if own["positions"]:
        n = own["positions"]
        row["own"] = {"top1": own["agree"] / n, "positions": n, "mean_kl": own["kl"] / n,
                      "max_dlogit": own["max_dlogit"], "flips": own["flips"]}
        flips = ", ".join(f"p{f['prompt']}:{f['at']} gap {f['gap']:.3f}" for f in own["flips"][:4])
        row["self"] = (f"{own['agree'] / n * 100:.2f}% of {n} (mean KL {own['kl'] / n:.2e}, max "
                       f"\N{GREEK CAPITAL LETTER DELTA}logit {own['max_dlogit']:.3f})"
                       + (f"; argmax differs at {flips}" if flips else ""))
    row["divergences"] = divergences
    row["greedy"] = "y" if not divergences else "n: " + "; ".join(divergence_text(d) for d in divergences)
    v = run([flowrt, "verify", gguf, "--reference", tmp / "ref.safetensors", "--json"] + flowrt_engine_args(a))
    if v.returncode != 0:
        row["forced"] = f"verify failed: {error_lines(v.stderr)}"
        row["verdict"] = "FAIL"
        return
    rep = json.loads(v.stdout)
    row.update(top1=rep["top1_agreement"], positions=rep["positions"], mean_kl=rep["mean_kl"],
               max_abs_logit_err=rep["max_abs_logit_err"])
    row["forced"] = (f"{rep['top1_agreement'] * 100:.2f}% of {rep['positions']} "
                     f"(mean KL {rep['mean_kl']:.2e}, max \N{GREEK CAPITAL LETTER DELTA}logit "
                     f"{rep['max_abs_logit_err']:.3f})")
    max_kl = a.max_mean_kl_float if row["type"] in FLOAT_TYPES else a.max_mean_kl
    close = not tok_diffs and rep["mean_kl"] <= max_kl
    if row.get("caveats") and not tok_diffs:
        # pack said llama.cpp runs another model from this file: whatever agrees is by chance
        row["verdict"] = "caveat"
    elif close and not divergences:
        row["verdict"] = "ok"
    elif (close and rep["top1_agreement"] >= a.min_top1
          and all(d["gap"] is not None and d["gap"] <= a.tie_gap for d in divergences)):
        row["verdict"] = "near-tie"
    else:
        row["verdict"] = "FAIL"


def pack(flowrt: str, src: Path, out: Path, t: str, a, row: dict) -> bool:
    """Packs src as type t at out, filling row's pack cell (and its caveats: what pack says
    llama.cpp would not run as written); whether a file was written. When pack's own gate
    refuses the file, it is packed again with --no-gate so that llama.cpp still gets it (the
    gate compares the pack with its source, which is not what this script tests)."""
    cmd = [flowrt, "pack", src, "-o", out, "--quant", t, "--threads", a.threads]
    p = run(cmd + (["--no-gate"] if a.no_gate else []))
    note = ""
    refusals = [l[len("pack refused:"):].strip() for l in p.stderr.splitlines() if l.startswith("pack refused:")]
    if p.returncode != 0 and refusals and any("exceeds" in r or "below" in r for r in refusals):
        why = ", ".join(r for r in refusals if "removed" not in r)
        note = f"gate refused ({why}), packed again with --no-gate"
        p = run(cmd + ["--no-gate"])
    if p.returncode != 0:
        row["pack"] = f"pack refused: {error_lines(p.stderr)}"
        return False
    parts = [note or ("gate skipped (--no-gate)" if a.no_gate else "gate passed")]
    fallbacks = sum(l.startswith("fallback:") for l in p.stdout.splitlines())
    if fallbacks:
        parts.append(f"{fallbacks} tensors fell back to Q8_0/F16")
    row["caveats"] = [l[len(CAVEAT):].strip() for l in p.stdout.splitlines() if l.startswith(CAVEAT)]
    parts += [f"pack's caveat: {c}" for c in row["caveats"]]
    row["pack"] = "; ".join(parts)
    return True


def calibrate(flowrt: str, srcs: list, a) -> None:
    """How far each runtime is from exact math on the GGUF sources themselves: both run the
    transformers REF's ids teacher-forced. Prints a table (the yardstick for the near-ties)."""
    lines = []
    for name, src, _ in srcs:
        if name not in REFS or src is None:
            continue
        ref = REFS[name]
        want = ref_metadata(ref).get("model_sha256")
        if want and hashlib.sha256(src.read_bytes()).hexdigest() != want:
            lines.append(f"| {name} | - | the REF was made from another file (sha256 {want[:12]}...) | | | | |")
            continue
        r = run([a.peer_python, __file__, "--peer-vs-ref", src, ref, a.threads])
        v = run([flowrt, "verify", src, "--reference", ref, "--json"] + flowrt_engine_args(a))
        for who, proc in (("flowrt", v), ("llama.cpp", r)):
            if proc.returncode != 0:
                lines.append(f"| {name} | {who} | failed: {error_lines(proc.stderr)} | | | | |")
                continue
            j = json.loads(proc.stdout.strip().splitlines()[-1])
            top1 = j.get("top1", j.get("top1_agreement"))
            gaps = ", ".join(f"{g:.3f}" for g in j["flip_gaps"]) if "flip_gaps" in j else "-"
            lines.append(f"| {name} | {who} | {j['positions']} | {top1 * 100:.2f}% | {j['mean_kl']:.2e} | "
                         f"{j['max_abs_logit_err']:.3f} | {gaps or 'none'} |")
    if lines:
        print(f"Each runtime against transformers (exact f32 math on the same weights; tests/fixtures/ref/"
              "REF files), on the source files as published, teacher-forced:\n")
        print("| source | runtime | positions | top-1 | mean KL | max Δlogit | transformers' gap where "
              "top-1 differs |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(lines) + "\n")


def ref_metadata(path: Path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)).get("__metadata__", {})


def sources(names: list[str] | None) -> list[tuple[str, Path | None, str]]:
    """(name, path or None, why missing) for each selected source."""
    fixtures = sorted(d.name for d in FAMILIES.iterdir() if (d / "config.json").is_file())
    known = list(GGUF_SOURCES) + fixtures
    out = []
    for name in names or known:
        if name in GGUF_SOURCES:
            env = GGUF_SOURCES[name]
            p = os.environ.get(env)
            if not p:
                out.append((name, None, f"{env} is not set"))
            elif not Path(p).is_file():
                out.append((name, None, f"{env}={p}: no such file"))
            else:
                out.append((name, Path(p), ""))
        elif name in fixtures:
            out.append((name, FAMILIES / name, ""))
        elif "/" in name:
            # A path: any HF checkpoint directory or GGUF file (e.g. the MiniCPM5-2B geometry).
            p = Path(name)
            label = p.stem if p.is_file() else p.name
            out.append((label, p if p.exists() else None, "" if p.exists() else f"{name}: no such file"))
        else:
            sys.exit(f"--sources: unknown source `{name}` (known: {', '.join(known)})")
    if len({n for n, _, _ in out}) != len(out):
        sys.exit("--sources: a source is named twice")
    return out


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--peer-worker":
        peer_worker(sys.argv[2])
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "--peer-vs-ref":
        peer_vs_ref(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", help="comma-separated names, or paths (containing /) to other HF "
                    "directories or GGUF files (default: all named sources)")
    ap.add_argument("--types", help="comma-separated (default: F32 (fixtures only) F16 BF16 Q8_0 Q4_0 Q4_1 "
                                    "Q4_K Q5_K Q6_K)")
    ap.add_argument("--new", default="32", help="greedy tokens per prompt (default 32)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--kv", default="f16", choices=["f16", "f32"], help="KV cache type in both runtimes")
    ap.add_argument("--tie-gap", type=float, default=0.5,
                    help="largest llama.cpp logit gap at a greedy divergence still taken as a near-tie "
                         "(default 0.5: llama.cpp itself flips transformers' top-1 at gaps up to 0.456)")
    ap.add_argument("--min-top1", type=float, default=0.9,
                    help="teacher-forced top-1 agreement a near-tie row needs (llama.cpp against "
                         "transformers: 96.23%% SmolLM2, 96.76%% Gemma 3)")
    ap.add_argument("--max-mean-kl", type=float, default=1e-2,
                    help="teacher-forced mean KL a row of a quantised type may have (llama.cpp, whose "
                         "quantised matmuls take 8-bit activations, against transformers: 3.6e-3 "
                         "SmolLM2, 4.4e-3 Gemma 3)")
    ap.add_argument("--max-mean-kl-float", type=float, default=1e-4,
                    help="the same for F32, F16, BF16 (llama.cpp's matmuls then take F16/BF16 "
                         "activations; largest measured: 5.9e-5, SmolLM2 BF16)")
    ap.add_argument("--no-gate", action="store_true", help="pass --no-gate to flowrt pack")
    ap.add_argument("--act-quant", choices=["q16", "q8", "q8x"],
                    help="flowrt's activation quantisation (its default q16; q8x 8-bit activations on the "
                         "repacked weights, q8 ggml's 8-bit activation types)")
    ap.add_argument("--no-calibrate", action="store_true",
                    help="skip the first table (each runtime against transformers on the GGUF sources)")
    ap.add_argument("--peer-python", default=str(PEER_VENV / "bin" / "python"))
    ap.add_argument("--install", action="store_true", help=f"first build {PEER_PACKAGE} into {PEER_VENV}")
    ap.add_argument("--keep", type=Path, help="keep the packs and REF files in this directory")
    ap.add_argument("--json", type=Path, help="also write every row's figures here")
    a = ap.parse_args()
    if a.install:
        a.peer_python = str(install())
    chk = subprocess.run([a.peer_python, "-c", "import llama_cpp"], capture_output=True) \
        if Path(a.peer_python).exists() else None
    if chk is None or chk.returncode != 0:
        sys.exit(f"no llama.cpp at {a.peer_python} (cannot import llama_cpp): run "
                 f"`python3 scripts/compare_peers.py --install` (builds {PEER_PACKAGE} into {PEER_VENV}) "
                 "or pass --install")
    flowrt = os.environ.get("FLOWRT") or str(ROOT / "target" / "ci" / "flowrt")
    if not Path(flowrt).is_file():
        sys.exit(f"no flowrt binary at {flowrt}: build it (cargo build --profile ci -p flowrt-cli) or set FLOWRT")
    types = a.types.split(",") if a.types else None
    srcs = sources(a.sources.split(",") if a.sources else None)
    if not a.no_calibrate:
        calibrate(flowrt, srcs, a)
    rows = []
    with tempfile.TemporaryDirectory(prefix="packs-llamacpp-") as td:
        base = a.keep or Path(td)
        for name, src, missing in srcs:
            is_fixture = src is not None and src.is_dir()
            for t in types or (FIXTURE_TYPES if is_fixture or src is None else TYPES):
                row = {"source": name, "type": t}
                rows.append(row)
                if src is None:
                    row.update(pack=f"source missing: {missing}", verdict="FAIL")
                    continue
                tmp = base / f"{name}-{t}"
                tmp.mkdir(parents=True, exist_ok=True)
                out = tmp / "x.gguf"
                log(f"== {name} {t}")
                if not pack(flowrt, src, out, t, a, row):
                    row["verdict"] = "refused"
                    log(f"   {row['pack']}")
                    continue
                try:
                    check_file(flowrt, out, tmp, a, row)
                except RuntimeError as e:
                    row.update(loads="?", verdict="FAIL", error=str(e))
                log(f"   {row.get('verdict')}: loads {row.get('loads')}, greedy {row.get('greedy')}, "
                    f"forced {row.get('forced')}")
                if not a.keep:
                    for f in tmp.iterdir():
                        f.unlink()
    print_table(rows, a)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 1 if any(r["verdict"] == "FAIL" for r in rows) else 0


def print_table(rows: list[dict], a) -> None:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    version = next((r["llama_cpp_version"] for r in rows if "llama_cpp_version" in r), "?")
    print(f"flowrt {commit} (working tree) vs llama.cpp (llama-cpp-python {version}); prompts: "
          f"{len(PROMPTS)} x {a.new} greedy tokens; threads {a.threads}; KV {a.kv}; flowrt activations "
          f"{a.act_quant or 'q16 (default)'}; mean KL <= {a.max_mean_kl_float} (F32, F16, BF16) or "
          f"{a.max_mean_kl} (quantised); near-tie: gap <= {a.tie_gap}, top-1 >= {a.min_top1}")
    print("gap: llama.cpp's logit for its own pick minus its logit for flowrt's, at that step of its greedy "
          "pass (batched: the same in one pass over flowrt's tokens)\n")
    print("| source | type | pack | loads in llama.cpp | prompt ids agree | greedy identical "
          "(first divergence) | teacher-forced top-1 (prompt + flowrt's tokens) | llama.cpp against "
          "itself (one token at a time vs one batched pass) | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r["source"], r["type"], r.get("pack", ""), r.get("loads", "-"), r.get("tokens", "-"),
                 r.get("greedy", r.get("error", "-")), r.get("forced", "-"), r.get("self", "-"),
                 r["verdict"]]
        print("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    print(f"\n{len(rows)} rows: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS))
    print("ok: identical greedy tokens; near-tie: greedy differs only where llama.cpp's gap is within "
          "--tie-gap; caveat: pack said llama.cpp would not run the model as written (not a pass); "
          "refused: pack refused the source (not a pass); FAIL: anything else")


if __name__ == "__main__":
    sys.exit(main())
