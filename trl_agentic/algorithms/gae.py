"""Generalized Advantage Estimation over agent tokens (token mode) or over turns (turn mode).

GAE (Schulman, Moritz, Levine, Jordan, Abbeel 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv 1506.02438)::

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lam * A_{t+1}          (A after the last step = 0, V after the last step = 0)
    R_t     = A_t + V(s_t)                              (the lambda-return, the value target)

In a multi-turn rollout the completion interleaves sampled tokens (``mask == 1``) with observation tokens and
padding (``mask == 0``). Observation tokens are not actions: they carry no reward, no value target and no TD step.
The recursion therefore runs over the selected steps only, skipping the others: the step after an agent token is the
next agent token in the row, possibly after an observation, and its value already sees that observation. The last
agent token of a row bootstraps from 0 (the episode ended, or was truncated and is treated as ended).

Which mode:
    - Token mode (:func:`token_gae`): one step per sampled token, as in RLHF PPO (Ouyang et al. 2022) and Search-R1
      (Jin et al. 2025, arXiv 2503.09516). A turn spans hundreds of steps, so ``gamma`` must stay at or very close
      to 1 (``gamma**n`` over ``n`` tokens decays fast); ``lam`` around 0.95-1. Per-token KL penalties fit here.
    - Turn mode (:func:`turn_gae`): one step per model turn, one value per turn, ``gamma`` per turn, so
      0.95-0.99 discounts late rewards over the few turns of an episode without washing out the outcome.
      Every token of a turn shares its turn's advantage. Fits environments with per-turn rewards and long turns.

Value alignment: ``values[:, t]`` must be the value of the state *before* token ``t`` (computed from the hidden
state at the previous position), as :class:`trl_agentic.trainers.critic.ValueModel` returns them.

All functions detach their inputs and compute in float32: advantages and returns are constants of the loss.
"""

from __future__ import annotations

import torch

from . import turns


def _skip_masked_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The GAE recursion along the last dimension over the steps where ``mask`` is set, vectorised over rows."""
    rewards = rewards.detach().float()
    values = values.detach().float()
    selected = mask.bool()
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_advantage = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        step = selected[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(step, advantage, 0.0)
        next_value = torch.where(step, values[:, t], next_value)
        next_advantage = torch.where(step, advantage, next_advantage)
    returns = torch.where(selected, advantages + values, 0.0)
    return advantages, returns


def token_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE over agent tokens, skipping observation tokens and padding.

    With ``n(t)`` the next agent position after ``t`` in the same row (none after the last one)::

        delta_t = r_t + gamma * V_{n(t)} - V_t          (V_{n(t)} = 0 when there is no next agent token)
        A_t     = delta_t + gamma * lam * A_{n(t)}       (A_{n(t)} = 0 likewise)
        R_t     = A_t + V_t

    Rewards and values at masked positions are ignored (never read); a row with no agent token gets zeros.

    Args:
        rewards: (B, T) per-token rewards, e.g. from :func:`build_token_rewards`.
        values: (B, T) old values ``V(s_t)``.
        mask: (B, T) 1 at agent tokens, 0 at observation tokens and padding.
        gamma: Discount per agent token (keep at or near 1).
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, both (B, T) float32, 0 at masked positions.
    """
    return _skip_masked_gae(rewards, values, mask, gamma, lam)


