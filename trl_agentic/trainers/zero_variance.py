"""Groups whose rewards are all equal: DAPO dynamic sampling.

When every completion of a group gets the same reward, its group-relative advantage is 0: the group costs compute
and teaches nothing. ``AgenticGRPOConfig.zero_variance_groups`` chooses what to do:

- ``"keep"`` (default): train on the batch as it is; TRL logs ``frac_reward_zero_std``.
- ``"std_floor"``: divide by ``max(std, std_floor)`` (:func:`~trl_agentic.algorithms.advantages.group_advantages`).
- ``"dynamic_sampling"``: DAPO (Yu et al. 2025, arXiv 2503.14476, Sec. 3.2): drop such groups and sample more
  prompts until the batch is full again, at most ``max_extra_generation_rounds`` extra rounds; if still short, the
  batch is completed with dropped groups (logged as ``agentic/zero_variance/shortfall_groups``). This module.

Groups are laid out as TRL lays them out: ``num_generations`` consecutive rows of the *global* batch (the
concatenation of all processes' local batches), a group possibly spanning two processes. Selection therefore works
on the gathered batch and hands each process back its own slice.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..compat import TRLBatch


def pick_groups(keep_per_round: list[torch.Tensor], needed: int) -> list[tuple[int, int]]:
    """Choose ``needed`` groups as ``(round, group)``: kept groups of each round in order, then dropped groups of
    the first round to fill any shortfall. Deterministic, so every process picks the same."""
    picked = [(r, g) for r, keep in enumerate(keep_per_round) for g in keep.nonzero().flatten().tolist()]
    picked = picked[:needed]
    if len(picked) < needed:
        dropped = (~keep_per_round[0]).nonzero().flatten().tolist()
        picked += [(0, g) for g in dropped[: needed - len(picked)]]
    return picked


def _pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    if x.dim() < 2 or x.size(1) == width:
        return x
    pad = x.new_full((x.size(0), width - x.size(1)), value)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


def merge_rounds(
    rounds: list[TRLBatch],
    picked: list[tuple[int, int]],
    num_generations: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
    max_width: Callable[[int], int],
    process_index: int,
    pad_token_id: int,
) -> TRLBatch:
    """Build this process's batch from the picked global groups of several generation rounds.

    Every per-row tensor of each round is padded to a width common to all processes and rounds (on the side TRL
    pads it), gathered, indexed by the picked global rows and sliced back to this process.
    ``num_items_in_batch`` is recomputed from the merged loss mask.
    """
    first = rounds[0]
    local = first.prompt_ids.size(0)
    rows = torch.tensor([group * num_generations + i for _, group in picked for i in range(num_generations)])
    which = torch.tensor([round_ for round_, _ in picked for _ in range(num_generations)])
    merged = TRLBatch(dict(first.data))  # keeps TRL's key order (its shuffle reads the first value's length)
    for key in first.row_keys():
        width = max_width(max(r[key].size(1) if r[key].dim() > 1 else 0 for r in rounds))
        value, left = first.pad_value(key, pad_token_id), first.is_left_padded(key)
        gathered = [gather(_pad_to(r[key], width, value, left)) for r in rounds]
        full = torch.stack([gathered[w][i] for w, i in zip(which.tolist(), rows.tolist())])
        merged[key] = full[process_index * local : (process_index + 1) * local]
    merged.recount_items(gather)
    return merged
