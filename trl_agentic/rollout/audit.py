"""The mask audit: trained positions that the model did not sample.

A position of a completion may be trained (loss mask 1) only if it holds a token the generator returned for that
turn, at the same offset, and no end id precedes it in that turn's generation. The reference is
``Trajectory.generated_ids`` (the generator's raw output, before the engine's cut) and the model's end ids, not the
engine's own bookkeeping, so a defect in the cut (a pad kept after an end id the engine did not know, an
observation marked as sampled) is counted. ``agentic/mask_audit`` logs the count; it must be 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..trajectory import Trajectory


def sampled_positions(trajectory: Trajectory, eos_token_ids: Iterable[int]) -> list[bool]:
    """For each completion position, whether it may be trained: inside a turn, equal to what the generator
    returned at that offset, and not after an end id of that turn's generation."""
    ends = set(eos_token_ids)
    allowed = [False] * len(trajectory.completion_ids)
    for (start, stop), generated in zip(trajectory.turn_spans, trajectory.generated_ids):
        for offset in range(stop - start):
            position = start + offset
            if offset >= len(generated) or position >= len(allowed):
                break
            if generated[offset] != trajectory.completion_ids[position]:
                break
            allowed[position] = True
            if generated[offset] in ends:
                break
    return allowed


def unsampled_trained(trajectory: Trajectory, trained: Sequence[bool | int], eos_token_ids: Iterable[int]) -> int:
    """How many positions ``trained`` marks (a row of the loss mask, possibly padded wider than the completion)
    that :func:`sampled_positions` does not allow."""
    allowed = sampled_positions(trajectory, eos_token_ids)
    return sum(1 for i, flag in enumerate(trained) if flag and (i >= len(allowed) or not allowed[i]))
