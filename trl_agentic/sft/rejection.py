"""Rejection sampling: the model's own trajectories that a verifier accepts, as SFT data.

RFT (Yuan et al. 2023, arXiv 2308.01825) and STaR's filter (Zelikman et al. 2022, arXiv 2203.14465): sample ``n``
trajectories per prompt, keep those whose reward ``r`` satisfies ``r >= success_threshold``, fine-tune on them. The
loop over rounds (sample, then ``SFTTrainer``) is the recipe ``recipes/rft.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..environments.base import EnvironmentFactory
from ..evaluate import EvaluationReport, evaluate
from ..trajectory import Trajectory

__all__ = ["RejectionSample", "rejection_sampling"]


@dataclass
class RejectionSample:
    """What :func:`rejection_sampling` kept.

    Attributes:
        trajectories: The accepted trajectories (at most ``max_per_row`` distinct ones per row), row-major.
        rows: The dataset row of each accepted trajectory.
        report: The evaluation report of all samples (``accuracy``: the acceptance rate).
    """

    trajectories: list[Trajectory]
    rows: list[dict[str, Any]]
    report: EvaluationReport


def rejection_sampling(
    model: Any,
    processing_class: Any,
    environment: EnvironmentFactory | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    reward_funcs: Any = None,
    *,
    samples_per_row: int = 4,
    success_threshold: float = 1.0,
    max_per_row: int | None = 1,
    **evaluate_kwargs: Any,
) -> RejectionSample:
    """Sample ``samples_per_row`` trajectories per row with the engine the trainers use, score them with TRL reward
    functions, and keep those whose reward is at least ``success_threshold``. Trajectories whose environment failed
    are never kept; identical completions of one row are kept once; at most ``max_per_row`` per row (``None``: all).

    What is rolled out is given as the trainers take it: ``environment=``, or by name ``environment_factory=``,
    ``tools=`` or ``agent=`` (:func:`~trl_agentic.evaluate.evaluate`). Sampling uses the model's generation config
    with ``do_sample=True`` (pass ``generation_config=`` to set the temperature). ``evaluate_kwargs`` go to
    :func:`~trl_agentic.evaluate.evaluate` (the rollout arguments, ``reward_weights``, ``batch_size``, ``config`` or
    :class:`~trl_agentic.rollout.engine.RolloutConfig` fields, ``generator``, ``show_progress``, ...).
    """
    report, trajectories = evaluate(model, processing_class, environment, rows, reward_funcs,
                                    samples_per_row=samples_per_row, success_threshold=success_threshold, greedy=False,
                                    **evaluate_kwargs)
    rows = list(rows or [])
    kept, kept_rows = [], []
    for i, row in enumerate(rows):
        seen: set[tuple[int, ...]] = set()
        for j in range(i * samples_per_row, (i + 1) * samples_per_row):
            t, reward = trajectories[j], report.rewards[j]
            key = tuple(t.completion_ids)
            if reward is None or reward < success_threshold or t.env_failed or key in seen:
                continue
            if max_per_row is not None and len(seen) >= max_per_row:
                break
            seen.add(key)
            kept.append(t)
            kept_rows.append(dict(row))
    return RejectionSample(kept, kept_rows, report)
