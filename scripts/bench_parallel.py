#!/usr/bin/env python3
"""Aggregate decode throughput of N concurrent sequences vs one, measured side by side.

Runs `flowrt bench --parallel N --json` for every N in --streams, alternating N within each
round so that all see the same machine state, and prints per N the median aggregate decode
rate over rounds, the median of the per-round ratios to N=1, and the median aggregate prefill
rate (N prompts fed side by side through the server's batching policy; N=1: one prompt).

Example:
  python3 scripts/bench_parallel.py --model smollm2 --streams 1 4 8 -r 5
"""
import argparse
import json
import statistics
import subprocess
import sys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--flowrt", default="target/ci/flowrt")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("-p", type=int, default=32, help="prompt tokens per sequence")
    ap.add_argument("-n", type=int, default=64, help="decoded tokens per sequence")
    ap.add_argument("-r", "--rounds", type=int, default=5)
    a = ap.parse_args()
    if 1 not in a.streams:
        sys.exit("--streams must include 1 (the baseline)")
    rates = {n: [] for n in a.streams}
    prefill = {n: [] for n in a.streams}
    for rnd in range(a.rounds):
        for n in a.streams:
            out = subprocess.run(
                [a.flowrt, "bench", a.model, "-p", str(a.p), "-n", str(a.n), "-r", "1",
                 "--parallel", str(n), "--json"],
                check=True, capture_output=True, text=True).stdout
            v = json.loads(out)
            rate = v["aggregate_decode_tok_s"] if n > 1 else v["decode_tok_s"]
            pre = v["aggregate_prefill_tok_s"] if n > 1 else v["prefill_tok_s"]
            rates[n].append(rate)
            prefill[n].append(pre)
            print(f"round {rnd + 1}: {n} stream(s): decode {rate:.1f} tok/s, prefill {pre:.1f} tok/s",
                  file=sys.stderr)
    print(f"model {a.model}, prompt {a.p}, decode {a.n} tokens per sequence, {a.rounds} rounds")
    print(f"{'streams':>7} {'decode tok/s (median)':>22} {'x vs 1 (median of rounds)':>27} "
          f"{'prefill tok/s (median)':>23}")
    for n in a.streams:
        ratios = [r / b for r, b in zip(rates[n], rates[1])]
        print(f"{n:>7} {statistics.median(rates[n]):>22.1f} {statistics.median(ratios):>27.2f} "
              f"{statistics.median(prefill[n]):>23.1f}")


if __name__ == "__main__":
    main()
