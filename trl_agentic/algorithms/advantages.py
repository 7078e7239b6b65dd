"""Group-relative advantages (GRPO; Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300), as TRL 1.16 computes
them, with an optional floor on the group standard deviation.

Rewards come as a matrix ``R`` of shape (N, K): N completions (groups of G consecutive rows), K reward functions with
weights ``w``; NaN marks a completion a function could not score, and a row that is NaN for every function is
*unscorable*. With ``eps = 1e-4`` (TRL's) and ``s_floor`` the floor:

- ``aggregation="sum_then_normalize"`` (TRL's default): ``r_i = sum_k w_k R_ik`` (NaN-skipping), then within the
  group ``A_i = (r_i - mean_g r) / (max(std_g r, s_floor) + eps)`` (``scale_rewards="group"``), or the batch std
  (``"batch"``), or no division (``"none"``).
- ``aggregation="normalize_then_sum"`` (GDPO): each function is normalised within its group first,
  ``z_ik = (R_ik - mean_g R_k) / (max(std_g R_k, s_floor) + eps)``, then ``r_i = sum_k w_k z_ik`` and
  ``A_i = (r_i - mean r) / (std r + eps)`` over the batch.

Means and standard deviations skip NaN; the std is the unbiased one (Bessel); unscorable rows get ``A_i = 0`` and
stay out of the statistics. With ``s_floor = 0`` this is TRL's computation number for number
(``tests/algorithms/test_advantages.py`` checks it against TRL's own output). A floor stops near-constant groups from
being blown up by the division (``zero_variance_groups="std_floor"``).
"""

from __future__ import annotations

from typing import Literal

import torch

EPS = 1e-4  # TRL's


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased standard deviation skipping NaN; NaN where fewer than two values (TRL's ``nanstd``)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(count, float("nan"), dtype=x.dtype))
    std = torch.sqrt(variance * correction)
    return std if keepdim or dim is None else std.squeeze(dim)


def combined_rewards(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize",
    std_floor: float = 0.0,
) -> torch.Tensor:
    """One reward per completion (N,), NaN when unscorable: ``r_i = sum_k w_k R_ik`` (``sum_then_normalize``), or
    the weighted sum of each function's group-normalised rewards ``z_ik`` (``normalize_then_sum``)."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    weights = weights.to(rewards_per_func)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    elif aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        normalised = ((grouped - mean_k) / (std_k.clamp(min=std_floor) + EPS)).view(-1, rewards_per_func.size(1))
        rewards = (normalised * weights.unsqueeze(0)).nansum(dim=1)
    else:
        raise ValueError(f"aggregation must be 'sum_then_normalize' or 'normalize_then_sum', got {aggregation!r}")
    rewards[unscorable] = torch.nan
    return rewards


def group_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize",
    scale_rewards: Literal["group", "batch", "none"] = "group",
    std_floor: float = 0.0,
) -> torch.Tensor:
    """Advantages (N,) from rewards (N, K) and weights (K,); see the module docstring."""
    rewards = combined_rewards(rewards_per_func, weights, num_generations, aggregation, std_floor)
    if aggregation == "sum_then_normalize":
        grouped = rewards.view(-1, num_generations)
        mean = torch.nanmean(grouped, dim=1, keepdim=True)
        advantages = grouped - mean
        if scale_rewards == "group":
            std = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
            advantages = advantages / (std.clamp(min=std_floor) + EPS)
        elif scale_rewards == "batch":
            std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
            advantages = advantages / (std.clamp(min=std_floor) + EPS)
        elif scale_rewards != "none":
            raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
        advantages = advantages.flatten()
    else:
        std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
        advantages = (rewards - torch.nanmean(rewards)) / (std + EPS)
    return torch.nan_to_num(advantages, nan=0.0)


def zero_std_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Boolean per group: the group has no reward spread, hence no advantage. ``rewards`` is the global (N,)
    weighted sum, NaN for an unscorable completion. Unscorable members are skipped, as in TRL's
    ``frac_reward_zero_std`` (``isclose(nanstd, 0)``); a group with fewer than two scorable members (NaN std) has
    no spread either."""
    std = nanstd(rewards.view(-1, num_generations), dim=1)
    return torch.isclose(std, torch.zeros_like(std)) | torch.isnan(std)


def frac_reward_zero_std(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize",
    scale_rewards: Literal["group", "batch", "none"] = "group",
) -> float:
    """TRL's ``frac_reward_zero_std``: the fraction of completions whose advantage's std is 0 (``isclose``), with the
    std TRL divides by (no floor): the group's of the combined reward (``scale_rewards`` "group" or "none"; 0 with
    one generation), or the batch's (``"batch"``, and always with ``normalize_then_sum``). Unscorable rows are
    skipped; a NaN std (fewer than two values) is not 0."""
    rewards = combined_rewards(rewards_per_func, weights, num_generations, aggregation)
    if scale_rewards == "batch" or aggregation == "normalize_then_sum":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    elif num_generations > 1:
        std = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
    else:
        std = torch.zeros_like(rewards)
    return torch.isclose(std, torch.zeros_like(std)).float().mean().item()
