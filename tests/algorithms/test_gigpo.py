"""GiGPO's step-level advantages: a group computed by hand, and every function against a plain loop."""

import math
import random

import pytest
import torch
from torch.testing import assert_close

from trl_agentic.algorithms.advantages import EPS
from trl_agentic.algorithms.gigpo import (
    anchor_groups,
    discounted_returns,
    gigpo_advantages,
    step_group_advantages,
    step_rewards,
)

NAN = float("nan")


def _hand_group():
    """Two groups of three trajectories (G = 3). Each trajectory: the states its steps start from, its turn rewards,
    its outcome R(tau). Trajectory 5 revisits A; trajectory 6 is unscorable; A of group 2 is not A of group 1."""
    states = [["A", "B", "C"], ["A", "D"], ["A", "C", "B"],  # group 1
              ["A"], ["A", "A"], ["A"]]  # group 2
    turn_rewards = [[0.0, 1.0, 0.0], [0.0, 0.0], [0.0, 0.0, 0.0], [0.0], [1.0, 0.0], [0.0]]
    outcomes = torch.tensor([2.0, 0.0, 1.0, 5.0, 0.0, NAN])
    mask = torch.tensor([[len(s) > k for k in range(3)] for s in states])
    rewards = torch.tensor([r + [0.0] * (3 - len(r)) for r in turn_rewards])
    return states, rewards, outcomes, mask


def test_a_group_computed_by_hand():
    """gamma = 0.5, omega = 0.5. Step rewards (the outcome on the last step) and returns R_t = r_t + 0.5 R_{t+1}:
    tau1 r = [0, 1, 2] -> R = [1, 2, 2];  tau2 r = [0, 0] -> R = [0, 0];  tau3 r = [0, 0, 1] -> R = [0.25, 0.5, 1];
    tau4 r = [5] -> R = [5];  tau5 r = [1, 0] -> R = [1, 0];  tau6 unscorable.
    Step groups and their means (Eq. 6, 7; F_norm = 1):
    group 1, A: {tau1 1, tau2 0, tau3 0.25}, mean 5/12 -> 7/12, -5/12, -1/6
             B: {tau1 2, tau3 1}, mean 1.5 -> 0.5, -0.5;   C: {tau1 2, tau3 0.5}, mean 1.25 -> 0.75, -0.75
             D: {tau2 0} alone -> 0
    group 2, A: {tau4 5, tau5 1, tau5 0} (tau5 twice, tau6 left out), mean 2 -> 3, -1, -2."""
    states, rewards, outcomes, mask = _hand_group()
    groups = anchor_groups(states, 3, scorable=[True] * 5 + [False])
    episode = torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0, 0.0])
    result = gigpo_advantages(episode, outcomes, rewards, mask, groups, weight=0.5, gamma=0.5, scale=False)

    assert_close(result.returns, torch.tensor([[1, 2, 2], [0, 0, 0], [0.25, 0.5, 1], [5, 0, 0], [1, 0, 0],
                                               [0, 0, 0]], dtype=torch.float32))
    step = torch.tensor([[7 / 12, 0.5, 0.75], [-5 / 12, 0, 0], [-1 / 6, -0.75, -0.5], [3, 0, 0], [-1, -2, 0],
                         [0, 0, 0]])
    assert_close(result.step_advantages, step)
    assert_close(result.advantages, (episode.unsqueeze(1) + 0.5 * step) * mask)  # Eq. 8, on the steps that exist
    assert result.group_sizes.tolist() == [[3, 2, 2], [3, 1, 0], [3, 2, 2], [3, 0, 0], [3, 3, 0], [0, 0, 0]]
    assert result.anchored_share() == pytest.approx(10 / 11)  # all but D, over the 11 steps of scorable runs
    assert result.mean_group_size() == pytest.approx(11 / 5)  # A, B, C, D of group 1, A of group 2

    # F_norm = the step group's std (unbiased), plus EPS
    scaled = gigpo_advantages(episode, outcomes, rewards, mask, groups, weight=0.5, gamma=0.5, scale=True)
    std_a1 = math.sqrt(((7 / 12) ** 2 + (5 / 12) ** 2 + (1 / 6) ** 2) / 2)
    std_b, std_c, std_a2 = 1 / math.sqrt(2), 1.5 / math.sqrt(2), math.sqrt(14 / 2)
    assert_close(scaled.step_advantages[0], torch.tensor([7 / 12 / (std_a1 + EPS), 0.5 / (std_b + EPS),
                                                          0.75 / (std_c + EPS)]))
    assert_close(scaled.step_advantages[4, :2], torch.tensor([-1 / (std_a2 + EPS), -2 / (std_a2 + EPS)]))
    assert scaled.step_advantages[1, 1] == 0  # alone: 0, not 0 / 0


