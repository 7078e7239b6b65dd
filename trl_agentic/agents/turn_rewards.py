"""Per-turn rewards of an agent run: a function over its recorded turns (``Agent(turn_rewards=...)``), called once per
segment after the agent has returned, whose numbers become each segment's ``turn_rewards`` (PPO's turn-level GAE and
GiGPO read them, as they read an environment's ``StepResult.reward``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from .session import AgentTrajectory

TurnRewards = Callable[..., Sequence[float]]
"""``turn_rewards(trajectory, **row) -> [r_0, ..., r_{K-1}]``: ``trajectory`` one segment of the run (its
``actions``, ``observations``, ``messages``), ``row`` the dataset row's columns and ``agent_output``; one finite number
per turn of the segment."""


def score_turns(run: AgentTrajectory, turn_rewards: TurnRewards, row: dict[str, Any]) -> None:
    """Set each segment's ``turn_rewards`` (in place: the run's own fields are its main segment's) from
    ``turn_rewards``; a run whose agent failed is left as it is. A call that raises, or returns anything but one
    finite number per turn, costs the run alone: it ends with ``env_error`` and the reason in one line."""
    if run.env_failed:
        return
    kwargs = {**row, "agent_output": run.agent_output}
    try:
        for segment in run.segments:
            segment.turn_rewards[:] = _checked(turn_rewards(segment, **kwargs), len(segment.actions))
    except Exception as exc:  # noqa: BLE001 - the function's failure costs its run alone
        error = f"turn_rewards raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        for trajectory in (run, *run.segments):
            trajectory.stop_reason, trajectory.error = "env_error", error


def _checked(values: Any, turns: int) -> list[float]:
    """``values`` as floats, or a ``ValueError`` saying what to return instead."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"return a list of {turns} numbers (one per turn), got {type(values).__name__}")
    if len(values) != turns:
        raise ValueError(f"returned {len(values)} values for a segment of {turns} turns: return one number per turn")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"returned {value!r:.40}: each turn's reward must be a finite number")
    return [float(value) for value in values]
