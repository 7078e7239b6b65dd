"""A round of agent trajectories as TRL's training rows: one row per segment, the reward per trajectory.

An agent run may hold several segments (:mod:`trl_agentic.agents.session`: a rewritten history, a sub-agent), each
its own training sequence. The round is therefore laid out on two levels:

- **trajectories** (one per dataset row, ``B`` per process, as TRL's sampler gave them): the reward functions score
  each once (``trajectory``, ``agent_output`` and the dataset's columns), and GRPO's group advantages are computed over
  them, ``num_generations`` consecutive trajectories per group, exactly as for the engine's rollouts; a trajectory
  with several segments weighs once in its group's mean and standard deviation;
- **rows** (one per segment, ``R`` per process): every row carries its trajectory's reward and advantage (PPO: its
  own GAE, on the score of its trajectory at its last sampled token).

TRL's layout needs the same number of rows on every process, divisible by ``steps_per_generation`` (TRL splits the
generation batch into that many micro-batches and drops a remainder). ``R`` is therefore the largest segment count
of any process, rounded up to that multiple; the rows it adds are *padding rows*: one masked token, unscorable
(``stop_reason="env_error"``, ``error="padding row"``), with no gradient. Without rewritten histories every
trajectory has one segment and ``R = B``: the round is the engine's, row for row.

Biases of this choice (see docs/agents.md): a trajectory of ``k`` segments contributes ``k`` sequences to the loss, so
with a per-sequence normalisation (``loss_type="grpo"``) its tokens weigh ``k`` times a one-segment trajectory's, and
padding rows enlarge that mean's denominator; with TRL's default ``loss_type="dapo"`` (per token over the batch)
neither happens. Reward metrics and the completions table are per row.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..algorithms.advantages import frac_reward_zero_std, group_advantages
from ..rewards.inputs import reward_inputs
from ..trackers import trajectory_columns
from ..trainers.checks import DegenerateTrainingError
from ..trainers.round import Round, trl_completion_rows
from ..trajectory import Trajectory
from .session import AgentTrajectory

PADDING_ERROR = "padding row"


@dataclass
class SegmentRound(Round):
    """A :class:`~trl_agentic.trainers.round.Round` whose rows are segments (its ``rows``, ``trajectories``,
    ``rewards_per_func``, ``batch``, ``prompts`` and ``completions`` are per row), plus the trajectory level.

    Attributes:
        agent_trajectories: This process's agent runs, one per dataset row.
        trajectory_rewards: (B_global, num_reward_funcs) rewards per agent run (NaN: unscorable).
        owners: For each row of this process, the index of its agent run in ``agent_trajectories`` (-1: padding).
    """

    agent_trajectories: list[AgentTrajectory] | None = None
    trajectory_rewards: torch.Tensor | None = None
    owners: list[int] | None = None


def padding_row(token_id: int) -> Trajectory:
    """A row that trains nothing: one masked token, unscorable."""
    return Trajectory(prompt_ids=[token_id], stop_reason="env_error", error=PADDING_ERROR)


def layout_rows(trajectories: Sequence[AgentTrajectory], rows: int,
                token_id: int) -> tuple[list[Trajectory], list[int]]:
    """Every segment of every trajectory as a row (a trajectory without segments keeps itself as its row), in order,
    then padding rows up to ``rows``; and each row's trajectory index (-1 for padding)."""
    out, owners = [], []
    for i, t in enumerate(trajectories):
        for segment in t.segments or [t]:
            out.append(segment)
            owners.append(i)
    if len(out) > rows:
        raise ValueError(f"{len(out)} segments do not fit in {rows} rows")
    pad = rows - len(out)
    return out + [padding_row(token_id) for _ in range(pad)], owners + [-1] * pad


def row_count(local_rows: int, gather_max: Any, multiple: int) -> int:
    """Rows per process: the most rows of any process (``gather_max``), rounded up to ``multiple``."""
    return math.ceil(max(1, gather_max(local_rows)) / multiple) * multiple


