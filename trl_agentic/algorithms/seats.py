r"""Advantages of games with several seats (:mod:`trl_agentic.rollout.seats`): each run is one seat's trajectory,
and seats of one game are not exchangeable (the first player of TicTacToe wins more often; a zero-sum game gives
the two seats opposite rewards), so a run is compared with runs of its own seat.

**Groups per prompt and seat** (:func:`seat_group_advantages`, GRPO's default with seats). The runs of a GRPO
group (``num_generations`` consecutive runs of one prompt) are split by seat: with ``r_i`` the combined reward of
run ``i`` and ``g(i)`` its group, the runs of its prompt that played its seat,

    A_i = (r_i - mean_{j in g(i)} r_j) / (max(std_{j in g(i)} r_j, s_floor) + eps)     (scale_rewards="group")

(``"batch"``: the std of every run's reward; ``"none"``: no division). Means and stds skip unscorable runs (NaN),
the std is Bessel's, an unscorable run or a group of one gets ``A_i = 0``: with groups that are the ``num_generations``
blocks themselves this is :func:`~trl_agentic.algorithms.advantages.group_advantages`, number for number.

**Role-conditioned advantage estimation** (:func:`role_advantages`, ``seat_baseline="rae"``): SPIRAL (Liu et al.
2025, "SPIRAL: Self-Play on Zero-Sum Games Incentivizes Reasoning via Multi-Agent Multi-Turn Reinforcement
Learning", arXiv 2506.24119, Sec. 3.3) keeps one baseline per game and role, an exponential moving average of that
role's returns, and takes each trajectory's advantage against it. For each run ``i`` in order, with ``s = s(i)`` its
seat (the role; one trainer plays one game) and decay ``alpha`` (the paper's 0.95):

    A_i = r_i - b_s          (the baseline before this run: unbiased, as SPIRAL's code takes it)
    b_s <- alpha * b_s + (1 - alpha) * r_i

with every ``b_s = 0`` at the start of training. There is no division by a std: the advantage is in the reward's
units, as SPIRAL's. An unscorable run gets ``A_i = 0`` and leaves the baselines as they were. The baselines carry
over from one round to the next (the trainer's state, not saved in checkpoints: a resumed run starts them at 0).
"""

from __future__ import annotations

import torch

from .advantages import EPS, nanstd


def seat_group_advantages(rewards: torch.Tensor, groups: torch.Tensor, scale_rewards: str = "group",
                          std_floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages (N,) of combined rewards ``rewards`` (N,; NaN: unscorable) against the runs of their group
    (``groups``: (N,) integer ids, one per prompt and seat), and each run's group std (NaN for fewer than two
    scorable runs); see the module docstring."""
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    advantages = torch.zeros_like(rewards)
    stds = torch.full_like(rewards, float("nan"))
    for group in torch.unique(groups):
        members = groups == group
        values = rewards[members]
        std = nanstd(values) if values.numel() > 1 else torch.full((), float("nan"))
        advantages[members] = values - torch.nanmean(values)
        stds[members] = std
        if scale_rewards == "group":
            advantages[members] = advantages[members] / (std.clamp(min=std_floor) + EPS)
    if scale_rewards == "batch":
        std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
        advantages = advantages / (std.clamp(min=std_floor) + EPS)
    return torch.nan_to_num(advantages, nan=0.0), stds


def role_advantages(rewards: torch.Tensor, seats: torch.Tensor, baselines: torch.Tensor,
                    decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SPIRAL's role-conditioned advantages (module docstring): ``rewards`` (N,; NaN: unscorable), ``seats`` (N,)
    each run's seat index, ``baselines`` (S,) each seat's baseline before these runs; returns the advantages (N,)
    and the baselines after them (a new tensor)."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"the baselines' decay is in (0, 1), got {decay!r}")
    baselines = baselines.clone().to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    for i, (reward, seat) in enumerate(zip(rewards.tolist(), seats.tolist())):
        if reward != reward:  # NaN: unscorable
            continue
        advantages[i] = reward - baselines[seat]
        baselines[seat] = decay * baselines[seat] + (1.0 - decay) * reward
    return advantages, baselines


__all__ = ["role_advantages", "seat_group_advantages"]
