#!/usr/bin/env python3
"""flowrt against llama.cpp on the figures flowrt's CPU performance is judged by.

For every selected model, `flowrt bench` and llama.cpp (llama-cpp-python==0.3.36 from PyPI,
built from source with CMAKE_ARGS=-DGGML_NATIVE=ON) run alternately on the same GGUF file and
threads for R rounds. Rounds go over all figures in turn, the order of the two runtimes swaps
every round, and each run is a fresh process with one warm-up and one measured pass. Printed:
one table of medians, flowrt/llama.cpp ratios and the targets with pass/FAIL; --json OUT also
writes every round's raw numbers. Both record the flowrt commit and binary hash, the kernels
flowrt chose, llama.cpp's system info, the CPU model and the thread count.

Models (--models, comma-separated; default the first four):
  smollm2-q4_1   SmolLM2-135M-Instruct Q4_1 from flowrt's model store (pulled if absent)
  minicpm5-q4_1  MiniCPM5-2B geometry (42 layers, hidden 2048, 16:2 GQA, vocab 73448,
  minicpm5-q4_0  2.28 B random weights), GGUF by scripts/hf_to_gguf.py
  minicpm5-q8_0
  qwen3moe-q4_0  Qwen3-30B-A3B width with 4 layers (hidden 2048, 32:4 GQA, 128 experts, 8
                 active, expert FFN 768, vocab 151936; 3.1 B random weights, about 0.54 B
                 read per token), made by scripts/make_moe_geometry.py in --moe-cache
  gptoss-mxfp4   gpt-oss-20b width with 4 layers (hidden 2880, 64:8 GQA with sinks, 32
                 experts, 4 active, expert FFN 2880, vocab 201088; 4.45 B random weights,
                 about 1.08 B read per token), experts MXFP4 and the rest Q8_0 (mxfp4_moe),
                 made by scripts/make_moe_geometry.py --family gpt-oss in --gptoss-cache
Figures per model: prefill of 128 tokens (tok/s) and decode (tok/s; 64 tokens on SmolLM2,
32 on MiniCPM5 to keep a round under a minute, -n overrides both); on minicpm5-q4_1 also the
time to first token of a 38-token prompt (prefill plus the argmax of the last logits, ms).
Under the table: flowrt's decode as a share of its active-weight roofline (`flowrt bench`'s
weight bytes a token reads × decode tok/s over the read bandwidth it measures), medians.

MiniCPM5 GGUFs are made on demand in --cache (default .flowrt-cache/minicpm5, git-ignored) by
scripts/make_minicpm5_geometry.py run with .venv-ref's python (set it up with
`python3 -m venv .venv-ref && .venv-ref/bin/pip install -r scripts/requirements-reference.txt`).
The first one writes the 4.6 GB bf16 checkpoint, then each GGUF (q4_1 1.4 GB, q4_0 1.3 GB,
q8_0 2.4 GB): several GB of RAM and some minutes per file. Only the requested types are made;
files already in the cache are reused (delete one to remake it).

Usage:
  python3 scripts/compare_peers.py --install          # first time: build llama.cpp into .venv-peer
  python3 scripts/compare_peers.py -r 3 -t 2 --json bench-out/compare.json
  python3 scripts/compare_peers.py --models smollm2-q4_1,minicpm5-q4_1
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_vs_llamacpp import PEER_VENV, ROOT, check_peer, install, run_flowrt, run_peer

SMOLLM2_TAG = "smollm2:135m"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TTFT_TARGET_MS = 420.0  # time to first token, 38-token prompt, MiniCPM5 geometry Q4_1


@dataclass(frozen=True)
class Model:
    source: str  # "store" (SmolLM2, flowrt's store), a MiniCPM5 GGUF type, or "<prefix>:<type>" (MOE_SOURCES)
    n_gen: int  # decoded tokens per run
    ttft: bool = False  # also measure the time to first token of a 38-token prompt


MODELS = {
    "smollm2-q4_1": Model("store", 64),
    "minicpm5-q4_1": Model("q4_1", 32, ttft=True),
    "minicpm5-q4_0": Model("q4_0", 32),
    "minicpm5-q8_0": Model("q8_0", 32),
    "qwen3moe-q4_0": Model("moe:q4_0", 32),
    "gptoss-mxfp4": Model("gptoss:mxfp4_moe", 32),
}
DEFAULT_MODELS = ["smollm2-q4_1", "minicpm5-q4_1", "minicpm5-q4_0", "minicpm5-q8_0"]

# Smallest acceptable flowrt/llama.cpp speed ratio per (model, figure): issue 6's acceptance ratios (flowrt / llama.cpp, side by side in one run).
TARGET_RATIO = {
    ("smollm2-q4_1", "prefill"): 4.0,
    ("smollm2-q4_1", "decode"): 1.8,
    ("minicpm5-q4_1", "prefill"): 5.0,
    ("minicpm5-q4_1", "decode"): 2.2,
    ("minicpm5-q4_0", "prefill"): 1.6,
    ("minicpm5-q4_0", "decode"): 1.1,
    ("minicpm5-q8_0", "prefill"): 2.0,
    ("minicpm5-q8_0", "decode"): 1.8,
    # issue 17's acceptance for the Qwen3-30B-A3B-shaped model
    ("qwen3moe-q4_0", "prefill"): 2.0,
    ("qwen3moe-q4_0", "decode"): 1.5,
    # issue 17's acceptance for the gpt-oss-20b-shaped model (MXFP4 experts)
    ("gptoss-mxfp4", "prefill"): 2.0,
    ("gptoss-mxfp4", "decode"): 1.5,
}

# Made-on-demand MoE models: source prefix -> (what, --family of make_moe_geometry.py).
MOE_SOURCES = {"moe": ("Qwen3-MoE-geometry", "qwen3-moe"), "gptoss": ("gpt-oss-geometry", "gpt-oss")}


@dataclass
class Job:
    """One figure measured side by side: a model, a prompt length and a decode length."""
    model: str
    path: str
    n_prompt: int
    n_gen: int
    figures: list  # (label, JSON key, target kind): kind "ratio" (speed) or "ttft" (absolute ms)
    rounds: list
    error: str | None = None


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def flowrt_home() -> Path:
    """flowrt's data directory, by flowrt_store::flowrt_home's rule."""
    for var, sub in (("FLOWRT_HOME", ""), ("XDG_DATA_HOME", "flowrt"), ("HOME", ".local/share/flowrt")):
        v = os.environ.get(var, "")
        if v and (var != "XDG_DATA_HOME" or os.path.isabs(v)):
            return Path(v) / sub
    sys.exit("cannot locate flowrt's data directory: set FLOWRT_HOME")


def smollm2_path(flowrt: str) -> Path:
    path = flowrt_home() / "models" / SMOLLM2_FILE
    if not path.exists():
        log(f"{path} missing: flowrt pull {SMOLLM2_TAG}")
        subprocess.run([flowrt, "pull", SMOLLM2_TAG], check=True)
    return path


def ggufs(what: str, script: str, cache: Path, types: list[str], ref_python: Path,
          extra: tuple[str, ...] = ()) -> dict[str, Path]:
    """model-<type>.gguf in cache for every type, making the missing ones with scripts/<script>."""
    paths = {t: cache / f"model-{t}.gguf" for t in types}
    missing = [t for t, p in paths.items() if not p.exists()]
    if missing:
        if not ref_python.exists():
            sys.exit(f"{what} GGUFs {missing} are not in {cache} and making them needs {ref_python}: "
                     "python3 -m venv .venv-ref && .venv-ref/bin/pip install -r scripts/requirements-reference.txt")
        log(f"making {what} GGUFs {missing} in {cache} (several GB of RAM, minutes per file)")
        subprocess.run([str(ref_python), str(ROOT / "scripts" / script), *extra, "--out", str(cache),
                        "--gguf", ",".join(missing), "--reuse-weights"], check=True)
    return paths


def plan(models: list[str], paths: dict[str, Path], a) -> list[Job]:
    jobs = []
    for m in models:
        n_gen = a.n if a.n is not None else MODELS[m].n_gen
        figures = [(f"prefill-{a.p}", "prefill_tok_s", "prefill"), ("decode", "decode_tok_s", "decode")]
        jobs.append(Job(m, str(paths[m]), a.p, n_gen, figures, []))
        if MODELS[m].ttft:
            jobs.append(Job(m, str(paths[m]), a.ttft_prompt, 0, [(f"ttft-{a.ttft_prompt}", "ttft_ms", "ttft")], []))
    return jobs


def run_rounds(jobs: list[Job], flowrt: str, peer_py: str, rounds: int, threads: int,
               act_quant: str | None = None) -> None:
    runners = {"flowrt": lambda j: run_flowrt(flowrt, j.path, j.n_prompt, j.n_gen, threads),
               "llama.cpp": lambda j: run_peer(peer_py, j.path, j.n_prompt, j.n_gen, threads)}
    if act_quant:
        runners[f"flowrt {act_quant}"] = lambda j: run_flowrt(flowrt, j.path, j.n_prompt, j.n_gen, threads,
                                                               ("--act-quant", act_quant))
    names = list(runners)
    for r in range(rounds):
        # Each round starts with another runtime (two: the order swaps every round).
        order = names[r % len(names):] + names[:r % len(names)]
        for j in jobs:
            if j.error:
                continue
            t0 = time.perf_counter()
            try:
                j.rounds.append({rt: runners[rt](j) for rt in order})
            except RuntimeError as e:
                j.error = str(e)
                log(f"{j.model} -p {j.n_prompt} -n {j.n_gen}: {e}")
                continue
            log(f"round {r + 1}/{rounds} {j.model} -p {j.n_prompt} -n {j.n_gen}: {time.perf_counter() - t0:.0f} s")


def table_rows(jobs: list[Job]) -> list[dict]:
    rows = []
    for j in jobs:
        for label, key, kind in j.figures:
            row = {"model": j.model, "figure": label, "unit": "ms" if kind == "ttft" else "tok/s"}
            if j.error or not j.rounds:
                rows.append({**row, "error": j.error or "no rounds"})
                continue
            peer = statistics.median(rd["llama.cpp"][key] for rd in j.rounds)
            for rt in [rt for rt in j.rounds[0] if rt.startswith("flowrt")]:
                med = statistics.median(rd[rt][key] for rd in j.rounds)
                ratio = med / peer
                if kind == "ttft":
                    target, ok = f"<= {TTFT_TARGET_MS:.0f} ms", med <= TTFT_TARGET_MS
                else:
                    t = TARGET_RATIO[(j.model, kind)]
                    target, ok = f">= {t:.2f}", ratio >= t
                suffix = rt[len("flowrt"):]
                rows.append({**row, "figure": label + suffix, "runtime": rt, "flowrt": med, "llama.cpp": peer,
                             "ratio": ratio, "target": target, "pass": ok})
                if kind != "decode":
                    continue
                roof = [rd[rt].get("decode_roofline_pct") for rd in j.rounds]
                if all(isinstance(x, (int, float)) for x in roof):
                    rows[-1]["roofline"] = {
                        k: statistics.median(rd[rt][k] for rd in j.rounds)
                        for k in ("decode_roofline_pct", "decode_weight_gb_s", "read_bandwidth_gb_s",
                                  "weight_bytes_per_token")}
    return rows


def print_table(rows: list[dict], meta: dict) -> None:
    print(f"flowrt {meta['flowrt_commit']}, binary sha256 {meta['flowrt_binary_sha256'][:16]}, "
          f"kernels {meta['flowrt_kernels']} (CPU features {' '.join(meta['cpu_features'] or [])})")
    print(f"llama.cpp: llama-cpp-python {meta['llama_cpp_version']}; {meta['llama_cpp_system_info']}")
    print(f"CPU {meta['cpu_model']} ({meta['logical_cpus']} logical CPUs); {meta['threads']} threads, "
          f"{meta['rounds']} alternating rounds; medians. ttft ratio: lower is better, target absolute")
    load = meta["load_avg_1_5_15_before"][0]
    if load > 0.5:
        print(f"note: 1-minute load average {load:.2f} before the run: other processes competed for the CPU")
    head = f"{'model':15}{'figure':17}{'flowrt':>10}{'llama.cpp':>11}{'unit':>7}{'flowrt/peer':>13}  {'target':<11}"
    print(head)
    print("-" * (len(head) + 5))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:15}{r['figure']:17}  error: {r['error'].splitlines()[0]}")
            continue
        print(f"{r['model']:15}{r['figure']:17}{r['flowrt']:10.1f}{r['llama.cpp']:11.1f}{r['unit']:>7}"
              f"{r['ratio']:13.2f}  {r['target']:<11}{'pass' if r['pass'] else 'FAIL'}")
    for r in rows:
        if "roofline" in r:
            x = r["roofline"]
            print(f"{r['model']}: {r['runtime']} decode {x['decode_roofline_pct']:.1f} % of the active-weight roofline "
                  f"({x['decode_weight_gb_s']:.1f} GB/s of the {x['weight_bytes_per_token'] / 1e6:.1f} MB a token "
                  f"reads, against {x['read_bandwidth_gb_s']:.1f} GB/s read bandwidth; medians)")


def flowrt_commit() -> str:
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run(git + ["rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"],
                           capture_output=True, text=True).stdout.strip()
    return f"{head or 'unknown'}{' + uncommitted changes in crates/' if dirty else ''}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, from: {', '.join(MODELS)}")
    ap.add_argument("-r", "--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads for both runtimes (default 2)")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens of the prefill figure (default 128)")
    ap.add_argument("-n", type=int, help="decoded tokens (default 64 on SmolLM2, 32 on MiniCPM5)")
    ap.add_argument("--ttft-prompt", type=int, default=38, help="prompt tokens of the TTFT figure (default 38)")
    ap.add_argument("--flowrt", default=str(ROOT / "target" / "ci" / "flowrt"),
                    help="flowrt binary (default target/ci/flowrt: cargo build --profile ci -p flowrt-cli); "
                         "copied first, so a rebuild during the run does not change what is measured")
    ap.add_argument("--peer-python", type=Path, default=PEER_VENV / "bin" / "python")
    ap.add_argument("--install", action="store_true",
                    help="create/update .venv-peer with llama-cpp-python==0.3.36 built with -DGGML_NATIVE=ON")
    ap.add_argument("--ref-python", type=Path, default=ROOT / ".venv-ref" / "bin" / "python",
                    help="python with torch, transformers and gguf, to make MiniCPM5 GGUFs (default .venv-ref)")
    ap.add_argument("--cache", type=Path, default=ROOT / ".flowrt-cache" / "minicpm5",
                    help="where MiniCPM5-geometry checkpoint and GGUFs are made and reused")
    ap.add_argument("--moe-cache", type=Path, default=ROOT / ".flowrt-cache" / "qwen3moe",
                    help="where the Qwen3-MoE-geometry checkpoint and GGUFs are made and reused")
    ap.add_argument("--gptoss-cache", type=Path, default=ROOT / ".flowrt-cache" / "gptoss",
                    help="where the gpt-oss-geometry checkpoint and GGUFs are made and reused")
    ap.add_argument("--act-quant", metavar="Q",
                    help="also run flowrt with `--act-quant Q` (e.g. q8x) in the same rounds: a third runtime, "
                         "each round starting with another one; its rows are marked ` Q`")
    ap.add_argument("--prepare-only", action="store_true", help="make or fetch the model files, then exit")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the raw per-round numbers here")
    a = ap.parse_args()

    models = [m.strip() for m in a.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        ap.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    if not Path(a.flowrt).exists():
        sys.exit(f"no flowrt binary at {a.flowrt}: cargo build --profile ci -p flowrt-cli")
    peer_py = install() if a.install else a.peer_python
    if not a.prepare_only:
        check_peer(peer_py)

    paths = {}
    types = [MODELS[m].source for m in models if MODELS[m].source != "store" and ":" not in MODELS[m].source]
    files = ggufs("MiniCPM5-geometry", "make_minicpm5_geometry.py", a.cache, types, a.ref_python) if types else {}
    for prefix, (what, family) in MOE_SOURCES.items():
        moe = [MODELS[m].source.split(":")[1] for m in models if MODELS[m].source.startswith(prefix + ":")]
        if moe:
            cache = a.moe_cache if prefix == "moe" else a.gptoss_cache
            made = ggufs(what, "make_moe_geometry.py", cache, moe, a.ref_python, ("--family", family))
            files.update({f"{prefix}:{t}": p for t, p in made.items()})
    for m in models:
        paths[m] = smollm2_path(a.flowrt) if MODELS[m].source == "store" else files[MODELS[m].source]
    if a.prepare_only:
        print("\n".join(f"{m}: {p}" for m, p in paths.items()))
        return 0

    load_before, commit = os.getloadavg(), flowrt_commit()
    with tempfile.TemporaryDirectory(prefix="flowrt-compare-") as tmp:
        flowrt = str(Path(tmp) / "flowrt")
        shutil.copy2(a.flowrt, flowrt)
        binary_sha = hashlib.sha256(Path(flowrt).read_bytes()).hexdigest()
        jobs = plan(models, paths, a)
        run_rounds(jobs, flowrt, str(peer_py), a.rounds, a.threads, a.act_quant)

    first = next((j.rounds[0] for j in jobs if j.rounds), {"flowrt": {}, "llama.cpp": {}})
    meta = {"flowrt_commit": commit, "flowrt_binary": a.flowrt, "flowrt_binary_sha256": binary_sha,
            "flowrt_kernels": first["flowrt"].get("kernels"), "cpu_features": first["flowrt"].get("cpu_features"),
            "llama_cpp_version": first["llama.cpp"].get("llama_cpp_version"),
            "llama_cpp_system_info": first["llama.cpp"].get("system_info"),
            "cpu_model": cpu_model(), "logical_cpus": os.cpu_count(), "threads": a.threads, "rounds": a.rounds,
            "load_avg_1_5_15_before": load_before, "load_avg_1_5_15_after": os.getloadavg(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = table_rows(jobs)
    print_table(rows, meta)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        raw = [{"model": j.model, "path": j.path, "n_prompt": j.n_prompt, "n_gen": j.n_gen, "error": j.error,
                "model_sha256": j.rounds[0]["flowrt"].get("model_sha256") if j.rounds else None,
                "rounds": j.rounds} for j in jobs]
        a.json.write_text(json.dumps({**meta, "table": rows, "jobs": raw}, indent=1) + "\n")
        log(f"wrote {a.json}")
    return 1 if any(j.error for j in jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
