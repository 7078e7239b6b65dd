"""The multi-turn columns of TRL's completions table.

With ``log_completions=True`` TRL keeps a table of the round's completions (step, prompt, completion, each reward
function's value, the advantage, and columns that reward functions add through ``log_extra``, such as a
:class:`~trl_agentic.rewards.CompositeReward`'s components), prints a few rows, writes it to
``<output_dir>/completions/*.parquet`` and sends it to trackio and Weights & Biases when ``report_to`` names them.
The agentic trainers add what a multi-turn episode needs to be read there, from :func:`trajectory_columns`: the
number of turns, each turn's action, the tools called, the observations (each capped), why the episode ended and
the environment's reward.

trackio is the local default: ``report_to="trackio"`` logs to a local database with no account and no network
(``trackio show`` opens the dashboard); a Space is used only when ``TRACKIO_SPACE_ID`` is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .environments.base import read_info

MAX_CELL_CHARS = 300
"""Each action and observation is cut to this many characters in the table (the JSONL of ``trajectory_dir`` keeps
everything)."""


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"...[+{len(text) - limit} chars]"


def _numbered(texts: Sequence[str | None], limit: int) -> str:
    return "\n".join(f"[{i}] {_cap(text, limit)}" for i, text in enumerate(texts, start=1) if text is not None)


def trajectory_columns(trajectories: Sequence[Any], max_chars: int = MAX_CELL_CHARS) -> dict[str, list[Any]]:
    """One value per trajectory for each column: ``turns``, ``actions`` and ``observations`` (``[k] text`` per turn,
    each cut to ``max_chars``), ``tool_calls`` (the tools called, in order, from ``StepResult.info["tool"]``),
    ``stop_reason`` and ``env_reward``."""
    return {
        "turns": [t.num_turns for t in trajectories],
        "actions": [_numbered(t.actions, max_chars) for t in trajectories],
        "tool_calls": [", ".join(name for info in t.turn_infos for name in read_info(info).tool)
                       for t in trajectories],
        "observations": [_numbered(t.observations, max_chars) for t in trajectories],
        "stop_reason": [t.stop_reason for t in trajectories],
        "env_reward": [t.env_reward for t in trajectories],
    }
