#!/usr/bin/env python3
"""Load and soak test of `flowrt serve` on loopback (issue 18).

Starts `flowrt serve MODEL --parallel P` on a free loopback port, runs N concurrent
streaming chat clients (`/v1/chat/completions`, `stream: true`) for D seconds, optionally
dropping a fraction of the streams mid-way, samples the server's RSS from /proc every
second, and reports:

- requests started, completed, disconnected on purpose, failed (by status / error);
- time to first token (TTFT) and inter-token latency, p50 / p99, as the clients see them;
- 5xx and 429 counts;
- RSS at the end of the warm-up and at the end of the run, and whether it stayed flat
  (within --flat-pct of the warm-up figure);
- the server's /metrics after the clients stop (active sequences and queue must be 0).

It writes the figures as JSON (--out) and, when matplotlib can be imported, a PNG of RSS and
tokens/s over time next to it. Exit status: 0 when there was no 5xx, no client error, RSS
stayed flat and the server ended idle; 1 otherwise; 2 on bad arguments or a server that
did not start.

Bounded on purpose: loopback only, at most --max-requests requests and --duration seconds
(at most one hour), and the server is killed when the script ends.

Only the standard library is needed (matplotlib is optional).

Example (see docs/reliability.md):
    cargo build --release -p flowrt-cli
    FLOWRT_SMOLLM2_GGUF=.../SmolLM2-135M-Instruct.Q4_1.gguf \
        python3 scripts/soak.py --clients 16 --duration 300 --out bench-out/soak.json
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # loopback only, on purpose
MAX_DURATION_S = 3600

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is in three sentences.",
    "List five fruits and one fact about each.",
    "Tell me a story about a robot learning to paint.",
    "What is the capital of France? Answer and then describe the city.",
    "Give me a recipe for pancakes.",
    "Summarise the plot of a detective novel you invent.",
    "Describe how rain forms, step by step.",
]


def percentile(xs, p):
    """The p-th percentile (0..100) of xs by linear interpolation; None when empty."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def rss_bytes(pid):
    """The resident set size of `pid` from /proc, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def find_binary(arg):
    if arg:
        return Path(arg)
    for profile in ("release", "ci"):
        p = REPO / "target" / profile / "flowrt"
        if p.is_file():
            return p
    print("soak.py: no flowrt binary: run `cargo build --release -p flowrt-cli`, or pass --binary", file=sys.stderr)
    sys.exit(2)


class Server:
    """`flowrt serve` on a free loopback port; its stderr goes to `log`."""

    def __init__(self, binary, model, parallel, extra, log):
        self.log = open(log, "w")
        cmd = [str(binary), "serve", *[str(m) for m in model], "--host", HOST, "--port", "0",
               "--parallel", str(parallel)] + extra
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addr = None
        self.listening = threading.Event()
        # Reads stderr into the log (so the server never blocks on a full pipe) and picks
        # out the address it listens on.
        threading.Thread(target=self._drain, daemon=True).start()
        if not self.listening.wait(120) or self.addr is None:
            self.stop()
            print(f"soak.py: flowrt serve did not start (it exited, or printed no address within 120 s); see {log}", file=sys.stderr)
            sys.exit(2)
        self.host, port = self.addr.rsplit(":", 1)
        self.port = int(port)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            m = re.search(r"listening on http://(\S+)", line)
            if m and self.addr is None:
                self.addr = m.group(1)
                self.listening.set()
        self.listening.set()  # exited: stop waiting

    def get(self, path, timeout=30):
        c = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            c.request("GET", path, headers={"Host": f"localhost:{self.port}"})
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            c.close()

    def wait_healthy(self, limit=300):
        t0 = time.time()
        while time.time() - t0 < limit:
            if self.proc.poll() is not None:
                return False
            try:
                if self.get("/health", timeout=5)[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def stop(self):
        """SIGTERM, then SIGKILL after 30 s; the exit status (None if killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.started = 0
        self.completed = 0
        self.disconnected = 0
        self.status = {}  # HTTP status -> count (non-200 answers)
        self.errors = {}  # client-side error text -> count
        self.ttft = []
        self.itl = []
        self.tokens = 0
        self.token_times = []  # arrival time of every token (s since start)

    def bump(self, table, key):
        with self.lock:
            table[key] = table.get(key, 0) + 1


def one_request(port, model, rng, stats, t_start, disconnect_frac, max_tokens, stop_at):
    """One streamed chat; returns how long to wait before the next (after a 429)."""
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "stream": True,
    })
    # Drop this stream after `cut` tokens (somewhere inside the answer), or never.
    cut = rng.randint(1, max(1, max_tokens // 2)) if rng.random() < disconnect_frac else None
    c = http.client.HTTPConnection(HOST, port, timeout=120)
    with stats.lock:
        stats.started += 1
    try:
        t0 = time.monotonic()
        c.request("POST", "/v1/chat/completions", body=body, headers={
            "Host": f"localhost:{port}",
            "Content-Type": "application/json",
        })
        r = c.getresponse()
        if r.status != 200:
            text = r.read().decode("utf-8", "replace")
            if r.status == 503 and "memory budget" in text:
                # Several models under --max-memory: the one asked for waits for room.
                stats.bump(stats.status, "503 (memory budget: retry later)")
                return 0.5
            stats.bump(stats.status, r.status)
            return 0.5 if r.status == 429 else 0.0
        last = None
        n = 0
        done = False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                stats.bump(stats.errors, "error event: " + str(ev["error"])[:80])
                break
            choices = ev.get("choices") or []
            if not choices or not (choices[0].get("delta") or {}).get("content"):
                continue
            now = time.monotonic()
            with stats.lock:
                if last is None:
                    stats.ttft.append(now - t0)
                else:
                    stats.itl.append(now - last)
                stats.tokens += 1
                stats.token_times.append(now - t_start)
            last = now
            n += 1
            if cut is not None and n >= cut:
                with stats.lock:
                    stats.disconnected += 1
                return 0.0
            if time.monotonic() > stop_at + 120:
                stats.bump(stats.errors, "stream still running 120 s after the end")
                return 0.0
        if done:
            with stats.lock:
                stats.completed += 1
        else:
            stats.bump(stats.errors, "stream ended without [DONE]")
    except (OSError, http.client.HTTPException, ValueError) as e:
        stats.bump(stats.errors, type(e).__name__ + ": " + str(e)[:80])
    finally:
        c.close()  # mid-stream: the server sees the client go away
    return 0.0


def client(i, port, models, seed, stats, t_start, stop_at, args, budget):
    rng = random.Random(seed * 1000 + i)
    while time.monotonic() < stop_at:
        # Several models: all clients ask for one model per phase of --model-phase seconds,
        # the next model in the next phase (so the server must unload and load under load).
        phase = int((time.monotonic() - t_start) / args.model_phase) if args.model_phase else 0
        model = models[phase % len(models)]
        with budget["lock"]:
            if budget["left"] <= 0:
                return
            budget["left"] -= 1
        wait = one_request(port, model, rng, stats, t_start, args.disconnect_frac,
                           rng.randint(args.min_tokens, args.max_tokens), stop_at)
        if wait:
            time.sleep(wait)


def metrics_values(text, name):
    """Sum of every sample of metric `name` in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append",
                    help="GGUF to serve (default: $FLOWRT_SMOLLM2_GGUF); repeat to serve several")
    ap.add_argument("--model-phase", type=float, default=0,
                    help="with several models: seconds each model is the one asked for, in turn")
    ap.add_argument("--sample-every", type=float, default=1.0, help="seconds between RSS samples")
    ap.add_argument("--binary", help="the flowrt binary (default: target/release/flowrt, else target/ci/flowrt)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=300, help="seconds of load (default 300)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds counted as warm-up for the RSS check (default: a sixth of --duration, at most 30)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--disconnect-frac", type=float, default=0.0,
                    help="fraction of streams the client drops mid-answer (0..1)")
    ap.add_argument("--min-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-requests", type=int, default=100000, help="stop after this many requests in all")
    ap.add_argument("--flat-pct", type=float, default=5.0, help="allowed RSS growth after warm-up, in percent")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench-out/soak.json", help="JSON of the figures (a .png next to it)")
    ap.add_argument("--label", default=None, help="title of the plot")
    ap.add_argument("serve_args", nargs="*", help="more `flowrt serve` options, after --")
    args = ap.parse_args()

    if not args.model and os.environ.get("FLOWRT_SMOLLM2_GGUF"):
        args.model = [os.environ["FLOWRT_SMOLLM2_GGUF"]]
    if not args.model or not all(Path(m).is_file() for m in args.model):
        ap.error("--model (or FLOWRT_SMOLLM2_GGUF) must name GGUF files")
    if len(args.model) > 1 and args.model_phase <= 0:
        ap.error("several --model need --model-phase")
    if not 0.05 <= args.sample_every <= 10:
        ap.error("--sample-every must be 0.05..10 s")
    if not 1 <= args.clients <= 256:
        ap.error("--clients must be 1..256")
    if not 0 < args.duration <= MAX_DURATION_S:
        ap.error(f"--duration must be more than 0 and at most {MAX_DURATION_S} s")
    if not 0.0 <= args.disconnect_frac <= 1.0:
        ap.error("--disconnect-frac must be 0..1")
    if not 1 <= args.min_tokens <= args.max_tokens <= 4096:
        ap.error("need 1 <= --min-tokens <= --max-tokens <= 4096")
    if args.max_requests < 1:
        ap.error("--max-requests must be at least 1")
    warmup = args.warmup if args.warmup is not None else min(30.0, args.duration / 6)
    if not 0 <= warmup < args.duration:
        ap.error("--warmup must be 0 or more and less than --duration")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    binary = find_binary(args.binary)
    server = Server(binary, args.model, args.parallel, args.serve_args, out.with_suffix(".server.log"))
    try:
        if not server.wait_healthy():
            print(f"soak.py: flowrt serve did not become healthy; see {out.with_suffix('.server.log')}", file=sys.stderr)
            return 2
        model_ids = [m["id"] for m in json.loads(server.get("/v1/models")[1])["data"]]
        pid = server.proc.pid
        print(f"soak.py: {' '.join(server.cmd)} (pid {pid}) on {server.addr}, models {model_ids}", file=sys.stderr)
        print(f"soak.py: {args.clients} clients for {args.duration:g} s, disconnect fraction {args.disconnect_frac}", file=sys.stderr)

        stats = Stats()
        t_start = time.monotonic()
        stop_at = t_start + args.duration
        budget = {"lock": threading.Lock(), "left": args.max_requests}
        rss = []  # (s since start, bytes)
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                v = rss_bytes(pid)
                if v is not None:
                    rss.append((time.monotonic() - t_start, v))
                sampling.wait(args.sample_every)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        threads = [threading.Thread(target=client, args=(i, server.port, model_ids, args.seed, stats, t_start, stop_at, args, budget), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        last_report = t_start
        while any(t.is_alive() for t in threads):
            time.sleep(0.5)
            now = time.monotonic()
            if now - last_report >= 10:
                last_report = now
                with stats.lock:
                    print(f"soak.py: {now - t_start:5.0f} s: {stats.started} requests, {stats.tokens} tokens, "
                          f"RSS {rss[-1][1] / 2**20 if rss else 0:.0f} MiB", file=sys.stderr)
            if now > stop_at + 180:
                stats.bump(stats.errors, "clients still running 180 s after the end")
                break
        load_end = time.monotonic() - t_start
        time.sleep(1.0)  # let the server see the last disconnects
        sampling.set()
        sampler.join()
        metrics = server.get("/metrics")[1]
        idle = {
            "active_sequences": metrics_values(metrics, "flowrt_active_sequences"),
            "queue_depth": metrics_values(metrics, "flowrt_queue_depth"),
        }
        exit_status = server.stop()
    finally:
        server.stop()

    def at(t):
        """The RSS sample nearest to time t."""
        return min(rss, key=lambda s: abs(s[0] - t))[1] if rss else None

    rss_warm = at(warmup)
    in_load = [v for (t, v) in rss if warmup <= t <= load_end]
    rss_end = in_load[-1] if in_load else None
    rss_max = max(in_load) if in_load else None
    growth = None if not (rss_warm and rss_end) else 100.0 * (rss_end - rss_warm) / rss_warm
    growth_max = None if not (rss_warm and rss_max) else 100.0 * (rss_max - rss_warm) / rss_warm
    flat = growth is not None and abs(growth) <= args.flat_pct
    n5xx = sum(n for s, n in stats.status.items() if isinstance(s, int) and s >= 500)
    n503_budget = stats.status.get("503 (memory budget: retry later)", 0)
    n429 = stats.status.get(429, 0)
    # Tokens per second, per one-second bucket of the run.
    buckets = [0] * int(load_end)  # whole seconds only: the last, partial one would read low
    for t in stats.token_times:
        if int(t) < len(buckets):
            buckets[int(t)] += 1

    def ms(x):
        return None if x is None else round(1000 * x, 1)

    figures = {
        "command": " ".join(sys.argv),
        "server": " ".join(server.cmd),
        "clients": args.clients,
        "duration_s": args.duration,
        "load_s": round(load_end, 1),
        "warmup_s": warmup,
        "parallel": args.parallel,
        "disconnect_frac": args.disconnect_frac,
        "max_tokens_range": [args.min_tokens, args.max_tokens],
        "requests": stats.started,
        "completed": stats.completed,
        "disconnected_on_purpose": stats.disconnected,
        "status_counts": {str(k): v for k, v in sorted(stats.status.items(), key=lambda kv: str(kv[0]))},
        "client_errors": stats.errors,
        "http_5xx": n5xx,
        "http_429": n429,
        "http_503_memory_budget": n503_budget,
        "models": model_ids,
        "model_phase_s": args.model_phase,
        "tokens": stats.tokens,
        "tokens_per_s": round(stats.tokens / load_end, 1) if load_end else None,
        "ttft_ms": {"p50": ms(percentile(stats.ttft, 50)), "p99": ms(percentile(stats.ttft, 99)), "n": len(stats.ttft)},
        "itl_ms": {"p50": ms(percentile(stats.itl, 50)), "p99": ms(percentile(stats.itl, 99)), "n": len(stats.itl)},
        "rss_mib": {
            "max": rss and round(max(v for _, v in rss) / 2**20, 1),
            "at_warmup_end": rss_warm and round(rss_warm / 2**20, 1),
            "at_end": rss_end and round(rss_end / 2**20, 1),
            "max_after_warmup": rss_max and round(rss_max / 2**20, 1),
            "growth_pct": growth and round(growth, 2),
            "max_growth_pct": growth_max and round(growth_max, 2),
            "flat_within_pct": args.flat_pct,
            "flat": flat,
        },
        "after_load": idle,
        "server_exit_status": exit_status,
        "rss_series": [[round(t, 1), v] for (t, v) in rss],
        "tokens_per_s_series": buckets,
    }
    out.write_text(json.dumps(figures, indent=1) + "\n")
    png = out.with_suffix(".png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax1 = plt.subplots(figsize=(9, 4.5))
        ax1.plot([t for t, _ in rss], [v / 2**20 for _, v in rss], color="tab:blue", label="RSS (MiB)")
        ax1.set_xlabel("seconds")
        ax1.set_ylabel("server RSS (MiB)", color="tab:blue")
        ax1.axvline(warmup, color="grey", linestyle=":", label="end of warm-up")
        if rss_warm:
            lo, hi = rss_warm * (1 - args.flat_pct / 100) / 2**20, rss_warm * (1 + args.flat_pct / 100) / 2**20
            ax1.axhspan(lo, hi, color="tab:blue", alpha=0.08, label=f"warm-up RSS ±{args.flat_pct:g} %")
        ax1.set_ylim(bottom=0)
        ax2 = ax1.twinx()
        ax2.plot(range(len(buckets)), buckets, color="tab:orange", alpha=0.7, label="tokens/s (clients)")
        ax2.set_ylabel("tokens/s received", color="tab:orange")
        ax2.set_ylim(bottom=0)
        title = args.label or f"flowrt serve --parallel {args.parallel}: {args.clients} streaming clients, disconnect {args.disconnect_frac:g}"
        ax1.set_title(title)
        h1, l1 = ax1.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax1.legend(h1 + h2, l1 + l2, loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        png_note = str(png)
    except ImportError:
        png_note = "none (matplotlib is not importable)"

    summary = {k: v for k, v in figures.items() if not k.endswith("_series")}
    print(json.dumps(summary, indent=1))
    print(f"soak.py: figures in {out}, plot: {png_note}", file=sys.stderr)
    # Several models swap in and out, so RSS is not flat by design; --max-memory bounds it.
    ok = (n5xx == 0 and not stats.errors and (flat or len(model_ids) > 1)
          and idle["active_sequences"] == 0 and idle["queue_depth"] == 0)
    if not ok:
        print("soak.py: FAILED: 5xx, client errors, RSS not flat, or the server not idle after the load", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
