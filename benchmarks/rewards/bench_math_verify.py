"""Per-call cost of running math-verify in a verifier process (``math_equal``) instead of in the caller.

Measures, on the same answer pairs: the check in this process (``check_equal``, what ``math_equal`` did before),
the check through a warm verifier process (``math_equal``), and the cost of replacing a verifier killed by a
deadline (start + import of math-verify, paid by the next call).

Usage:
    python benchmarks/rewards/bench_math_verify.py --n 300
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trl_agentic.rewards.verifiers import math_answer  # noqa: E402

PAIRS = [
    ("72", "#### 72"),
    ("1,000", "1000"),
    ("\\frac{1}{2}", "0.5"),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),
    ("5%", "0.05"),
    ("x^2+1", "1+x^2"),
    ("73", "#### 72"),
    ("2^{10}", "1024"),
]


def timed(check, n: int) -> list[float]:
    times = []
    for i in range(n):
        prediction, gold = PAIRS[i % len(PAIRS)]
        start = time.perf_counter()
        check(prediction, gold)
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {1000 * statistics.median(times):.3f} ms, p95 {1000 * p95:.3f} ms (n={len(times)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="checks per measurement")
    args = parser.parse_args()

    timed(lambda p, g: math_answer.check_equal(p, g, 5), len(PAIRS))  # import and warm sympy's caches
    in_process = timed(lambda p, g: math_answer.check_equal(p, g, 5), args.n)
    start = time.perf_counter()
    math_answer.math_equal("1", "1")
    first = time.perf_counter() - start
    timed(math_answer.math_equal, len(PAIRS))  # warm the verifier's caches
    pooled = timed(math_answer.math_equal, args.n)
    respawns = []
    for _ in range(3):
        math_answer.math_equal("9^{9^{9^{9^{9}}}}", "1", timeout_seconds=1)  # killed by the deadline or not
        math_answer._verifiers().close()  # whatever happened, the next call starts a fresh verifier
        start = time.perf_counter()
        math_answer.math_equal("1", "1")
        respawns.append(time.perf_counter() - start)
    print(f"in this process (before):      {summary(in_process)}")
    print(f"verifier process (math_equal): {summary(pooled)}")
    overhead = statistics.median(pooled) - statistics.median(in_process)
    print(f"overhead per call (median):    {1000 * overhead:.3f} ms")
    print(f"first call (start a verifier): {first:.2f} s")
    print(f"fresh verifier after a kill:   {statistics.median(respawns):.2f} s (median of {len(respawns)})")


if __name__ == "__main__":
    main()
