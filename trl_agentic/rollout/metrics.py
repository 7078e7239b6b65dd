"""Per-step rollout metrics, summed per process and combined across processes by the trainer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Iterable

import torch

from ..environments.base import read_info
from ..trajectory import ENV_FAILURES, Trajectory

EVENT_KEYS = ("env_error", "env_timeout", "observation_truncated", "env_close_error")
INFO_FLAGS = ("invalid", "tool_error", "tool_timeout", "unknown_tool")


def rollout_sums(trajectories: Iterable[Trajectory]) -> Counter:
    """Sums over this process's trajectories; ``count`` is the number of trajectories.

    Keys: ``turns``, ``truncated``, ``agent_tokens``, ``observation_tokens``, the info flags (``invalid``,
    ``tool_error``, ``tool_timeout``, ``unknown_tool``), ``tool_calls/<tool>``, ``tool_turns`` (turns of an
    environment that offers tools: its step info has a ``tool`` list), ``stop/<reason>`` (trajectories per stop
    reason), ``reached_model`` (trajectories with at least one model turn), and the engine's events (``env_error``, ``env_timeout``, ``observation_truncated``). Dividing by
    ``count`` gives per-trajectory means.
    """
    sums: Counter = Counter()
    for t in trajectories:
        sums["count"] += 1
        sums[f"stop/{t.stop_reason}"] += 1
        sums["reached_model"] += int(any(row.turn_spans for row in t.training_rows()))
        sums["turns"] += t.num_turns
        sums["truncated"] += int(t.truncated)
        agent_tokens = t.num_agent_tokens  # the rest of the completion is observations: env_mask summed once
        sums["agent_tokens"] += agent_tokens
        sums["observation_tokens"] += len(t.env_mask) - agent_tokens
        for info in map(read_info, t.turn_infos):
            for flag in INFO_FLAGS:  # a count (several native tool calls in one turn)
                sums[flag] += getattr(info, flag)
            sums["native_tool_calls"] += info.tool_calls
            sums["tool_turns"] += int(info.reports_tools)
            for tool in info.tool:
                sums[f"tool_calls/{tool}"] += 1
        for event in EVENT_KEYS:
            sums[event] += t.events.get(event, 0)
    return sums


def trl_tool_metrics(sums: Counter) -> dict[str, float]:
    """TRL 1.16's tool metrics (``GRPOTrainer._generate``), from the sums over every process: ``tools/call_frequency``
    (tool calls per completion) and ``tools/failure_frequency`` (failed calls per call: the tool raised, timed out,
    or no such tool; 0 without calls). Logged for native tool calls, as TRL logs them whenever it has tools."""
    calls, failures = torch.tensor(sums["native_tool_calls"]), torch.tensor(sums["tool_error"])
    return {"tools/call_frequency": (calls / max(sums["count"], 1)).item(),  # float32, as TRL divides tensors
            "tools/failure_frequency": (failures / calls).item() if calls > 0 else 0.0}


def metrics_from_sums(sums: Counter) -> dict[str, float]:
    """Turn summed counts into the logged metrics (names under ``agentic/``)."""
    n = max(sums["count"], 1)
    tokens = max(sums["agent_tokens"] + sums["observation_tokens"], 1)
    metrics = {
        "agentic/turns_mean": sums["turns"] / n,
        "agentic/truncated_rate": sums["truncated"] / n,
        "agentic/observation_token_share": sums["observation_tokens"] / tokens,
    }
    for key in (*INFO_FLAGS, *EVENT_KEYS):
        metrics[f"agentic/{key}_per_trajectory"] = sums[key] / n
    for key, value in sums.items():
        if key.startswith("tool_calls/"):
            metrics[f"agentic/{key}_per_trajectory"] = value / n
    return metrics


def logprob_gap(trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Mean and max of ``|log pi_train(y_t) - log pi_sample(y_t)|`` over the positions where ``mask`` is 1.

    The trainer's log-prob of a sampled token and the one the inference engine (vLLM) sampled it with differ by
    kernels, precision and batching; the gap is the training/inference mismatch that importance-sampling
    corrections address (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"; TRL's ``vllm_importance_sampling_correction``). Only agent tokens count: observation tokens were
    never sampled. ``(0.0, 0.0)`` when the mask is empty."""
    mask = mask.bool()
    if not mask.any():
        return 0.0, 0.0
    delta = (trainer_logps.float() - sampling_logps.float()).abs()[mask]
    return delta.mean().item(), delta.max().item()


@dataclass
class RoundFailures:
    """This process's failed runs of a round: how many ended with each failing stop reason, and the first error."""

    counts: Counter
    first_error: str | None

    @classmethod
    def of(cls, runs: Sequence[Trajectory]) -> "RoundFailures":
        failed = [t for t in runs if t.stop_reason in ENV_FAILURES]
        return cls(Counter(t.stop_reason for t in failed), failed[0].error if failed else None)


def failure_line(label: str, runs: int, everyone: Sequence[RoundFailures], cost: str = "") -> str | None:
    """One line, headed ``label``, naming the failed runs of a round over every process (``runs``: the runs of the
    round over every process) and what they ``cost``, or ``None`` when none failed."""
    counts: Counter = Counter()
    for failures in everyone:
        counts.update(failures.counts)
    if not counts:
        return None
    error = next((f.first_error for f in everyone if f.first_error), "(no message)")
    kinds = ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items()))
    failed = sum(counts.values())
    return f"{label}: {failed} of {runs} trajectories failed{cost} ({kinds}); e.g. {_short(error)}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
