"""From token tensors to turn tensors and back, for turn-level credit assignment.

A batch of completions has ``(B, T)`` token tensors; turn-level GAE (:func:`trl_agentic.algorithms.gae.turn_gae`)
works on ``(B, K)`` tensors with one entry per model turn, ``K`` the largest number of turns in the batch. The link is
``turn_ids`` (B, T), an int64 tensor giving each agent token the index of its turn, and -1 at observation tokens
and padding. A turn with no agent token in the (possibly truncated) completion is *absent*: it has no value, is
skipped by the GAE recursion, and broadcasts to no token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def turn_ids_from_spans(turn_spans: Sequence[Sequence[tuple[int, int]]], mask: torch.Tensor) -> torch.Tensor:
    """Build ``turn_ids`` (B, T) from each row's ``Trajectory.turn_spans``.

    Token ``t`` of row ``b`` gets ``k`` when ``turn_spans[b][k][0] <= t < turn_spans[b][k][1]`` and
    ``mask[b, t] == 1``, else -1. Spans reaching past ``T`` (a truncated completion) are cut at ``T``.

    Args:
        turn_spans: One list of ``(start, end)`` spans per row, in completion-token coordinates.
        mask: (B, T) agent-token mask (env mask times completion mask).
    """
    if len(turn_spans) != mask.shape[0]:
        raise ValueError(f"got {len(turn_spans)} rows of turn spans for a mask of {mask.shape[0]} rows")
    turn_ids = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
    for row, spans in enumerate(turn_spans):
        for k, (start, end) in enumerate(spans):
            turn_ids[row, start:end] = k
    return torch.where(mask.bool(), turn_ids, -1)


def _scatter_index(turn_ids: torch.Tensor, num_turns: int) -> torch.Tensor:
    """``turn_ids`` with -1 sent to an extra slot ``num_turns`` that callers drop."""
    return torch.where(turn_ids >= 0, turn_ids, num_turns)


def turn_mask(turn_ids: torch.Tensor, num_turns: int) -> torch.Tensor:
    """(B, K) bool: True where turn ``k`` has at least one agent token in row ``b``."""
    counts = torch.zeros(turn_ids.shape[0], num_turns + 1, dtype=torch.long, device=turn_ids.device)
    counts.scatter_add_(1, _scatter_index(turn_ids, num_turns), torch.ones_like(turn_ids))
    return counts[:, :num_turns] > 0


def turn_sum(x: torch.Tensor, turn_ids: torch.Tensor, num_turns: int) -> torch.Tensor:
    """(B, K): ``sum_{t : turn_ids[b, t] = k} x[b, t]``, e.g. a turn's total KL penalty (0 for an absent turn)."""
    picked = torch.where(turn_ids >= 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
    sums = torch.zeros(x.shape[0], num_turns + 1, dtype=x.dtype, device=x.device)
    sums.scatter_add_(1, _scatter_index(turn_ids, num_turns), picked)
    return sums[:, :num_turns]


def gather_turn_values(values: torch.Tensor, turn_ids: torch.Tensor, num_turns: int) -> torch.Tensor:
    """(B, K): the value of the state in which each turn starts, 0 for an absent turn.

    The value is read at the turn's FIRST agent token. With the usual alignment (``values[:, t]`` computed from the
    hidden state *before* token ``t``, as :class:`trl_agentic.trainers.critic.ValueModel` returns it), that position sees the
    prompt, all earlier turns and observations, and none of turn ``k``'s own tokens: it is ``V(s_k)``. A value read
    later in the turn has seen part of the action; as a baseline it would depend on the action and bias the policy
    gradient.

    Args:
        values: (B, T) per-token values.
        turn_ids: (B, T) turn index of each agent token, -1 elsewhere.
        num_turns: ``K``.
    """
    length = turn_ids.shape[1]
    positions = torch.arange(length, device=turn_ids.device).expand_as(turn_ids)
    first = torch.full((turn_ids.shape[0], num_turns + 1), length, dtype=torch.long, device=turn_ids.device)
    first.scatter_reduce_(1, _scatter_index(turn_ids, num_turns), positions, reduce="amin", include_self=True)
    # An absent turn keeps index T, which reads the zero column appended here.
    return torch.nn.functional.pad(values, (0, 1)).gather(1, first[:, :num_turns])


def broadcast_turns(turn_x: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """(B, T): each agent token gets its turn's entry of ``turn_x`` (B, K); 0 where ``turn_ids == -1``.

    Used for turn advantages (every token of turn ``k`` gets ``A_k`` in the policy loss) and turn returns (every
    token of turn ``k`` regresses to ``R_k`` in the value loss).
    """
    # -1 reads the zero column appended here.
    return torch.nn.functional.pad(turn_x, (0, 1)).gather(1, _scatter_index(turn_ids, turn_x.shape[1]))
