"""Rewards whose checks never finish must still return within their timeout, on any thread."""

from __future__ import annotations

import pytest
from helpers import run_isolated

pytest.importorskip("math_verify")

TOWER = "9^{9^{9^{9^{9}}}}"


@pytest.mark.parametrize("where", ["main_thread", "worker_thread", "thread_pool_reward"])
def test_power_tower_returns_within_timeout(where):
    out = run_isolated(
        f"""
        import threading, time
        from concurrent.futures import ThreadPoolExecutor
        from trl_agentic.rewards import MathAnswerReward, math_equal

        start = time.monotonic()
        if {where!r} == "main_thread":
            result = math_equal({TOWER!r}, "1", timeout_seconds=1)
        elif {where!r} == "worker_thread":
            box = []
            thread = threading.Thread(target=lambda: box.append(math_equal({TOWER!r}, "1", timeout_seconds=1)))
            thread.start()
            thread.join()
            result = box[0]
        else:
            reward = MathAnswerReward(timeout_seconds=1)
            with ThreadPoolExecutor(2) as pool:
                result = pool.submit(reward, prompts=["q"] * 2, answer=["1", "2"],
                                     completions=["<answer>{TOWER}</answer>", "<answer>2</answer>"]).result()
        print("RESULT", result, round(time.monotonic() - start, 2))
        """,
        timeout=40,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = [row for row in out.stdout.splitlines() if row.startswith("RESULT")][-1]
    *result, seconds = line.split(" ", 1)[1].rsplit(" ", 1)
    assert result[0] in ("False", "[0.0, 1.0]"), line
    assert float(seconds) < 15, line