def turn_gae(
    turn_rewards: torch.Tensor, turn_values: torch.Tensor, turn_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE: one step per model turn, skipping absent turns.

    ``delta_k = r_k + gamma * V(s_{k'}) - V(s_k)``, ``A_k = delta_k + gamma * lam * A_{k'}``, ``R_k = A_k + V(s_k)``,
    with ``k'`` the next present turn of the row (``V = A = 0`` after the last one). ``V(s_k)`` is the value at the
    state where turn ``k`` starts (:func:`trl_agentic.algorithms.turns.gather_turn_values`); ``r_k`` the turn's
    reward (:func:`build_turn_rewards`). Broadcast the results to tokens with
    :func:`trl_agentic.algorithms.turns.broadcast_turns`.

    Args:
        turn_rewards: (B, K) reward of each turn.
        turn_values: (B, K) value at the start of each turn.
        turn_mask: (B, K) True where the turn is present (:func:`trl_agentic.algorithms.turns.turn_mask`).
        gamma: Discount per turn (0.95-0.99 is typical).
        lam: GAE lambda.

    Returns:
        ``(turn_advantages, turn_returns)``, both (B, K) float32, 0 at absent turns.
    """
    return _skip_masked_gae(turn_rewards, turn_values, turn_mask, gamma, lam)


def add_at_last(rewards: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``rewards`` (B, T) plus each row's score (B,) at its last selected position of ``mask`` (dropped for a row with
    none): the outcome on the last agent token, turn or step."""
    length = mask.shape[1]
    positions = torch.arange(length, device=mask.device).expand(mask.shape)
    # A row with no selected position (or T = 0) points at an extra column, cut off below.
    last = torch.nn.functional.pad(torch.where(mask.bool(), positions, -1), (0, 1), value=-1).amax(dim=1)
    index = torch.where(last >= 0, last, length).unsqueeze(1)
    padded = torch.nn.functional.pad(rewards, (0, 1))
    return padded.scatter_add(1, index, scores.to(rewards.dtype).unsqueeze(1))[:, :-1]


def build_token_rewards(
    scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, beta: float = 0.0
) -> torch.Tensor:
    """Per-token rewards for :func:`token_gae`: the outcome on the last agent token, a KL penalty on every one.

    ``r_t = -beta * kl_t * m_t + score * [t = last agent token]``, the shaping of RLHF PPO (Ziegler et al. 2019,
    arXiv 1909.08593; Ouyang et al. 2022) with observation tokens excluded. ``kl_t`` is a per-token estimate of
    ``KL(pi || pi_ref)``, e.g. k1 ``logp - logp_ref`` (see :mod:`trl_agentic.algorithms.kl`). A row with no agent
    token gets all zeros (its score has no token to sit on; GAE gives that row zero advantages anyway).

    Args:
        scores: (B,) outcome reward of each completion.
        mask: (B, T) agent-token mask.
        kl: Optional (B, T) per-token KL estimate; ignored at masked positions.
        beta: Coefficient of the KL penalty.

    Returns:
        (B, T) float32 rewards, 0 at masked positions.
    """
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if kl is not None:
        rewards = torch.where(mask.bool(), -beta * kl.detach().float(), rewards)
    return add_at_last(rewards, scores.detach(), mask)


def build_turn_rewards(
    scores: torch.Tensor,
    turn_ids: torch.Tensor,
    num_turns: int,
    env_rewards: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
) -> torch.Tensor:
    """Per-turn rewards for :func:`turn_gae`.

    ``r_k = env_k - beta * sum_{t in turn k} kl_t + score * [k = last present turn]``: the environment's reward
    for the turn, the turn's total KL penalty over its agent tokens, and the outcome on the row's last present turn.
    Rewards of absent turns are 0 (an environment reward for a turn with no agent token in the completion is
    dropped); a row with no present turn gets all zeros.

    Args:
        scores: (B,) outcome reward of each completion.
        turn_ids: (B, T) turn index of each agent token, -1 elsewhere.
        num_turns: ``K``.
        env_rewards: Optional (B, K) per-turn environment rewards (``Trajectory.turn_rewards``, zero-padded).
        kl: Optional (B, T) per-token KL estimate; only agent tokens count.
        beta: Coefficient of the KL penalty.

    Returns:
        (B, K) float32 rewards, 0 at absent turns.
    """
    present = turns.turn_mask(turn_ids, num_turns)
    rewards = torch.zeros(present.shape, dtype=torch.float32, device=turn_ids.device)
    if env_rewards is not None:
        rewards = torch.where(present, env_rewards.detach().float(), rewards)
    if kl is not None:
        rewards = rewards - beta * turns.turn_sum(kl.detach().float(), turn_ids, num_turns)
    return add_at_last(rewards, scores.detach(), present)
