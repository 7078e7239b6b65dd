"""GiGPO on two CPU processes: the step groups of a group that spans both ranks hold the steps of both (one gather
of every process's steps per round), so each rank's per-turn advantages are those of the global batch."""

import math
from pathlib import Path

import pytest
import torch
from helpers import launch_two_processes

from trl_agentic.algorithms.gigpo import anchor_groups, gigpo_advantages
from trl_agentic.trainers.steps import run_steps, step_tensors
from trl_agentic.trajectory import Trajectory, load_trajectories

pytestmark = pytest.mark.multiprocess


def test_step_groups_span_processes(tmp_path, tiny_model_dir):
    proc = launch_two_processes(Path(__file__).with_name("gigpo_ranks.py"), str(tmp_path), tiny_model_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [list(load_trajectories(tmp_path / f"trajectories-rank{k}.jsonl")) for k in range(2)]
    spanning = 0
    for step in range(2):
        rows = [row for rank in ranks for row in rank if row["step"] == step]  # the global order: rank 0, then 1
        assert len(rows) == 6
        runs = [Trajectory.from_dict(row) for row in rows]
        keys, turn_rewards, mask = step_tensors([run_steps(run) for run in runs])
        outcomes = torch.tensor([row["reward"] for row in rows])
        episode = outcomes - outcomes.view(-1, 2).mean(1).repeat_interleave(2)  # scale_rewards="none"
        expected = gigpo_advantages(episode, outcomes, turn_rewards, mask, anchor_groups(keys, 2), gamma=0.9,
                                    scale=False)
        for i, row in enumerate(rows):
            for k, value in enumerate(row["turn_advantages"]):
                if value is not None:  # a turn cut to no trained token has no advantage to show
                    assert value == pytest.approx(float(expected.advantages[i, k]), abs=1e-5)
        # the middle group (rows 2 and 3, one on each rank) shares its first state: a step group across processes
        assert expected.group_sizes[2, 0] == expected.group_sizes[3, 0] == 2
        spanning += not math.isclose(float(expected.step_advantages[2, 0]), 0.0, abs_tol=1e-6)
    assert spanning  # and it carried a step advantage (a local-only group would have none)