def test_without_the_outcome_the_turn_rewards_alone_make_the_return():
    _, rewards, outcomes, mask = _hand_group()
    assert_close(step_rewards(rewards, outcomes, mask, with_outcome=False), rewards * mask)
    with_outcome = step_rewards(rewards, outcomes, mask)
    assert with_outcome[0].tolist() == [0.0, 1.0, 2.0] and with_outcome[3].tolist() == [5.0, 0.0, 0.0]
    assert with_outcome[5].tolist() == [0.0, 0.0, 0.0]  # NaN outcome: nothing added


def test_a_state_no_other_step_reached_gets_the_episode_advantage_alone():
    groups = anchor_groups([["s0", "x"], ["s0", "y"]], 2)
    result = gigpo_advantages(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]), torch.zeros(2, 2),
                              torch.ones(2, 2, dtype=torch.bool), groups, weight=1.0)
    assert result.step_advantages[:, 1].tolist() == [0.0, 0.0]
    assert result.advantages[:, 1].tolist() == [1.0, -1.0]
    assert result.anchored_share() == 0.5 and result.mean_group_size() == pytest.approx(4 / 3)


def test_std_floor_keeps_near_equal_returns_small():
    returns = torch.tensor([[1.0], [1.02]])
    advantages, _ = step_group_advantages(returns, torch.tensor([[0], [0]]), scale=True, std_floor=0.5)
    assert_close(advantages.flatten(), torch.tensor([-0.01, 0.01]) / (0.5 + EPS))


# -- against plain loops ------------------------------------------------------------------------------------------
def _random_batch(seed, groups=3, size=4, steps=5, states=3):
    rng = random.Random(seed)
    keys = [[rng.randrange(states) for _ in range(rng.randint(1, steps))] for _ in range(groups * size)]
    mask = torch.tensor([[len(k) > t for t in range(steps)] for k in keys])
    turn_rewards = torch.tensor([[rng.choice([0.0, 0.5, -1.0]) for _ in range(steps)] for _ in keys])
    outcomes = torch.tensor([rng.choice([0.0, 1.0, 2.0, NAN]) for _ in keys])
    episode = torch.randn(len(keys), generator=torch.Generator().manual_seed(seed))
    return keys, mask, turn_rewards, outcomes, episode


def _reference(keys, turn_rewards, outcomes, episode, size, weight, gamma, scale, with_outcome):
    """GiGPO as the paper writes it, one step at a time with dicts."""
    returns = {}
    for i, states in enumerate(keys):
        if math.isnan(outcomes[i]):
            continue
        r = [float(turn_rewards[i, t]) for t in range(len(states))]
        if with_outcome:
            r[-1] += float(outcomes[i])
        for t in range(len(states)):
            returns[i, t] = sum(gamma ** (k - t) * r[k] for k in range(t, len(states)))
    members = {}
    for (i, t), value in returns.items():
        members.setdefault((i // size, keys[i][t]), []).append(value)
    out = torch.zeros(turn_rewards.shape)
    for i, states in enumerate(keys):
        for t in range(len(states)):
            step = 0.0
            if (i, t) in returns:
                values = members[i // size, states[t]]
                if len(values) > 1:
                    mean = sum(values) / len(values)
                    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
                    step = (returns[i, t] - mean) / (std + EPS if scale else 1.0)
            out[i, t] = float(episode[i]) + weight * step
    return out, returns


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("gamma", "scale", "with_outcome"), [(1.0, False, True), (0.95, True, True),
                                                              (0.5, False, False), (0.9, True, False)])
def test_matches_a_plain_loop(seed, gamma, scale, with_outcome):
    keys, mask, turn_rewards, outcomes, episode = _random_batch(seed)
    scorable = [not math.isnan(o) for o in outcomes.tolist()]
    groups = anchor_groups(keys, 4, scorable)
    result = gigpo_advantages(episode, outcomes, turn_rewards, mask, groups, weight=0.7, gamma=gamma, scale=scale,
                              with_outcome=with_outcome)
    expected, returns = _reference(keys, turn_rewards, outcomes, episode, 4, 0.7, gamma, scale, with_outcome)
    assert_close(result.advantages, expected, rtol=1e-5, atol=1e-5)
    for (i, t), value in returns.items():
        assert result.returns[i, t].item() == pytest.approx(value, abs=1e-5)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_discounted_returns_match_a_loop(gamma):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(5, 6, generator=g)
    lengths = [6, 1, 0, 3, 5]
    mask = torch.tensor([[t < n for t in range(6)] for n in lengths])
    returns = discounted_returns(rewards, mask, gamma)
    for i, n in enumerate(lengths):
        for t in range(6):
            expected = sum(gamma ** (k - t) * float(rewards[i, k]) for k in range(t, n)) if t < n else 0.0
            assert returns[i, t].item() == pytest.approx(expected, abs=1e-5)


def test_groups_stay_within_a_group_of_trajectories():
    groups = anchor_groups([["a"], ["a"], ["a"], ["a"]], 2)
    assert groups.flatten().tolist() == [0, 0, 1, 1]
    assert anchor_groups([], 2).shape == (0, 0)
    empty, sizes = step_group_advantages(torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.long))
    assert empty.shape == sizes.shape == (2, 0)
