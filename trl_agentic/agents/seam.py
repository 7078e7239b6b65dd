"""Agents behind the rollout seam (:mod:`~trl_agentic.rollout.seam`): :class:`AgentSeam` runs one agent per row
through :class:`~trl_agentic.agents.runner.AgentRollout` and lays out what the trainers and ``evaluate`` read."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..rollout.generation import Generator
from ..rollout.metrics import metrics_from_sums, rollout_sums
from ..rollout.seam import Runs
from .metrics import agent_metrics, agent_sums
from .runner import AgentRollout
from .session import AgentTrajectory


class AgentSeam:
    """Agents of any framework through the OpenAI-compatible endpoint: each run's training rows are its segments
    (one per conversation the agent sent, :meth:`~trl_agentic.agents.session.AgentTrajectory.training_rows`), its
    reward functions' ``prompts`` are the rows' prompts (what each agent was given) and they also receive
    ``trajectory`` and ``agent_output`` (what the agent returned).

    Args:
        runner: The endpoint and the agents' loop, started once.
        generator: The generation backend every agent's requests are generated with.
        sync_any: Given whether this process still has waiting requests, whether any process has (identity on one
            process; :class:`~trl_agentic.agents.bridge.GenerationBridge`).
        multi_process: Whether other processes generate with this one.
        prompt_column: The column that holds each row's prompt.
    """

    reward_fields = ("trajectory", "agent_output")
    tools_on_training_thread = False
    trained_seats: tuple[str, ...] = ()

    def __init__(self, runner: AgentRollout, generator: Generator, sync_any: Callable[[bool], bool] | None = None,
                 multi_process: bool = False, prompt_column: str = "prompt") -> None:
        self.runner = runner
        self.generator = generator
        self.sync_any = sync_any
        self.multi_process = multi_process
        self.prompt_column = prompt_column
        self.eos_token_ids = runner.eos_token_ids
        self.tools: list[Callable[..., Any]] = []

    def run(self, rows: Sequence[dict[str, Any]]) -> Runs:
        """One agent run per row, against the endpoint."""
        return self.runner.run(rows, self.generator, self.sync_any, self.multi_process), None

    def reward_inputs(self, rows: Sequence[dict[str, Any]], runs: Sequence[AgentTrajectory],
                      environments: Sequence[Any] | None) -> tuple[list[Any], list[dict[str, Any]]]:
        """Each row's prompt (what its agent was given), ``trajectory`` and ``agent_output``."""
        prompts = copy.deepcopy([row.get(self.prompt_column) for row in rows])
        return prompts, [{"trajectory": t, "agent_output": t.agent_output} for t in runs]

    def refusal(self, runs: Sequence[AgentTrajectory]) -> str | None:
        """The endpoint's message for the first request it refused (400 or 413) in these runs."""
        return next((t.refusal for t in runs if t.refusal), None)

    def sums(self, runs: Sequence[AgentTrajectory]) -> Counter:
        """:func:`~trl_agentic.rollout.metrics.rollout_sums` and :func:`~trl_agentic.agents.metrics.agent_sums`."""
        sums = rollout_sums(runs)
        sums.update(agent_sums(runs))
        sums["refused"] = sums["agent/bad_request"]  # requests the endpoint refused: the trainer's stop reads it
        return sums

    def metrics(self, sums: Counter) -> dict[str, float]:
        """``agentic/*`` and ``agentic/agent/*``."""
        return {**metrics_from_sums(sums), **agent_metrics(sums)}

    def close(self) -> None:
        """Stop the endpoint and the agents' loop."""
        self.runner.close()
