"""What an agent round adds to the logged metrics: ``agentic/agent/*_per_trajectory``.

A round of agent runs is laid out as training rows by the trainers' common code
(:func:`~trl_agentic.trainers.round.training_rows`): one row per segment, the reward and GRPO's advantage per run.
Biases of that choice (see docs/agents.md): a run of ``k`` segments contributes ``k`` sequences to the loss, so with
a per-sequence normalisation (``loss_type="grpo"``) its tokens weigh ``k`` times a one-segment run's, and padding rows
enlarge that mean's denominator; with TRL's default ``loss_type="dapo"`` (per token over the batch) neither happens.
Reward metrics and the completions table are per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

AGENT_EVENTS = ("bad_request", "template_fallback", "over_budget_requests", "no_model_calls", "malformed_tool_call",
                "forced_call", "tool_choice_unforced", "text_join_mismatch")


def agent_metrics(runs: Sequence[Any], accelerator: Any) -> dict[str, float]:
    """``agentic/agent/*_per_trajectory`` over all processes: segments, requests and the endpoint's events."""
    local = [len(runs), sum(len(t.segments) for t in runs), sum(t.requests for t in runs)]
    local += [sum(t.events.get(e, 0) for t in runs) for e in AGENT_EVENTS]
    total = accelerator.gather(torch.tensor([local], dtype=torch.float, device=accelerator.device)).sum(0).tolist()
    n = max(total[0], 1.0)
    return {f"agentic/agent/{name}_per_trajectory": value / n
            for name, value in zip(("segments", "requests", *AGENT_EVENTS), total[1:])}
