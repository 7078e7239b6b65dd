"""Weight schedules over training: a schedule maps ``(step, max_steps)`` to a weight.

The step is ``trainer_state.global_step`` and ``max_steps`` is ``trainer_state.max_steps``
(:func:`training_progress`). Boundaries are given as a fraction of training (``unit="fraction"``, position
``t = step / max_steps``) or in optimizer steps (``unit="steps"``, position ``t = step``). Between ``begin`` and
``until``, with ``u = (t - begin) / (until - begin)`` clamped to [0, 1]:

* :class:`LinearSchedule`: ``w = start + (end - start) * u``;
* :class:`CosineSchedule`: ``w = end + (start - end) * (1 + cos(pi * u)) / 2`` (half cosine, flat at both ends);
* :class:`PiecewiseSchedule`: ``w = values[i]`` where ``i`` is the number of boundaries ``<= t``;
* :class:`ConstantSchedule`: ``w = value``.
"""

from __future__ import annotations

import bisect
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Unit = Literal["fraction", "steps"]


def training_progress(trainer_state: Any) -> tuple[int, int]:
    """``(global_step, max_steps)`` from a transformers ``TrainerState``; ``(0, 0)`` when there is none (a reward
    called outside training is evaluated at the start of its schedules)."""
    if trainer_state is None:
        return 0, 0
    return int(trainer_state.global_step), int(trainer_state.max_steps)


def _position(step: int, max_steps: int, unit: Unit) -> float:
    if unit == "steps":
        return float(step)
    if unit == "fraction":
        return step / max_steps if max_steps > 0 else 0.0
    raise ValueError(f"unit must be 'fraction' or 'steps', got {unit!r}")


def _check_finite(**weights: Any) -> None:
    """A NaN or infinite weight would make every total NaN (or infinite): refuse it."""
    for name, value in weights.items():
        values = list(value) if isinstance(value, Sequence) else [value]
        if any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) for v in values):
            raise ValueError(f"{name} must be finite numbers, got {value!r}")


class Schedule(ABC):
    """A weight as a function of the training step."""

    @abstractmethod
    def __call__(self, step: int, max_steps: int) -> float:
        """The weight at ``step`` of ``max_steps``."""

    def complement(self) -> Schedule:
        """The schedule ``1 - self``."""
        return _Complement(self)


@dataclass(frozen=True)
class _Complement(Schedule):
    schedule: Schedule

    def __call__(self, step: int, max_steps: int) -> float:
        return 1.0 - self.schedule(step, max_steps)


@dataclass(frozen=True)
class ConstantSchedule(Schedule):
    """``w = value``."""

    value: float

    def __post_init__(self) -> None:
        _check_finite(weight=self.value)
        object.__setattr__(self, "value", float(self.value))

    def __call__(self, step: int, max_steps: int) -> float:
        return self.value


@dataclass(frozen=True)
class _Ramp(Schedule):
    start: float = 0.0
    end: float = 1.0
    begin: float = 0.0
    until: float = 1.0
    unit: Unit = "fraction"

    def __post_init__(self) -> None:
        _position(0, 1, self.unit)  # validate the unit
        _check_finite(start=self.start, end=self.end, begin=self.begin, until=self.until)
        if self.until <= self.begin:
            raise ValueError(f"need begin < until, got {self.begin}, {self.until}")

    def _progress(self, step: int, max_steps: int) -> float:
        t = _position(step, max_steps, self.unit)
        return min(1.0, max(0.0, (t - self.begin) / (self.until - self.begin)))


class LinearSchedule(_Ramp):
    """Linear ramp from ``start`` (at ``begin``) to ``end`` (at ``until``), constant outside."""

    def __call__(self, step: int, max_steps: int) -> float:
        return self.start + (self.end - self.start) * self._progress(step, max_steps)


class CosineSchedule(_Ramp):
    """Half-cosine ramp from ``start`` (at ``begin``) to ``end`` (at ``until``), constant outside."""

    def __call__(self, step: int, max_steps: int) -> float:
        u = self._progress(step, max_steps)
        return self.end + (self.start - self.end) * (1 + math.cos(math.pi * u)) / 2


@dataclass(frozen=True)
class PiecewiseSchedule(Schedule):
    """Step-wise constant: ``values[0]`` before ``boundaries[0]``, ``values[i]`` from ``boundaries[i-1]`` on.

    Example: ``PiecewiseSchedule([0.3, 0.7], [1.0, 0.5, 0.0])`` is 1.0 for the first 30% of training, 0.5 until
    70%, then 0.0.
    """

    boundaries: Sequence[float]
    values: Sequence[float]
    unit: Unit = "fraction"

    def __post_init__(self) -> None:
        _position(0, 1, self.unit)  # validate the unit
        _check_finite(values=self.values, boundaries=self.boundaries)
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError("need exactly one more value than boundaries")
        if list(self.boundaries) != sorted(self.boundaries):
            raise ValueError("boundaries must be increasing")

    def __call__(self, step: int, max_steps: int) -> float:
        return self.values[bisect.bisect_right(self.boundaries, _position(step, max_steps, self.unit))]


def as_schedule(weight: float | Schedule) -> Schedule:
    """A constant weight as a :class:`ConstantSchedule`; a schedule unchanged."""
    return weight if isinstance(weight, Schedule) else ConstantSchedule(weight)
