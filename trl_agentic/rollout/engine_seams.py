"""The engine behind the rollout seam (:mod:`~trl_agentic.rollout.seam`): our environments
(:class:`EngineSeam`) and TRL's ``tools=`` / ``environment_factory=`` (:class:`TRLToolsSeam`), both rolled out by
one :class:`~trl_agentic.rollout.engine.RolloutEngine`, built once. Each run is its own training row
(:meth:`~trl_agentic.Trajectory.training_rows`)."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..environments.trl_environments import EMPTY_PROMPT, TRLEnvironments
from ..trajectory import Trajectory
from .engine import RolloutEngine
from .metrics import metrics_from_sums, rollout_sums, trl_tool_metrics
from .seam import Runs


class EngineSeam:
    """Our :class:`~trl_agentic.Environment` (a class or zero-argument factory) through the engine: each row's
    ``prompt_column`` is its prompt, the row reaches ``reset``; reward functions also receive ``trajectory``.

    Args:
        engine: The engine, built once (its generator, encoder and environment factory).
        prompt_column: The column that holds each row's prompt.
    """

    reward_fields = ("trajectory",)
    tools_on_training_thread = False
    trained_seats: tuple[str, ...] = ()

    def __init__(self, engine: RolloutEngine, prompt_column: str = "prompt") -> None:
        self.engine = engine
        self.prompt_column = prompt_column
        self.eos_token_ids = engine.eos_token_ids
        self.tools: list[Callable[..., Any]] = []

    def run(self, rows: Sequence[dict[str, Any]]) -> Runs:
        """One engine episode per row."""
        prompts = copy.deepcopy([row[self.prompt_column] for row in rows])
        return self.engine.run(prompts, [dict(row) for row in rows]), None

    def reward_inputs(self, rows: Sequence[dict[str, Any]], runs: Sequence[Trajectory],
                      environments: Sequence[Any] | None) -> tuple[list[Any], list[dict[str, Any]]]:
        """Each run's prompt (the reset text appended) and ``trajectory``."""
        return [t.prompt for t in runs], [{"trajectory": t} for t in runs]

    def refusal(self, runs: Sequence[Trajectory]) -> str | None:
        """``None``: no endpoint refuses an engine run."""
        return None

    def sums(self, runs: Sequence[Trajectory]) -> Counter:
        """:func:`~trl_agentic.rollout.metrics.rollout_sums`."""
        return rollout_sums(runs)

    def metrics(self, sums: Counter) -> dict[str, float]:
        """``agentic/*`` (:func:`~trl_agentic.rollout.metrics.metrics_from_sums`)."""
        return metrics_from_sums(sums)

    def close(self) -> None:
        """Nothing to release: each episode's environments are closed when it ends."""


class TRLToolsSeam(EngineSeam):
    """TRL's ``tools=`` / ``environment_factory=`` (:class:`~trl_agentic.environments.trl_environments.
    TRLEnvironments`) through the engine, as TRL 1.16 runs them: the rows' ``environment`` names are checked before
    the batch, a row without a prompt gets one empty user message (``reset()`` writes the task), reward functions
    also receive ``environments`` (each run's instance, TRL's ``trainer.environments``), and TRL's tool metrics
    (``tools/*``) are logged whenever there are tools.

    Args:
        engine: The engine, built once, over ``source``.
        source: TRL's tools and environment factories.
        prompt_column: The column that holds each row's prompt.
    """

    reward_fields = ("trajectory", "environments")

    def __init__(self, engine: RolloutEngine, source: TRLEnvironments, prompt_column: str = "prompt") -> None:
        super().__init__(engine, prompt_column)
        self.source = source
        self.tools = source.all_tools()
        self.tools_on_training_thread = source.tool_options["sync_tools_on_caller_thread"]

    def run(self, rows: Sequence[dict[str, Any]]) -> Runs:
        """One engine episode per row, each with its own environment (TRL's check of the rows first); the
        environments' instances."""
        self.source.check_rows(rows)
        envs = [self.source() for _ in rows]
        prompts = copy.deepcopy([row.get(self.prompt_column, EMPTY_PROMPT) for row in rows])
        runs = self.engine.run(prompts, [dict(row) for row in rows], environments=envs)
        return runs, [env.instance for env in envs]

    def reward_inputs(self, rows: Sequence[dict[str, Any]], runs: Sequence[Trajectory],
                      environments: Sequence[Any] | None) -> tuple[list[Any], list[dict[str, Any]]]:
        """Each run's prompt (the reset text appended), ``trajectory`` and ``environments`` (its instance)."""
        prompts, extras = super().reward_inputs(rows, runs, environments)
        return prompts, [{**extra, "environments": instance} for extra, instance in zip(extras, environments)]

    def metrics(self, sums: Counter) -> dict[str, float]:
        """``agentic/*`` and, with tools, TRL's ``tools/*`` (:func:`~trl_agentic.rollout.metrics.trl_tool_metrics`)."""
        metrics = super().metrics(sums)
        if self.tools:
            metrics.update(trl_tool_metrics(sums))
        return metrics
