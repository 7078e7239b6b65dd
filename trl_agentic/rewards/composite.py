"""Weighted composition of reward functions, with per-component caps, schedules and metrics.

For components ``k`` with reward ``r_k``, cap ``[lo_k, hi_k]`` and weight ``w_k(t)`` at training step ``t``::

    R = sum_k w_k(t) * clip(r_k, lo_k, hi_k)

A component returning ``None`` (not applicable) for a completion contributes nothing to it, as in TRL's own
``nansum`` over reward functions; the total is ``None`` only when every component is. A value that is not a finite
number (NaN, inf, a string, ...) counts as ``None`` too (:func:`~trl_agentic.rewards.guard.as_reward`), and the
count is logged as ``<metric_prefix>/<name>/invalid``. Each component is called
once per batch, so each completion is scored once by each component.

A component returns what a TRL reward function may (:func:`~trl_agentic.rewards.guard.reward_values`: a list, a
tuple, a numpy array, a tensor, a generator). A return that is not one value per completion (``None``, a number, a
count other than the batch's) raises a ``ValueError`` naming the component, as a component that raises does: under
our trainers' guard (:class:`~trl_agentic.rewards.guard.GuardedReward`) the batch is then scored one completion at a
time, and the completions the component still fails on are unscorable.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .base import RewardFunc
from .guard import as_reward, invalid_values, reward_values
from .schedules import ConstantSchedule, LinearSchedule, Schedule, as_schedule, training_progress
from .turns import Aggregation, TurnReward

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Component:
    """One term of a :class:`CompositeReward`.

    Attributes:
        name: Metric name (``<metric_prefix>/<name>``), unique within the composite.
        func: A TRL reward function.
        weight: A constant or a :class:`~trl_agentic.rewards.schedules.Schedule` of the training step.
        clip: ``(low, high)`` cap applied before weighting; either bound may be ``None``.
        outcome: Whether this is an outcome (task success) term; the others are shaping.
    """

    name: str
    func: RewardFunc
    weight: float | Schedule = 1.0
    clip: tuple[float | None, float | None] | None = None
    outcome: bool = False

    def capped(self, value: float) -> float:
        if self.clip is None:
            return value
        low, high = self.clip
        if low is not None:
            value = max(value, low)
        if high is not None:
            value = min(value, high)
        return value


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class CompositeReward:
    """A TRL reward function that sums weighted, capped components and logs each one.

    Logging, when TRL passes ``log_metric`` / ``log_extra``: the batch mean of each component (after its cap,
    before weighting) as ``<metric_prefix>/<name>``, the weight of each scheduled component as
    ``<metric_prefix>/<name>/weight``, the mean total as ``<metric_prefix>/total``, and each component's values as a
    column of the completions table.

    Balance check: shaping should not outweigh the outcome. When ``check_balance`` is on, a warning is issued (once)
    the first time the summed ``|weight|`` of the shaping components exceeds that of the outcome components.

    Args:
        components: The terms.
        name: ``__name__`` (TRL's metric name for the total).
        metric_prefix: Prefix of the component metrics.
        check_balance: Warn when shaping outweighs the outcome.
    """

    def __init__(
        self,
        components: Sequence[Component],
        name: str = "composite_reward",
        metric_prefix: str = "reward",
        check_balance: bool = True,
    ) -> None:
        if not components:
            raise ValueError("a CompositeReward needs at least one component")
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique, got {names}")
        self.__name__ = name
        self.components = list(components)
        self.schedules = {}
        for c in self.components:
            try:
                self.schedules[c.name] = as_schedule(c.weight)
            except ValueError as exc:
                raise ValueError(f"component {c.name!r}: {exc}") from None
        self.metric_prefix = metric_prefix
        self.check_balance = check_balance
        self._warned = False

    def weights(self, step: int, max_steps: int) -> dict[str, float]:
        """Each component's weight at ``step`` of ``max_steps``."""
        return {name: schedule(step, max_steps) for name, schedule in self.schedules.items()}

    def _check_balance(self, weights: dict[str, float], step: int) -> None:
        if not self.check_balance or self._warned:
            return
        outcome = sum(abs(weights[c.name]) for c in self.components if c.outcome)
        shaping = sum(abs(weights[c.name]) for c in self.components if not c.outcome)
        if shaping > outcome:
            self._warned = True
            warnings.warn(
                f"{self.__name__}: at step {step} the shaping weights (sum |w| = {shaping:g}) outweigh the outcome "
                f"weights ({outcome:g}); the outcome should carry at least half of the reward, or the policy may "
                "learn the shaping instead of the task.",
                stacklevel=3,
            )

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        step, max_steps = training_progress(kwargs.get("trainer_state"))
        weights = self.weights(step, max_steps)
        self._check_balance(weights, step)
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        log_extra: Callable[[str, list], None] | None = kwargs.get("log_extra")
        totals: list[float | None] = [None] * n
        for component in self.components:
            raw = reward_values(f"composite component {component.name!r}",
                                component.func(prompts=prompts, completions=completions, **kwargs), n)
            clean = [as_reward(v) for v in raw]
            invalid = sum(1 for v, c in zip(raw, clean) if c is None and v is not None)
            message = invalid_values(f"composite component {component.name!r}", raw, clean)
            if message is not None:
                logger.warning("%s", message)
            values = [None if v is None else component.capped(v) for v in clean]
            weight = weights[component.name]
            for i, value in enumerate(values):
                if value is not None:
                    totals[i] = (totals[i] or 0.0) + weight * value
            present = [v for v in values if v is not None]
            if log_metric is not None:
                if invalid:
                    log_metric(f"{self.metric_prefix}/{component.name}/invalid", invalid / n)
                if present:
                    log_metric(f"{self.metric_prefix}/{component.name}", _mean(present))
                if not isinstance(self.schedules[component.name], ConstantSchedule):
                    log_metric(f"{self.metric_prefix}/{component.name}/weight", weight)
            if log_extra is not None:
                log_extra(f"{self.metric_prefix}/{component.name}", values)
        scored = [t for t in totals if t is not None]
        if log_metric is not None and scored:
            log_metric(f"{self.metric_prefix}/total", _mean(scored))
        return totals

    def __repr__(self) -> str:
        return f"CompositeReward(name={self.__name__!r}, components={[c.name for c in self.components]})"


def progressive_reward(
    outcome: RewardFunc,
    alpha: Schedule | None = None,
    turn_aggregation: Aggregation = "mean",
    name: str = "progressive_reward",
) -> CompositeReward:
    """Progressive reward shaping: ``R = alpha(t) * outcome + (1 - alpha(t)) * mean_k r_k`` where ``r_k`` are the
    environment's turn rewards and ``alpha`` rises from 0 to 1 over training (default: linear over the whole run),
    moving the signal from dense step rewards to the sparse outcome. The balance warning is off: early shaping
    dominance is the point.

    Args:
        outcome: The outcome reward function.
        alpha: Weight schedule of the outcome (default ``LinearSchedule(0, 1)``).
        turn_aggregation: How turn rewards are aggregated (default ``"mean"``).
        name: ``__name__`` of the composite.
    """
    alpha = alpha if alpha is not None else LinearSchedule(0.0, 1.0)
    return CompositeReward(
        [
            Component("outcome", outcome, alpha, outcome=True),
            Component("turns", TurnReward(turn_aggregation), alpha.complement()),
        ],
        name=name,
        check_balance=False,
    )
