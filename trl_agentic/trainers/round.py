"""One generation round as values (:class:`Round`), and the pieces of TRL 1.16's ``_generate_and_score_completions``
that our trainers own, each a pure function with TRL's layout beside it.

A round is ``rows -> runs -> rewards -> training rows -> batch -> advantages``; :class:`Round` carries it from one
stage to the next. :func:`pad` and :func:`trl_completion_rows` build the tensors of TRL's batch
(:class:`~trl_agentic.compat.TRLBatch`) from the trajectories exactly as TRL builds them from a ``rollout_func``'s
lists (``grpo_trainer.py``, l. 2440-2480); ``tests/test_round.py`` pins them against TRL's own ``GRPOTrainer`` fed
the same trajectories. :func:`training_rows` lays out the runs' training rows (several for an agent that rewrote
its history).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..algorithms.masked import masked_sum
from ..rollout.metrics import RoundFailures
from ..trajectory import Trajectory


@dataclass
class RoundSummary:
    """A round over every process, from every process's values
    (:func:`~trl_agentic.trainers.metrics.summarize`).

    Attributes:
        metrics: The round's metrics that do not depend on the algorithm.
        tokens: The round's prompt and completion tokens (TRL's ``num_tokens``).
        sums: The rollout seam's counts summed over every process.
        failures: Every process's failed runs (:class:`~trl_agentic.rollout.metrics.RoundFailures`), in rank order.
        refusal: The message of a request the endpoint refused, from the first process that has one, or ``None``.
        table: TRL's completions table over every process (:func:`~trl_agentic.trainers.metrics.table_rows`).
        algorithm: The algorithm's sums (:attr:`~trl_agentic.trainers.metrics.RoundValues.algorithm`) summed over
            every process, in rank order.
    """

    metrics: dict[str, float]
    tokens: int
    sums: Counter
    failures: list[RoundFailures]
    refusal: str | None
    table: tuple[list[Any], list[Any], list[float], dict[str, list[Any]], dict[str, float]]
    algorithm: dict[str, torch.Tensor]


@dataclass
class Round:
    """One generation round, laid out on two levels.

    *Runs* are the episodes, one per dataset row of this process (as TRL's sampler gave them): reward functions
    score each run once, and GRPO's groups are ``num_generations`` consecutive runs. *Training rows* are the
    sequences the loss trains on: one per run for the engine's rollouts; one per segment for an agent run that
    rewrote its history (:mod:`trl_agentic.agents`), plus padding rows (one masked token) so that every process has
    the same number, divisible by ``steps_per_generation``.

    Attributes:
        rows: This process's dataset rows, one per run.
        runs: This process's runs.
        run_rewards: (R_global, num_reward_funcs) rewards of every process's runs (NaN: unscorable).
        trajectories: This process's training rows (the runs themselves for the engine's rollouts).
        owners: For each training row, the index of its run in ``runs`` (-1: a padding row).
        rewards_per_func: (B_global, num_reward_funcs) each training row's run's rewards (NaN for padding rows).
        batch: This process's batch, in TRL's layout (its ``advantages`` set by the trainer's step).
        prompts: This process's prompts per training row, as the reward functions received them (a segment's: its
            run's; a padding row's: empty).
        completions: This process's completions per training row, as the reward functions received them (a
            segment's: its own messages).
        summary: The round over every process (:class:`RoundSummary`, set with
            its metrics: :meth:`~trl_agentic.trainers.base.AgenticTrainer.round_metrics`), or ``None`` before.
    """

    rows: list[dict[str, Any]]
    runs: list[Trajectory]
    run_rewards: torch.Tensor
    trajectories: list[Trajectory]
    owners: list[int]
    rewards_per_func: torch.Tensor
    batch: Any
    prompts: list[Any]
    completions: list[Any]
    summary: RoundSummary | None = None


def values_of_rows(per_run: torch.Tensor, owners: Sequence[int], fill: float = 0.0) -> torch.Tensor:
    """This process's per-run values (one per run, along dim 0) given to its training rows: row ``i`` gets its run
    ``owners[i]``'s, a padding row (-1) ``fill``."""
    filler = torch.full_like(per_run[0], fill)
    return torch.stack([per_run[o] if o >= 0 else filler for o in owners])


PADDING_ERROR = "padding row"


def padding_row(token_id: int) -> Trajectory:
    """A training row that trains nothing: one masked token, unscorable."""
    return Trajectory(prompt_ids=[token_id], stop_reason="env_error", error=PADDING_ERROR)


def training_rows(runs: Sequence[Trajectory], gather_max: Callable[[int], int], multiple: int,
                  token_id: int) -> tuple[list[Trajectory], list[int]]:
    """The training rows of every run (:meth:`~trl_agentic.Trajectory.training_rows`: the run itself, or an agent
    run's segments), in order, then padding rows (:func:`padding_row` of ``token_id``) up to the most rows of any
    process (``gather_max`` of this process's count) rounded up to ``multiple``; and each row's run index (-1 for
    padding)."""
    out, owners = [], []
    for i, run in enumerate(runs):
        for row in run.training_rows():
            out.append(row)
            owners.append(i)
    count = math.ceil(max(1, gather_max(len(out))) / multiple) * multiple
    pad_rows = count - len(out)
    return out + [padding_row(token_id) for _ in range(pad_rows)], owners + [-1] * pad_rows


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
    """Each trajectory's completion ids, mask of trained tokens (``env_mask``, the batch's key in TRL's name) and sampling
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


def turn_advantages(batch: Any, trajectories: Sequence[Trajectory]) -> list[list[float | None]] | None:
    """Per training row, the advantage of each turn (the mean over the turn's trained tokens; ``None`` for a turn
    with none), when the advantages are per token (PPO, GiGPO); ``None`` when they are one per row (GRPO)."""
    if batch.advantages.dim() == 1:
        return None
    advantages, mask = batch.advantages.detach().float().cpu(), batch.loss_mask.bool().cpu()
    out = []
    for row, t in enumerate(trajectories):
        turns = []
        for start, end in t.turn_spans:
            trained = mask[row, start:end]
            turns.append(float(advantages[row, start:end][trained].mean()) if trained.any() else None)
        out.append(turns)
    return out


def row_advantages(batch: Any) -> torch.Tensor:
    """One advantage per training row: GRPO's, or for per-token advantages (PPO) their mean over the row's trained
    tokens."""
    advantages = batch.advantages.detach().float()
    if advantages.dim() == 1:
        return advantages
    mask = batch.loss_mask
    return masked_sum(advantages, mask, dim=1) / mask.sum(1).clamp(min=1)
