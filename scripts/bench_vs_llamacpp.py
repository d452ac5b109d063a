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
PEER_VENV = ROOT / ".venv-peer"
PEER_PACKAGE = "llama-cpp-python==0.3.36"
KEYS = ["prefill_tok_s", "ttft_ms", "decode_tok_s"]


def install(venv: Path = PEER_VENV) -> Path:
    """Create venv if needed and install the pinned llama-cpp-python, built from source for this CPU."""
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON")
    # --no-cache-dir: a wheel cached from a build with other CMAKE_ARGS must not be reused.
    subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", PEER_PACKAGE], check=True, env=env)
    return py


def check_peer(py: Path) -> None:
    """Exit with what to do when py cannot import llama_cpp."""
    ok = py.exists() and subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True).returncode == 0
    if not ok:
        sys.exit(f"no llama.cpp peer at {py} (cannot import llama_cpp): rerun with --install, which "
                 f"builds {PEER_PACKAGE} with CMAKE_ARGS=-DGGML_NATIVE=ON into {PEER_VENV} "
                 "(needs pip, cmake and a C++ compiler; a few minutes)")


def run_checked(cmd: list[str]) -> str:
    """stdout of cmd; on failure an error carrying the command and the tail of its stderr."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[:2])} ... exited with {r.returncode}:\n{tail}")
    return r.stdout


def run_flowrt(flowrt: str, model: str, n_prompt: int, n_gen: int, threads: int,
               extra: tuple[str, ...] = ()) -> dict:
    """One `flowrt bench` process (with `extra` arguments): a warm-up run and one measured run;
    its JSON object."""
    return json.loads(run_checked([flowrt, "bench", model, "-p", str(n_prompt), "-n", str(n_gen), "-r", "1",
                                   "-t", str(threads), "--json", *extra]))


def run_peer(py: str, model: str, n_prompt: int, n_gen: int, threads: int) -> dict:
    """The same measurement with llama.cpp (the PEER script in a fresh process)."""
    out = run_checked([py, "-c", PEER, model, str(n_prompt), str(n_gen), str(threads)])
    return json.loads(out.strip().splitlines()[-1])


PEER = r"""
import json, sys, time
import llama_cpp
import numpy as np
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
    # First token: the argmax of the last position's logits, as flowrt bench takes it.
    first = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t2 = time.perf_counter()
    # The token fed does not change the work; llama-bench also decodes fixed tokens.
    for i in range(n):
        llm.eval([prompt[i % n_prompt]])
    t3 = time.perf_counter()
    return t1 - t0, t2 - t0, t3 - t2
run(min(n_gen, 8))
p, ttft, d = run(n_gen)
print(json.dumps({"prefill_tok_s": n_prompt / p, "ttft_ms": ttft * 1e3, "decode_tok_s": n_gen / d if n_gen else None,
                  "llama_cpp_version": llama_cpp.__version__,
                  "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}))
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
        peer_py = install()
    check_peer(peer_py)
    if not Path(a.flowrt).exists():
        sys.exit(f"no flowrt binary at {a.flowrt}: cargo build --profile ci -p flowrt-cli")
    rows = {"flowrt": [], "llama.cpp": []}
    for rnd in range(a.rounds):
        rows["flowrt"].append(run_flowrt(a.flowrt, a.model, a.p, a.n, a.threads))
        rows["llama.cpp"].append(run_peer(str(peer_py), a.model, a.p, a.n, a.threads))
        print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    keys = KEYS if a.n else KEYS[:2]
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
    widths = [15, 10, 14]
    for name, m, digits in [(rt, med[rt], 1) for rt in rows] + [("flowrt/peer", ratio, 2)]:
        cells = [f"{m[k]:{w}.{digits}f}" if k in m else f"{'-':>{w}}" for k, w in zip(KEYS, widths)]
        print(f"{name:12}" + "".join(cells))


if __name__ == "__main__":
    main()
