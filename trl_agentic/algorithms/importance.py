"""Importance weights: the policy's ratio to the policy that sampled (PPO/GRPO's ``rho``) and TRL's correction for
the gap between the trainer and vLLM.

Both are computed over trained tokens only (``mask``); a masked position gets ratio 1 (log-ratio 0), so a
non-finite log-prob there never reaches a loss.
"""

from __future__ import annotations

import math

import torch

from .masked import zero_masked


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor | None, mask: torch.Tensor,
                     level: str = "token") -> torch.Tensor:
    """``rho = pi / pi_old`` as TRL 1.16's ``_compute_loss`` computes it (``coef_1``): per token (B, T) for
    ``level="token"``, per sequence (B, 1) ``exp(mean_t log rho_t)`` over trained tokens for ``"sequence"`` (GSPO,
    Zheng et al. 2025). Without ``old_logps`` (on-policy) the ratio is 1 with the policy's gradient."""
    old = old_logps if old_logps is not None else logps.detach()
    log_ratio = zero_masked(logps - old, mask)
    if level == "sequence":
        log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    return torch.exp(log_ratio)


def vllm_importance_sampling_ratio(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                                   mode: str, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL's correction for the gap between the trainer's and vLLM's sampling distributions (TRL 1.16,
    ``_generate_and_score_completions``; Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"). With ``d_t = m_t (log pi_old(y_t) - log pi_vllm(y_t))`` (NaN -> 0):

    - ``token_*``: ``w_t = exp(d_t)``, (B, T); ``sequence_*``: ``w = exp(sum_t d_t)``, (B, 1);
    - ``*_truncate``: ``w <- clamp(w, clip_min, clip_max)``; ``*_mask``: ``w <- 0`` outside ``[clip_min, clip_max]``
      (a missing bound is no bound).
    """
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("sequence_mask", "token_mask"):
        low = clip_min if clip_min is not None else -math.inf
        high = clip_max if clip_max is not None else math.inf
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"vllm_importance_sampling_mode must be 'token_truncate', 'token_mask', 'sequence_truncate' or "
                     f"'sequence_mask', got {mode!r}")


def off_policy_terms(proximal_logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor,
                     correction: str, mode: str, clip_min: float | None,
                     clip_max: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The correction for samples drawn by an older policy (the behaviour policy ``mu``), on trained tokens
    (``mask``): ``(log pi_old, w)``, the log-probs the loss clips against and its per-token (or per-sequence) weight
    (``None``: no weight). With ``pi_prox`` the policy before this round's update (``proximal_logps``):

    - ``"decoupled"`` (AReaL, Fu et al. 2025): ``pi_old = pi_prox``, ``w = pi_prox / mu`` as
      :func:`vllm_importance_sampling_ratio` computes it for ``mode`` (truncated or masked at the clip bounds);
    - ``"behaviour"``: ``pi_old = mu`` on trained tokens, no weight (TRL's ``AsyncGRPOTrainer``);
    - ``"none"``: ``pi_old = pi_prox``, no weight (the lag ignored, an ablation).

    A token whose behaviour log-prob is unknown (not finite) counts as on-policy (``mu = pi_prox`` there)."""
    behaviour = torch.where(torch.isfinite(behaviour_logps), behaviour_logps, proximal_logps)
    if correction == "decoupled":
        return proximal_logps, vllm_importance_sampling_ratio(proximal_logps, behaviour, mask, mode, clip_min, clip_max)
    if correction == "behaviour":
        return torch.where(mask.bool(), behaviour, proximal_logps), None
    return proximal_logps, None
