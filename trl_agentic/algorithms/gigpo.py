"""GiGPO's step-level relative advantages (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent
Training", arXiv 2505.10978): credit for the steps of long episodes, critic-free, from the rollouts GRPO has anyway.

A group holds the ``G`` trajectories ``tau_1 .. tau_G`` of one task (``num_generations`` consecutive runs). Trajectory
``i`` takes steps (model turns) ``t = 0 .. T_i - 1``; step ``t`` starts from the environment state ``s_t^i`` and earns
the reward ``r_t^i``. Two levels of relative advantage:

- Episode level (Eq. 3 of the paper), GRPO's advantage as it is
  (:func:`~trl_agentic.algorithms.advantages.group_advantages`)::

      A_E(tau_i) = (R(tau_i) - mean_j R(tau_j)) / F_norm({R(tau_j)})

- Step level. Each step's discounted return (Eq. 5)::

      R_t^i = sum_{k=t}^{T_i - 1} gamma^(k - t) r_k^i

  The steps of the group that start from the same state form the step group of that anchor state (Eq. 6)::

      G_S(s) = {(j, k) : s_k^j = s}          (every trajectory of the group, every step of each: a state one
                                               trajectory reaches twice joins its group twice)

  and each step's return is compared with those of its step group (Eq. 7)::

      A_S(i, t) = (R_t^i - mean_{(j, k) in G_S(s_t^i)} R_k^j) / F_norm({R_k^j : (j, k) in G_S(s_t^i)})

- Combined per step (Eq. 8) and given to every token of the step's turn::

      A(i, t) = A_E(tau_i) + omega * A_S(i, t)

``F_norm`` is the group's standard deviation (unbiased, as GRPO's; floored at ``std_floor``) plus ``EPS = 1e-4``
(TRL's), or 1 (``scale=False``: no division, an RLOO-like mean difference): the paper's "mean_std_norm" and
"mean_norm". A step group of one (a state no other step of the group started from) has ``A_S = 0``: the step gets the
episode advantage alone. A step of an unscorable trajectory (its reward is NaN) is in no step group and gets 0, as its
episode advantage is.

Tensors are laid out (N, K): the N trajectories of the global batch (groups of ``G`` consecutive rows), K the most
steps of any; ``step_mask`` marks the steps each has (a prefix of its row). Returns and advantages are constants of the
loss: inputs are detached. ``tests/algorithms/test_gigpo.py`` checks each function against a plain loop and against a
group computed by hand.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from .advantages import EPS
from .gae import add_at_last


def step_rewards(turn_rewards: torch.Tensor, outcomes: torch.Tensor, step_mask: torch.Tensor,
                 with_outcome: bool = True) -> torch.Tensor:
    """The reward ``r_t^i`` of each step: the turn's own (the environment's) plus, with ``with_outcome``, the
    trajectory's reward ``R(tau_i)`` on its last step, as :func:`~trl_agentic.algorithms.gae.build_turn_rewards`
    builds PPO's turn rewards. (N, K) float32, 0 at absent steps; a NaN outcome counts as 0 (its steps are left out
    of every step group by :func:`anchor_groups`)."""
    rewards = torch.where(step_mask.bool(), turn_rewards.detach().float(), 0.0)
    if not with_outcome:
        return rewards
    return add_at_last(rewards, torch.nan_to_num(outcomes.detach().float(), nan=0.0), step_mask)


def discounted_returns(rewards: torch.Tensor, step_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. 5: ``R_t = sum_{k >= t} gamma^(k - t) r_k`` over each row's steps; (N, K) float32, 0 at absent steps."""
    rewards = torch.where(step_mask.bool(), rewards.detach().float(), 0.0)
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return torch.where(step_mask.bool(), returns, 0.0)


