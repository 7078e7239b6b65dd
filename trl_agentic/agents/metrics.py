"""What an agent round adds to the logged metrics: ``agentic/agent/*_per_trajectory``, from counts over the runs.

A round of agent runs is laid out as training rows by the trainers' common code
(:func:`~trl_agentic.trainers.round.training_rows`): one row per segment, the reward and GRPO's advantage per run.
Biases of that choice (see docs/agents.md): a run of ``k`` segments contributes ``k`` sequences to the loss, so with
a per-sequence normalisation (``loss_type="grpo"``) its tokens weigh ``k`` times a one-segment run's, and padding rows
enlarge that mean's denominator; with TRL's default ``loss_type="dapo"`` (per token over the batch) neither happens.
Reward metrics and the completions table are per row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .session import AgentTrajectory

AGENT_EVENTS = ("bad_request", "template_fallback", "over_budget_requests", "no_model_calls", "malformed_tool_call",
                "forced_call", "tool_choice_unforced", "text_join_mismatch", "restarted", "auxiliary")
AGENT_COUNTS = ("segments", "requests", *AGENT_EVENTS)
"""What :func:`agent_sums` counts, in the order the metrics are logged."""


def agent_sums(runs: Sequence[AgentTrajectory]) -> Counter:
    """This process's counts: ``agent/<name>`` for the segments, the requests and the endpoint's events (summable
    over processes)."""
    sums: Counter = Counter()
    for t in runs:
        sums["agent/segments"] += len(t.segments)
        sums["agent/requests"] += t.requests
        for event in AGENT_EVENTS:
            sums[f"agent/{event}"] += t.events.get(event, 0)
    return sums


def agent_metrics(sums: Counter) -> dict[str, float]:
    """``agentic/agent/*_per_trajectory`` from :func:`agent_sums` over every process (``count``: the runs)."""
    n = max(sums["count"], 1)
    return {f"agentic/agent/{name}_per_trajectory": sums[f"agent/{name}"] / n for name in AGENT_COUNTS}
