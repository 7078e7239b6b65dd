"""Cost of CodeTestsReward per completion: the program and each of its tests, run apart (two workers).

Scores ``--n`` completions (an MBPP-style function and three asserts each) with ``--workers`` completions at once,
on a sandbox with a pool of ``--pool-size`` pre-started workers, and prints completions per second and the time
one ``reward(...)`` call took per completion.

Usage:
    python benchmarks/rewards/bench_code_tests.py --n 64 --workers 4 --pool-size 8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trl_agentic.rewards import CodeTestsReward  # noqa: E402
from trl_agentic.tools import PythonSandbox  # noqa: E402

PROGRAM = "<answer>def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n</answer>"
TESTS = [
    "assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
    "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))",
    "assert set(similar_elements((11, 12, 14, 13), (17, 15, 14, 13))) == set((13, 14))",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64, help="completions scored per run")
    parser.add_argument("--workers", type=int, default=4, help="completions scored at once")
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    sandbox = PythonSandbox(timeout=10, pool_size=args.pool_size)
    reward = CodeTestsReward(sandbox=sandbox, max_workers=args.workers)
    try:
        deadline = time.monotonic() + 60
        while len(sandbox._pool.idle) < args.pool_size and time.monotonic() < deadline:
            time.sleep(0.05)
        rates = []
        for _ in range(args.runs):
            start = time.perf_counter()
            scores = reward(prompts=["q"] * args.n, completions=[PROGRAM] * args.n, tests=[TESTS] * args.n)
            elapsed = time.perf_counter() - start
            assert scores == [1.0] * args.n, scores
            rates.append(args.n / elapsed)
        best = max(rates)
        print(f"backend={sandbox.backend} n={args.n} workers={args.workers} pool={args.pool_size}")
        print(f"completions/s per run: {', '.join(f'{r:.1f}' for r in rates)} (best {best:.1f}, "
              f"{1000 / best:.1f} ms per completion)")
    finally:
        sandbox.close()


if __name__ == "__main__":
    main()
