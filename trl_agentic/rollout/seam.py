"""The rollout seam: dataset rows in; the runs, the rows the loss trains on and what the reward functions receive
out. Every kind of rollout the library runs is one implementation, chosen once (at a trainer's construction, or by
``evaluate``: :func:`~trl_agentic.kinds.choice.choose_rollout`):

- :class:`~trl_agentic.rollout.engine_seams.EngineSeam`: our :class:`~trl_agentic.Environment` through the
  engine (:class:`~trl_agentic.rollout.engine.RolloutEngine`);
- :class:`~trl_agentic.rollout.engine_seams.TRLToolsSeam`: TRL's ``tools=`` / ``environment_factory=`` through
  the engine; its environment instances are TRL's ``trainer.environments``;
- :class:`~trl_agentic.agents.seam.AgentSeam`: agents of any framework through the OpenAI-compatible endpoint
  (:class:`~trl_agentic.agents.runner.AgentRollout`).

The trainers and ``evaluate`` make the same calls whatever the kind: :meth:`RolloutSeam.run`, then
:meth:`RolloutSeam.reward_inputs` on what it returned; each run's training rows are
:meth:`~trl_agentic.Trajectory.training_rows` (the run itself for an engine run; an agent run's segments, one per
conversation the agent sent). What differs between kinds is in the values or in the implementation, never a test of
the kind in the caller.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..trajectory import Trajectory

Runs = tuple[list[Trajectory], list[Any] | None]
"""What :meth:`RolloutSeam.run` returns: one run per row, in the rows' order, and TRL's ``trainer.environments``
(each run's environment instance for TRL's ``environment_factory``; ``None``, TRL's value, without one)."""


class RolloutSeam(Protocol):
    """One kind of rollout (module docstring).

    Attributes:
        eos_token_ids: Every id that ends a model turn (the mask audit's end ids).
        tools: TRL's ``trainer.tools``: the tools TRL's own loop would hold (``[]``, TRL's value, without TRL's
            ``tools=`` / ``environment_factory=``).
        reward_fields: The keyword arguments the rollout adds for the reward functions (:meth:`reward_inputs`),
            checked against their signatures before training.
        tools_on_training_thread: Whether sync tools must run on the thread that runs the rollout (TRL's ``tools=``
            / ``environment_factory=`` without ``concurrent_sync_tools``), which rollouts ahead of training cannot
            offer.
        trained_seats: The seats of a game with several seats that the runs train, each run one seat's trajectory
            (``Trajectory.seat``; :mod:`~trl_agentic.rollout.seats`): GRPO compares a run with runs of its own seat.
            ``()`` for every other kind.
    """

    eos_token_ids: list[int]
    tools: list[Callable[..., Any]]
    reward_fields: tuple[str, ...]
    tools_on_training_thread: bool
    trained_seats: tuple[str, ...]

    def run(self, rows: Sequence[dict[str, Any]]) -> Runs:
        """One run per dataset row (each row's columns reach the environment's ``reset`` or the agent)."""
        ...

    def reward_inputs(self, rows: Sequence[dict[str, Any]], runs: Sequence[Trajectory],
                      environments: Sequence[Any] | None) -> tuple[list[Any], list[dict[str, Any]]]:
        """Per run of :meth:`run`: the ``prompts`` its reward functions receive (the prompt with the text
        ``reset()`` returned, as TRL appends it; an agent's row prompt, what it was given), and the keyword arguments
        the rollout adds to its row's columns: ``trajectory`` (every kind), ``environments`` (TRL's environment
        instance), ``agent_output`` (what the agent returned)."""
        ...

    def refusal(self, runs: Sequence[Trajectory]) -> str | None:
        """The message of a request the rollout's endpoint refused among ``runs`` (agents), else ``None``."""
        ...

    def sums(self, runs: Sequence[Trajectory]) -> Counter:
        """This process's counts over its runs that the kind's metrics are computed from (summable over
        processes): :func:`~trl_agentic.rollout.metrics.rollout_sums`' (``count``, the number of runs;
        ``reached_model``, those with a model turn; ...) and the kind's own, ``refused`` among them (requests its
        endpoint refused; absent: none)."""
        ...

    def metrics(self, sums: Counter) -> dict[str, float]:
        """The kind's metrics from :meth:`sums` summed over every process."""
        ...

    def close(self) -> None:
        """Release what the rollout holds between batches (the agents' endpoint)."""
        ...
