"""Latency and throughput of the local Python sandbox.

Measures, per backend:
  cold          one-shot execution with no pool: start a worker (bwrap + python), run, kill
  pooled        one-shot execution taking a pre-started worker from the pool (pool refills in the background)
  warm          repeated executions in one open session (the ReTool case after the first block), with the
                trainer's own CPU time per block (pipes, output, the per-block CPU-time accounting)
  throughput    executions per second with --concurrency threads, each running its own session (warm) or
                one-shot calls without a pool (cold)

Usage:
    python benchmarks/tools/bench_sandbox.py --backend auto --n 50 --concurrency 4
    python benchmarks/tools/bench_sandbox.py --backend subprocess --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trl_agentic.tools import PythonSandbox  # noqa: E402

CODE = "total = sum(i * i for i in range(1000))\nprint(total)"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summarize(latencies: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(1000 * statistics.median(latencies), 2),
        "p95_ms": round(1000 * percentile(latencies, 0.95), 2),
        "n": len(latencies),
    }


def timed_runs(run: Callable[[], Any], n: int, gap_s: float = 0.0) -> list[float]:
    """Seconds taken by each of ``n`` successful calls of ``run`` (sleeping ``gap_s`` between calls)."""
    latencies = []
    for _ in range(n):
        start = time.perf_counter()
        result = run()
        latencies.append(time.perf_counter() - start)
        assert result.ok, result
        time.sleep(gap_s)
    return latencies


def bench_cold(backend: str, n: int) -> dict[str, float]:
    sb = PythonSandbox(backend=backend, pool_size=0)
    try:
        sb.run("print(1)")  # warm the page cache
        return summarize(timed_runs(lambda: sb.run(CODE), n))
    finally:
        sb.close()


def bench_pooled(backend: str, n: int, pool_size: int, gap_s: float) -> dict[str, float]:
    sb = PythonSandbox(backend=backend, pool_size=pool_size)
    try:
        deadline = time.monotonic() + 30
        while len(sb._pool.idle) < pool_size and time.monotonic() < deadline:
            time.sleep(0.05)
        return summarize(timed_runs(lambda: sb.run(CODE), n, gap_s))  # the gap lets the pool refill
    finally:
        sb.close()


def bench_warm(backend: str, n: int) -> dict[str, float]:
    sb = PythonSandbox(backend=backend, pool_size=0)
    try:
        with sb.session() as session:
            session.run("x = 0")
            before = resource.getrusage(resource.RUSAGE_SELF)
            latencies = timed_runs(lambda: session.run("x += 1\n" + CODE), n)
            after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return {**summarize(latencies), "trainer_cpu_us": round(1e6 * cpu / n, 1)}
    finally:
        sb.close()


def bench_throughput(backend: str, concurrency: int, seconds: float, warm: bool) -> dict[str, float]:
    sb = PythonSandbox(backend=backend, pool_size=0)
    counts = [0] * concurrency
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        if warm:
            with sb.session() as session:
                session.run("x = 0")
                while time.monotonic() < stop:
                    assert session.run(CODE).ok
                    counts[i] += 1
        else:
            while time.monotonic() < stop:
                assert sb.run(CODE).ok
                counts[i] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    sb.close()
    return {
        "executions_per_s": round(sum(counts) / elapsed, 1),
        "concurrency": concurrency,
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="auto", choices=["auto", "bwrap", "subprocess", "all"])
    parser.add_argument("--n", type=int, default=50, help="executions per latency measurement")
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between pooled one-shot calls")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    backends = ["bwrap", "subprocess"] if args.backend == "all" else [args.backend]
    report = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0], "results": {}}
    for backend in backends:
        probe = PythonSandbox(backend=backend, pool_size=0)
        name = probe.backend
        probe.close()
        report["results"][name] = {
            "cold": bench_cold(backend, args.n),
            "pooled": bench_pooled(backend, args.n, args.pool_size, args.gap),
            "warm": bench_warm(backend, args.n),
            "throughput_warm": bench_throughput(backend, args.concurrency, args.seconds, warm=True),
            "throughput_cold": bench_throughput(backend, args.concurrency, args.seconds, warm=False),
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"cpu_count={report['cpu_count']} python={report['python']}")
    print(f"{'backend':<11} {'mode':<16} {'median ms':>10} {'p95 ms':>8} {'exec/s':>8} {'trainer CPU us':>15}")
    for name, res in report["results"].items():
        for mode in ("cold", "pooled", "warm"):
            cpu = res[mode].get("trainer_cpu_us", "")
            median, p95 = res[mode]["median_ms"], res[mode]["p95_ms"]
            print(f"{name:<11} {mode:<16} {median:>10.2f} {p95:>8.2f} {'':>8} {cpu:>15}")
        for mode in ("throughput_warm", "throughput_cold"):
            print(f"{name:<11} {mode:<16} {'':>10} {'':>8} {res[mode]['executions_per_s']:>8.1f}")


if __name__ == "__main__":
    main()
