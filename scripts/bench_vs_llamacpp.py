#!/usr/bin/env python3
"""Side-by-side speed of flowrt and llama.cpp on the same GGUF file, threads and machine.

Rounds alternate between the two runtimes (each round: one warm-up plus one measured run of
each), and the table reports medians over rounds and flowrt/llama.cpp ratios.

llama.cpp comes from PyPI: `llama-cpp-python==0.3.36`, built from source with
`CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36` (this script installs it
into .venv-peer when --install is given). Both runtimes prefill the same pseudo-random prompt
and decode from it (flowrt greedily, llama.cpp fixed tokens: the same work per token).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def install(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON")
    subprocess.run([str(py), "-m", "pip", "install", "llama-cpp-python==0.3.36"], check=True, env=env)
    return py


PEER = r"""
import json, sys, time
import llama_cpp
model, n_prompt, n_gen, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=model, n_ctx=n_prompt + n_gen + 8, n_batch=max(n_prompt, 8), n_ubatch=max(n_prompt, 8),
                      n_threads=threads, n_threads_batch=threads, verbose=False)
vocab = llm.n_vocab()
state = 0x9E3779B97F4A7C15
prompt = []
for _ in range(n_prompt):
    state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    prompt.append((state >> 33) % vocab)
def run(n):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    t2 = time.perf_counter()
    # The token fed does not change the work; llama-bench also decodes fixed tokens.
    for i in range(n):
        llm.eval([prompt[i % n_prompt]])
    t3 = time.perf_counter()
    return t1 - t0, t2 - t0, t3 - t2
run(min(n_gen, 8))
p, ttft, d = run(n_gen)
print(json.dumps({"prefill_tok_s": n_prompt / p, "ttft_ms": ttft * 1e3, "decode_tok_s": n_gen / d if n_gen else 0}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file both runtimes load")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=64, help="decoded tokens")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--flowrt", default=str(ROOT / "target" / "ci" / "flowrt"),
                    help="flowrt binary (default: the one scripts/test builds, target/ci/flowrt)")
    ap.add_argument("--peer-python", default=str(ROOT / ".venv-peer" / "bin" / "python"))
    ap.add_argument("--install", action="store_true", help="install llama-cpp-python into .venv-peer first")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    peer_py = Path(a.peer_python)
    if a.install:
        peer_py = install(ROOT / ".venv-peer")
    if not peer_py.exists():
        sys.exit(f"no llama.cpp peer at {peer_py}: run with --install (needs pip and a C++ compiler)")
    if not Path(a.flowrt).exists():
        sys.exit(f"no flowrt binary at {a.flowrt}: cargo build --release -p flowrt-cli")
    rows = {"flowrt": [], "llama.cpp": []}
    for rnd in range(a.rounds):
        out = subprocess.run([a.flowrt, "bench", a.model, "-p", str(a.p), "-n", str(a.n), "-r", "1", "-t", str(a.threads), "--json"],
                             check=True, capture_output=True, text=True).stdout
        rows["flowrt"].append(json.loads(out))
        out = subprocess.run([str(peer_py), "-c", PEER, a.model, str(a.p), str(a.n), str(a.threads)],
                             check=True, capture_output=True, text=True).stdout
        rows["llama.cpp"].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    keys = ["prefill_tok_s", "ttft_ms", "decode_tok_s"]
    med = {rt: {k: statistics.median(r[k] for r in rs) for k in keys} for rt, rs in rows.items()}
    ratio = {k: med["flowrt"][k] / med["llama.cpp"][k] for k in keys}
    result = {"model": a.model, "threads": a.threads, "n_prompt": a.p, "n_gen": a.n, "rounds": a.rounds,
              "median": med, "ratio_flowrt_over_llamacpp": ratio,
              "flowrt_kernels": rows["flowrt"][0].get("kernels"), "model_sha256": rows["flowrt"][0].get("model_sha256")}
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"model {a.model}\nthreads {a.threads}, prompt {a.p}, decode {a.n}, {a.rounds} alternating rounds; medians")
    print(f"{'':12}{'prefill tok/s':>15}{'ttft ms':>10}{'decode tok/s':>14}")
    for rt in rows:
        m = med[rt]
        print(f"{rt:12}{m['prefill_tok_s']:15.1f}{m['ttft_ms']:10.1f}{m['decode_tok_s']:14.1f}")
    print(f"{'flowrt/peer':12}{ratio['prefill_tok_s']:15.2f}{ratio['ttft_ms']:10.2f}{ratio['decode_tok_s']:14.2f}")


if __name__ == "__main__":
    main()
