#!/usr/bin/env python3
"""Median time per step, and of chosen ops within a step, from a `flowrt ... --trace FILE`.

A step is one runlist event (with the default whole-model runlist, one forward pass); an op's
time in a step is the sum of its events inside the runlist. The last N steps are the decode
steps of `flowrt bench -p P -n N -r 1`. `--tokens T` keeps only steps of T tokens (a runlist
event's `tokens`), e.g. the prefill steps of `flowrt bench -p T`. `--share` adds each op's
median share of its step.

    flowrt bench smollm2 -p 2048 -n 32 -r 1 --no-bandwidth --trace /tmp/t.json
    python3 scripts/trace_ops.py /tmp/t.json --last 30 --op attention
    python3 scripts/trace_ops.py /tmp/t.json --tokens 2048 --last 1 --op attention --share
"""
import argparse
import json
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--last", type=int, required=True, help="steps to summarise, counted from the end")
    ap.add_argument("--op", action="append", default=[], help="op name (repeatable), e.g. attention, matmul_down")
    ap.add_argument("--tokens", type=int, help="only steps of this many tokens (e.g. the prefill steps)")
    ap.add_argument("--share", action="store_true", help="also each op's median share of its step")
    args = ap.parse_args()
    with open(args.trace) as f:
        data = json.load(f)
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X"]
    steps = sorted((e for e in events if e.get("name") == "runlist"), key=lambda e: e["ts"])
    if args.tokens is not None:
        steps = [s for s in steps if s.get("args", {}).get("tokens") == args.tokens]
    if len(steps) < args.last or args.last < 1:
        of = "" if args.tokens is None else f" of {args.tokens} tokens"
        print(f"trace has {len(steps)} runlist events{of}, --last {args.last} asks for more", file=sys.stderr)
        return 2
    steps = steps[-args.last:]
    print(f"{len(steps)} steps, median step {statistics.median(s['dur'] for s in steps) / 1e3:.2f} ms")
    for op in args.op:
        ops = sorted((e for e in events if e.get("name") == op), key=lambda e: e["ts"])
        if not ops:
            print(f"no '{op}' events in the trace", file=sys.stderr)
            return 2
        per_step = [sum(e["dur"] for e in ops if s["ts"] <= e["ts"] < s["ts"] + s["dur"]) for s in steps]
        line = f"  {op}: median {statistics.median(per_step) / 1e3:.3f} ms per step"
        if args.share:
            shares = [p / s["dur"] for p, s in zip(per_step, steps)]
            line += f", median share {100 * statistics.median(shares):.2f} %"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
