"""One generation round with an environment, as values (:class:`Round`, its batch a :class:`TRLBatch`), and the
pieces of TRL 1.16's ``_generate_and_score_completions`` that :class:`~trl_agentic.AgenticGRPOTrainer` owns, each a
pure function with TRL's formula beside it.

A round is ``rows -> trajectories -> rewards -> advantages -> batch``; :class:`Round` carries it from one stage to the
next. The functions here build the tensors of TRL's batch from the trajectories exactly as TRL builds them from a
``rollout_func``'s lists (``grpo_trainer.py``, l. 2440-2480: padding; l. 2641-2695: vLLM importance sampling);
``tests/test_round.py`` pins them against TRL's own ``GRPOTrainer`` fed the same trajectories.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..trajectory import Trajectory


# -- the batch -------------------------------------------------------------------------------------------------
class TRLBatch:
    """Typed view of the batch dict TRL's ``_generate_and_score_completions`` returns (and ``_compute_loss``
    takes). Shapes: ``B`` rows (this process), ``P`` prompt width, ``C`` completion width.

    =============================  =======================================================================
    property (TRL key)             meaning
    =============================  =======================================================================
    ``prompt_ids``, ``prompt_mask``  (B, P), **left**-padded
    ``completion_ids``              (B, C), right-padded with the pad id
    ``completion_mask``             (B, C), 1 on real completion positions (0 on padding)
    ``env_mask`` (``tool_mask``)    (B, C), 1 where the model sampled the token, 0 on observations
    ``loss_mask``                   ``completion_mask * env_mask``: the positions the loss trains
    ``advantages``                  (B,) group advantages, or (B, C) per-token advantages
    ``old_logps`` / ``ref_logps``   (B, C) or None (``old_per_token_logps`` / ``ref_per_token_logps``)
    ``sampling_logps``              (B, C) or None: the log-probs vLLM sampled with (``sampling_per_token_logps``)
    ``num_items_in_batch``          scalar: trained positions over all processes (for ``loss_type="dapo"``)
    =============================  =======================================================================
    """

    LEFT_PADDED = ("prompt_ids", "prompt_mask")

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    # -- ids and masks
    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.data["prompt_ids"]

    @property
    def prompt_mask(self) -> torch.Tensor:
        return self.data["prompt_mask"]

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.data["completion_ids"]

    @property
    def completion_mask(self) -> torch.Tensor:
        return self.data["completion_mask"]

    @property
    def env_mask(self) -> torch.Tensor:
        mask = self.data.get("tool_mask")
        return torch.ones_like(self.completion_mask) if mask is None else mask

    @env_mask.setter
    def env_mask(self, value: torch.Tensor) -> None:
        self.data["tool_mask"] = value

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.completion_mask * self.env_mask

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    # -- learning signal
    @property
    def advantages(self) -> torch.Tensor:
        return self.data["advantages"]

    @advantages.setter
    def advantages(self, value: torch.Tensor) -> None:
        self.data["advantages"] = value

    @property
    def old_logps(self) -> torch.Tensor | None:
        return self.data.get("old_per_token_logps")

    @old_logps.setter
    def old_logps(self, value: torch.Tensor) -> None:
        self.data["old_per_token_logps"] = value

    @property
    def ref_logps(self) -> torch.Tensor | None:
        return self.data.get("ref_per_token_logps")

    @property
    def sampling_logps(self) -> torch.Tensor | None:
        return self.data.get("sampling_per_token_logps")

    def pop_ref_logps(self) -> torch.Tensor | None:
        """Remove the reference log-probs (PPO puts the KL in the reward, so TRL's loss must not see them)."""
        return self.data.pop("ref_per_token_logps", None)

    @property
    def num_items_in_batch(self) -> torch.Tensor:
        return self.data["num_items_in_batch"]

    def recount_items(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Recompute ``num_items_in_batch`` after the loss mask changed (``gather`` concatenates over processes)."""
        self.data["num_items_in_batch"] = gather(self.loss_mask.sum().reshape(1)).sum()

    def __getitem__(self, key: str) -> Any:  # extra keys our trainers add (PPO's values, returns)
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    # -- layout, for merging rounds
    def row_keys(self) -> list[str]:
        """Keys of per-row tensors (dim 0 = this process's rows), in TRL's order."""
        rows = self.prompt_ids.size(0)
        return [k for k, v in self.data.items() if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == rows]

    def pad_value(self, key: str, pad_token_id: int) -> float:
        return pad_token_id if key in ("prompt_ids", "completion_ids") else 0

    def is_left_padded(self, key: str) -> bool:
        return key in self.LEFT_PADDED


@dataclass
class Round:
    """One generation round.

    Attributes:
        rows: This process's dataset rows.
        trajectories: This process's trajectories, one per row.
        rewards_per_func: (B_global, num_reward_funcs) rewards of every process (NaN: unscorable).
        batch: This process's batch, in TRL's layout (its ``advantages`` set by the trainer's step).
        prompts: This process's prompts, as the reward functions received them.
        completions: This process's completions, as the reward functions received them.
    """

    rows: list[dict[str, Any]]
    trajectories: list[Trajectory]
    rewards_per_func: torch.Tensor
    batch: TRLBatch
    prompts: list[Any]
    completions: list[Any]


def pad(rows: Sequence[Sequence[float]], value: float, side: str, multiple: int | None,
        dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Rows of different lengths as one (B, W) tensor, ``W`` the longest length rounded up to ``multiple``, filled
    with ``value`` on ``side`` (TRL's ``trl.trainer.utils.pad`` on 1-D rows)."""
    width = max(len(r) for r in rows)
    if multiple:
        width = math.ceil(width / multiple) * multiple
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            values = torch.tensor(list(r), dtype=dtype)
            if side == "left":
                out[i, width - len(r):] = values
            else:
                out[i, : len(r)] = values
    return out


def trl_completion_rows(trajectories: Sequence[Trajectory], pad_token_id: int, mask_observations: bool,
                        mask_truncated: bool) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    """Each trajectory's completion ids, mask of trained tokens (``env_mask``, TRL's ``tool_mask``) and sampling
    log-probs. A row TRL needs but the rollout left empty gets one masked pad token; a trajectory whose environment
    failed (or, with ``mask_truncated``, that did not end on its own) trains no token."""
    ids_rows, mask_rows, logprob_rows = [], [], []
    for t in trajectories:
        ids, mask, logprobs = list(t.completion_ids), list(t.env_mask), list(t.logprobs)
        if not mask_observations:
            mask = [1] * len(mask)
        if not ids:  # TRL needs one position per row; a masked pad token trains nothing
            ids, mask, logprobs = [pad_token_id], [0], [0.0]
        if t.env_failed or (mask_truncated and t.truncated):
            mask = [0] * len(mask)
        ids_rows.append(ids)
        mask_rows.append(mask)
        logprob_rows.append(logprobs)
    return ids_rows, mask_rows, logprob_rows


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
