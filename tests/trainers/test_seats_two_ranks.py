"""Self-play on two CPU processes: a GRPO group's runs of one seat are on both ranks (one game on each), and each
rank's advantages are those of the global group per prompt and seat (the runs' seats gathered once a round)."""

from pathlib import Path

import pytest
from helpers import launch_two_processes

from trl_agentic.trajectory import load_trajectories

pytestmark = pytest.mark.multiprocess


def test_seat_groups_span_processes(tmp_path, tiny_model_dir):
    proc = launch_two_processes(Path(__file__).with_name("seats_ranks.py"), str(tmp_path), tiny_model_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [list(load_trajectories(tmp_path / f"trajectories-rank{k}.jsonl")) for k in range(2)]
    spread = False
    for step in range(2):
        rows = [row for rank in ranks for row in rank if row["step"] == step]  # the global order: rank 0, then 1
        assert [row["seat"] for row in rows] == ["A", "B", "A", "B"]
        for seat in (0, 1):  # the seat's runs: one on each rank
            a, b = rows[seat], rows[seat + 2]
            mean = (a["reward"] + b["reward"]) / 2
            assert a["advantage"] == pytest.approx(a["reward"] - mean) and b["advantage"] == pytest.approx(
                b["reward"] - mean)
            spread |= a["reward"] != b["reward"]
    assert spread  # some group compared two different games (a rank-local group would hold one run: advantage 0)
