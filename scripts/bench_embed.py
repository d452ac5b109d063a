#!/usr/bin/env python3
"""Embedding throughput, flowrt against sentence-transformers on torch, side by side.

256 texts of mixed length (tests/fixtures/embed/corpus.json cycled in a seeded order,
newlines turned into spaces so that one text is one line; the two longest are over the
model's 256 tokens and both sides truncate them), embedded with:

  flowrt      `flowrt embed MODEL --file TEXTS --json --truncate -t THREADS`, a new process
              per run; `seconds` is the embedding time the command reports (texts already
              read, model loaded), `wall` the whole process (load included)
  sentence-transformers  `SentenceTransformer(MODEL).encode(texts, batch_size=32)` in this
              process, torch.set_num_threads(THREADS); `seconds` is encode() only (model
              loaded once before the runs)

Runs alternate (flowrt, then sentence-transformers, R times) after one warm-up of each;
medians, min and max are printed, and the ratio of the medians (texts/s of flowrt over
sentence-transformers). The script also checks that both gave the same vectors (cosine).

Usage (needs .venv-ref with sentence-transformers, see scripts/requirements-reference.txt):
  .venv-ref/bin/python scripts/bench_embed.py [--model DIR] [--flowrt BIN] [-r 5] [-t 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
N_TEXTS = 256


def texts() -> list[str]:
    corpus = json.loads((ROOT / "tests/fixtures/embed/corpus.json").read_text(encoding="utf-8"))[
        "texts"
    ]
    pool = [" ".join(t.split("\n")) for t in corpus if t.strip()]
    rng = random.Random(16)
    out = []
    while len(out) < N_TEXTS:
        batch = pool[:]
        rng.shuffle(batch)
        out.extend(batch)
    return out[:N_TEXTS]


def stat(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="sentence-transformers directory (default: flowrt pull all-minilm:l6-v2)")
    ap.add_argument("--flowrt", default=str(ROOT / "target/release/flowrt"))
    ap.add_argument("-r", "--runs", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    flowrt = Path(args.flowrt)
    if not flowrt.is_file():
        sys.exit(f"{flowrt} does not exist: cargo build --release -p flowrt-cli, or pass --flowrt")
    model = args.model or subprocess.run(
        [str(flowrt), "pull", "all-minilm:l6-v2"], check=True, capture_output=True, text=True
    ).stdout.strip()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    data = texts()
    n_tokens = None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "texts.txt"
        path.write_text("\n".join(data) + "\n", encoding="utf-8")

        def run_flowrt() -> tuple[float, float, np.ndarray, int]:
            t0 = time.perf_counter()
            p = subprocess.run(
                [str(flowrt), "embed", model, "--file", str(path), "--json", "--truncate",
                 "-t", str(args.threads)],
                check=True, capture_output=True, text=True,
            )
            wall = time.perf_counter() - t0
            d = json.loads(p.stdout)
            vecs = np.array([x["embedding"] for x in d["data"]], dtype=np.float32)
            return d["seconds"], wall, vecs, d["tokens"]

        st = SentenceTransformer(model, device="cpu")

        def run_st() -> tuple[float, np.ndarray]:
            t0 = time.perf_counter()
            with torch.inference_mode():
                v = st.encode(data, batch_size=32, convert_to_numpy=True)
            return time.perf_counter() - t0, v

        run_flowrt()
        run_st()
        f_secs, f_wall, s_secs = [], [], []
        for _ in range(args.runs):
            secs, wall, fv, n_tokens = run_flowrt()
            f_secs.append(secs)
            f_wall.append(wall)
            secs, sv = run_st()
            s_secs.append(secs)

    cos = (fv * sv).sum(1) / np.linalg.norm(fv, axis=1) / np.linalg.norm(sv, axis=1)
    f, w, s = stat(f_secs), stat(f_wall), stat(s_secs)
    ratio = s["median"] / f["median"]
    lines = [
        f"{N_TEXTS} texts, {n_tokens} tokens (flowrt's count), {args.threads} threads, {args.runs} runs after a warm-up",
        f"{'':28} {'median s':>9} {'min':>8} {'max':>8} {'texts/s':>9}",
        f"{'flowrt embed (embedding)':28} {f['median']:9.3f} {f['min']:8.3f} {f['max']:8.3f} {N_TEXTS / f['median']:9.1f}",
        f"{'flowrt embed (process)':28} {w['median']:9.3f} {w['min']:8.3f} {w['max']:8.3f} {N_TEXTS / w['median']:9.1f}",
        f"{'sentence-transformers':28} {s['median']:9.3f} {s['min']:8.3f} {s['max']:8.3f} {N_TEXTS / s['median']:9.1f}",
        f"flowrt / sentence-transformers (embedding, medians): {ratio:.2f}x; "
        f"process incl. load: {s['median'] / w['median']:.2f}x",
        f"cosine flowrt vs sentence-transformers: min {cos.min():.7f}",
    ]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "texts": N_TEXTS,
                    "tokens": n_tokens,
                    "threads": args.threads,
                    "flowrt_embed_s": f,
                    "flowrt_process_s": w,
                    "sentence_transformers_s": s,
                    "ratio_median": ratio,
                    "min_cosine": float(cos.min()),
                    "model": model,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
