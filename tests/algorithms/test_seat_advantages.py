"""The advantages of games with several seats (trl_agentic.algorithms.seats): GRPO's groups per prompt and seat (TRL's
group advantages, number for number, when the groups are GRPO's own blocks), and SPIRAL's role-conditioned baseline
against a plain loop."""

from __future__ import annotations

import math

import pytest
import torch

from trl_agentic.algorithms.advantages import group_advantages
from trl_agentic.algorithms.seats import role_advantages, seat_group_advantages


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("floor", [0.0, 0.1])
def test_blocks_as_groups_are_grpo_number_for_number(scale, floor):
    rewards = torch.tensor([1.0, 0.0, float("nan"), 2.0, 3.0, 3.0, 0.5, -1.0, 4.0, float("nan"), 1.0, 1.0])
    expected = group_advantages(rewards.unsqueeze(1), torch.ones(1), 4, scale_rewards=scale, std_floor=floor)
    got, _ = seat_group_advantages(rewards, torch.arange(12) // 4, scale, floor)
    assert torch.equal(got, expected)


def test_each_run_is_compared_with_its_prompts_runs_of_its_seat():
    """Two prompts, four runs each, seats alternating A, B: four groups of two."""
    rewards = torch.tensor([1.0, -1.0, 0.0, 1.0, 1.0, -1.0, 1.0, -1.0])
    seats = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    groups = torch.arange(8) // 4 * 2 + seats
    got, stds = seat_group_advantages(rewards, groups, "none")
    assert got.tolist() == [0.5, -1.0, -0.5, 1.0, 0.0, 0.0, 0.0, 0.0]
    std = math.sqrt(0.5)  # of (1, 0), Bessel's
    assert torch.allclose(stds, torch.tensor([std, math.sqrt(2.0), std, math.sqrt(2.0), 0.0, 0.0, 0.0, 0.0]))
    scaled, _ = seat_group_advantages(rewards, groups, "group")
    assert torch.allclose(scaled[:4], torch.tensor([0.5 / std, -1.0 / math.sqrt(2.0), -0.5 / std, 1.0 / math.sqrt(2.0)]),
                          atol=1e-3)


def test_role_advantages_follow_spirals_moving_average():
    rewards = torch.tensor([1.0, -1.0, float("nan"), 1.0, 1.0, -1.0])
    seats = torch.tensor([0, 1, 0, 1, 0, 1])
    advantages, baselines = role_advantages(rewards, seats, torch.tensor([0.0, 0.5]), 0.9)
    b, expected = [0.0, 0.5], []
    for r, s in zip(rewards.tolist(), seats.tolist()):
        if math.isnan(r):
            expected.append(0.0)
            continue
        expected.append(r - b[s])
        b[s] = 0.9 * b[s] + 0.1 * r
    assert torch.allclose(advantages, torch.tensor(expected)) and torch.allclose(baselines, torch.tensor(b))
    with pytest.raises(ValueError, match=r"^the baselines' decay is in \(0, 1\), got 1.0$"):
        role_advantages(rewards, seats, torch.zeros(2), 1.0)