def anchor_groups(state_keys: Sequence[Sequence[Hashable]], num_generations: int,
                  scorable: Sequence[bool] | None = None) -> torch.Tensor:
    """Eq. 6: the step group of every step, (N, K) int64 ids (-1: no step there, or its trajectory is unscorable).
    Steps share an id when their trajectories are in the same group (``num_generations`` consecutive rows) and they
    start from states with equal keys (``state_keys[i][t]``, the key of ``s_t^i``)."""
    steps = max((len(keys) for keys in state_keys), default=0)
    ids: dict[tuple[int, Hashable], int] = {}
    rows = []
    for i, keys in enumerate(state_keys):
        row = [-1] * steps
        if scorable is None or scorable[i]:
            row[: len(keys)] = [ids.setdefault((i // num_generations, key), len(ids)) for key in keys]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long).reshape(len(state_keys), steps)


def step_group_advantages(returns: torch.Tensor, groups: torch.Tensor, scale: bool = True,
                          std_floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 7: each step's return against its step group's mean, divided by the group's std (floored at
    ``std_floor``, plus ``EPS``) with ``scale``, else not divided; 0 for a step alone in its group and wherever
    ``groups`` is -1. Returns ``(A_S, sizes)``, both (N, K): the step advantages (float32) and the size of each step's
    group (0 where it has none)."""
    device = returns.device
    present = groups.to(device) >= 0
    ids = groups.to(device)[present]
    values = returns.detach().double()[present]
    count = int(ids.max()) + 1 if ids.numel() else 0
    sizes = torch.bincount(ids, minlength=count).double()
    mean = torch.zeros(count, dtype=torch.float64, device=device).index_add_(0, ids, values) / sizes.clamp(min=1)
    deviation = values - mean[ids]
    if scale:
        squares = torch.zeros(count, dtype=torch.float64, device=device).index_add_(0, ids, deviation**2)
        std = (squares / (sizes - 1).clamp(min=1)).sqrt()
        deviation = deviation / (std[ids].clamp(min=std_floor) + EPS)
    advantages = torch.zeros(returns.shape, dtype=torch.float32, device=device)
    advantages[present] = torch.where(sizes[ids] > 1, deviation, 0.0).float()
    step_sizes = torch.zeros(returns.shape, dtype=torch.long, device=device)
    step_sizes[present] = sizes[ids].long()
    return advantages, step_sizes


@dataclass(frozen=True)
class GiGPOAdvantages:
    """What :func:`gigpo_advantages` computes, (N, K) each.

    Attributes:
        advantages: ``A = A_E + omega * A_S`` of each step (Eq. 8); 0 at absent steps.
        step_advantages: ``A_S`` (Eq. 7).
        returns: ``R_t`` (Eq. 5).
        group_sizes: The size of each step's step group (0: no step, or an unscorable trajectory).
    """

    advantages: torch.Tensor
    step_advantages: torch.Tensor
    returns: torch.Tensor
    group_sizes: torch.Tensor

    def anchored_share(self) -> float:
        """The share of the steps (of scorable trajectories) whose state another step of their group also started
        from: how much the step level has to compare (0: GiGPO is GRPO here)."""
        steps = self.group_sizes > 0
        return float((self.group_sizes[steps] > 1).float().mean()) if steps.any() else 0.0

    def mean_group_size(self) -> float:
        """The mean size of the step groups (1: no state repeats), over the groups: steps / distinct states."""
        sizes = self.group_sizes[self.group_sizes > 0].double()
        return float(sizes.numel() / (1.0 / sizes).sum()) if sizes.numel() else 0.0


def gigpo_advantages(episode_advantages: torch.Tensor, outcomes: torch.Tensor, turn_rewards: torch.Tensor,
                     step_mask: torch.Tensor, groups: torch.Tensor, weight: float = 1.0, gamma: float = 1.0,
                     scale: bool = True, std_floor: float = 0.0, with_outcome: bool = True) -> GiGPOAdvantages:
    """GiGPO's advantage of every step (module docstring), from GRPO's episode advantages ``A_E`` (N,), the
    trajectories' rewards ``R(tau)`` (N,; NaN: unscorable), the turns' own rewards (N, K), which steps exist
    (``step_mask``, N x K) and their step groups (:func:`anchor_groups`). ``weight`` is ``omega``, ``gamma`` the
    discount of Eq. 5, ``scale``/``std_floor`` ``F_norm``'s choice, ``with_outcome`` whether ``R(tau)`` is added to
    the last step's reward (:func:`step_rewards`)."""
    step_mask = step_mask.bool()
    returns = discounted_returns(step_rewards(turn_rewards, outcomes, step_mask, with_outcome), step_mask, gamma)
    groups = torch.where(step_mask & ~torch.isnan(outcomes).unsqueeze(1), groups, -1)
    step, sizes = step_group_advantages(returns, groups, scale, std_floor)
    combined = episode_advantages.detach().float().unsqueeze(1) + weight * step
    return GiGPOAdvantages(torch.where(step_mask, combined, 0.0), step, returns, sizes)
