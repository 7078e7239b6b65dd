"""PPO's losses, over agent tokens only.

The clipped policy surrogate (used where TRL's own loss cannot be: PPO, and GRPO with a k1/k2 KL term) and the clipped
value loss (Schulman, Wolski, Dhariwal, Radford, Klimov 2017, "Proximal Policy Optimization
Algorithms", arXiv 1707.06347).
Every loss is a masked mean over agent tokens: the gradient at a masked position (observation token, padding) is
exactly 0.

Normalisation: by default a loss is the mean over this micro-batch's agent tokens. Pass ``num_tokens`` (for
instance the number of agent tokens in the whole gradient-accumulation batch, as TRL's ``loss_type="dapo"``
does for the policy term) to get ``sum / num_tokens`` instead.
"""

from __future__ import annotations

import torch

from .masked import masked_mean, masked_sum, zero_masked


def _token_mean(x: torch.Tensor, mask: torch.Tensor, num_tokens: float | torch.Tensor | None) -> torch.Tensor:
    if num_tokens is None:
        return masked_mean(x, mask)
    return masked_sum(x, mask) / num_tokens


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    num_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss of PPO (OpenAI baselines ``ppo2``; TRL's former ``PPOTrainer``).

    ``V_clip = V_old + clip(V - V_old, -c, c)``, and
    ``L = 0.5 * mean_{t : m_t = 1} max((V_t - R_t)^2, (V_clip_t - R_t)^2)``: the critic is not rewarded for moving
    more than ``c`` away from the values it had when the batch was generated.

    Args:
        values: (B, T) current values (with gradient).
        old_values: (B, T) values at generation time.
        returns: (B, T) value targets (e.g. GAE returns).
        mask: (B, T) agent-token mask.
        cliprange_value: ``c``.
        num_tokens: Optional normaliser replacing the local agent-token count (see the module docstring).

    Returns:
        ``(loss, clip_fraction)``: the scalar loss, and the fraction of agent tokens where the value was clipped
        and the clipped term is the larger one, i.e. where the gradient is cut (a detached metric).
    """
    values = zero_masked(values, mask)
    old_values = zero_masked(old_values.detach(), mask)
    returns = zero_masked(returns.detach(), mask)
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    loss = 0.5 * _token_mean(torch.maximum(unclipped_loss, clipped_loss), mask, num_tokens)
    # ``old + (V - old)`` differs from ``V`` by rounding, hence the explicit test that clipping happened.
    clip_active = ((values - old_values).abs() > cliprange_value) & (clipped_loss > unclipped_loss)
    clip_fraction = masked_mean(clip_active.to(loss.dtype), mask).detach()
    return loss, clip_fraction


def clipped_policy_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> torch.Tensor:
    """PPO's clipped surrogate, per token (Schulman et al. 2017, Eq. 7; ``epsilon_high > epsilon_low`` is DAPO's
    clip-higher, Yu et al. 2025, arXiv 2503.14476):

        L_t = -min(rho_t A_t, clip(rho_t, 1 - epsilon_low, 1 + epsilon_high) A_t)

    Args:
        ratio: importance ratio ``rho = pi / pi_old``, (B, T) per token or (B, 1) per sequence (GSPO).
        advantages: (B, T) per token or (B, 1) per sequence.

    Returns:
        The per-token loss, shaped as the broadcast of both; the caller masks and aggregates it.
    """
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


AGGREGATED_LOSS_TYPES = ("grpo", "sapo", "bnpo", "dr_grpo", "cispo", "dapo", "vespo", "luspo")


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, *, accumulation: float,
                   max_completion_length: int, num_items: torch.Tensor, num_processes: int,
                   steps_per_generation: int, training: bool) -> torch.Tensor:
    """Reduce a (B, T) per-token loss term over trained tokens ``m`` exactly as TRL 1.16's ``_compute_loss``
    reduces its per-token loss for ``loss_type`` (``accumulation``: gradient-accumulation steps in training, 1 in
    evaluation):

    - ``grpo``/``sapo``: ``mean_i (sum_t m l / sum_t m) / accumulation`` (per sequence, Shao et al. 2024);
    - ``bnpo``: ``sum m l / sum m / accumulation``;
    - ``dr_grpo``: ``sum m l / (B * max_completion_length) / accumulation`` (Liu et al. 2025, "Dr. GRPO");
    - ``dapo``/``cispo``/``vespo``: ``sum m l / (num_items / num_processes * accumulation / steps_per_generation)``
      in training, ``num_items / num_processes`` in evaluation (Yu et al. 2025, "DAPO": per token over the whole
      generation batch, ``num_items`` the trained tokens of every process);
    - ``luspo``: ``mean_i sum_t m l / accumulation``.

    Masked with ``torch.where``: a non-finite value at a masked position does not reach the result."""
    masked = zero_masked(per_token, mask)
    mask = mask.to(masked.dtype)
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token.size(0) * max_completion_length) / accumulation
    if loss_type in ("cispo", "dapo", "vespo"):
        normalizer = num_items.clamp(min=1.0) / num_processes
        if training:
            normalizer = normalizer * accumulation / steps_per_generation
        return masked.sum() / normalizer
    if loss_type == "luspo":
        return masked.sum(-1).mean() / accumulation
    raise ValueError(f"aggregate_loss does not know loss_type {loss_type!r}; one of {AGGREGATED_LOSS_TYPES}")