def agent_round(trainer: Any, rows: list[dict[str, Any]], trajectories: list[AgentTrajectory]) -> SegmentRound:
    """Score one round of agent runs and lay it out as training rows (module docstring). ``trainer`` is an
    :class:`~trl_agentic.AgenticGRPOTrainer` (or PPO); its reward functions receive, per agent run, ``trajectory``,
    ``agent_output``, the dataset's columns, ``prompts`` and ``completions`` (the main segment's messages after its
    prompt)."""
    args, accelerator = trainer.args, trainer.accelerator
    device = accelerator.device
    pad_id = trainer.processing_class.pad_token_id
    pad_id = pad_id if pad_id is not None else trainer.eos_token_ids[0]
    prompts, completions, extras = reward_inputs(trajectories, trainer.processing_class,
                                                 prompts=copy.deepcopy([row["prompt"] for row in rows]))
    reward_rows = [{**row, **extra, "agent_output": t.agent_output}
                   for row, extra, t in zip(rows, extras, trajectories)]
    rewards = trainer.trl_rewards(reward_rows, prompts, completions, [list(t.completion_ids) for t in trajectories])
    failed = torch.tensor([t.env_failed for t in trajectories], device=rewards.device)
    rewards = rewards.masked_fill(accelerator.gather(failed).unsqueeze(1), torch.nan)

    multiple = args.steps_per_generation if trainer.model.training else 1
    local = sum(max(1, len(t.segments)) for t in trajectories)
    count = row_count(local, lambda n: int(accelerator.gather(torch.tensor([n], device=device)).max()), multiple)
    row_trajectories, owners = layout_rows(trajectories, count, pad_id)
    offset = accelerator.process_index * len(trajectories)
    nan_row = torch.full_like(rewards[0], torch.nan)
    row_rewards = torch.stack([rewards[offset + o] if o >= 0 else nan_row for o in owners])
    completion_ids, env_mask, logprobs = trl_completion_rows(row_trajectories, pad_id, args.mask_observations,
                                                             args.mask_truncated_trajectories)
    batch = trainer._batch(row_trajectories, completion_ids, env_mask, logprobs)
    round_ = SegmentRound(
        rows=[rows[o] if o >= 0 else {} for o in owners],
        trajectories=row_trajectories,
        rewards_per_func=accelerator.gather(row_rewards.to(device)),
        batch=batch,
        prompts=[prompts[o] if o >= 0 else "" for o in owners],
        completions=[list(t.messages) for t in row_trajectories],
        agent_trajectories=list(trajectories),
        trajectory_rewards=rewards,
        owners=owners,
    )
    trainer._log_mask_audit(round_)
    _log_agent_metrics(trainer, trajectories)
    if args.log_completions:
        trainer.log_completion_columns(trajectory_columns(row_trajectories))
    if trainer.model.training:  # trainers/checks.py: stop a run that can only train on nothing
        stop = trainer._degenerate.observe(torch.isnan(rewards).all(dim=1).tolist(), trajectories)
        if stop is not None:
            trainer._record(round_)
            raise DegenerateTrainingError(stop)
    return round_


def set_segment_advantages(trainer: Any, round_: SegmentRound) -> None:
    """GRPO's group advantages over the agent runs (groups of ``num_generations`` runs, the trainer's
    ``scale_rewards``, aggregation and ``std_floor``), each row given its run's (0 for padding); then TRL's reward
    metrics and completions table, per row."""
    group = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
    floor = trainer.args.std_floor if trainer.args.zero_variance_groups == "std_floor" else 0.0
    per_run = group_advantages(round_.trajectory_rewards, trainer.reward_weights, group,
                               trainer.multi_objective_aggregation, trainer.scale_rewards, floor)
    local = trainer._local(per_run)
    per_row = torch.stack([local[o] if o >= 0 else torch.zeros_like(local[0]) for o in round_.owners])
    round_.batch.advantages = per_row.to(round_.batch.advantages.device)
    zero_std = frac_reward_zero_std(round_.trajectory_rewards, trainer.reward_weights, group,
                                    trainer.multi_objective_aggregation, trainer.scale_rewards)
    trainer._log_rewards(round_, trainer.accelerator.gather(per_row.to(trainer.accelerator.device)), zero_std)


AGENT_EVENTS = ("bad_request", "template_fallback", "over_budget_requests", "no_model_calls", "malformed_tool_call")


def _log_agent_metrics(trainer: Any, trajectories: Sequence[AgentTrajectory]) -> None:
    """``agentic/agent/*_per_trajectory`` over all processes: segments, requests and the endpoint's events."""
    local = [len(trajectories), sum(len(t.segments) for t in trajectories), sum(t.requests for t in trajectories)]
    local += [sum(t.events.get(e, 0) for t in trajectories) for e in AGENT_EVENTS]
    total = trainer.accelerator.gather(torch.tensor([local], dtype=torch.float,
                                                    device=trainer.accelerator.device)).sum(0).tolist()
    n = max(total[0], 1.0)
    for name, value in zip(("segments", "requests", *AGENT_EVENTS), total[1:]):
        trainer.log_metric(f"agentic/agent/{name}_per_trajectory", value / n)
