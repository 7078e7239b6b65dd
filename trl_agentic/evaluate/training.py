"""A recipe's training between two held-out evaluations (:func:`train_between_evaluations`): what the recipes
(``recipes/``) print and write around ``trainer.train()``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from . import evaluate


def train_between_evaluations(trainer: Any, held_out: Sequence[dict[str, Any]], reward_funcs: Any,
                              rollout: dict[str, Any], figures: dict[str, str], summary: dict[str, Any],
                              label: str = "") -> dict[str, Any]:
    """A recipe's training with held-out evaluation on each side: ``evaluate`` on ``held_out`` (greedy, the
    training's rollout settings, the rollout arguments ``rollout`` as the trainer takes them), ``train()``, the same
    evaluation, the model saved to ``output_dir``. Each evaluation prints one line (``label`` then the report's
    summary); ``figures`` maps an :class:`~trl_agentic.evaluate.EvaluationReport` attribute to the name of its
    figure (``{"accuracy": "success"}`` gives ``success_before`` and ``success_after``). Returns ``summary`` with the
    steps trained and the figures, written to ``<output_dir>/summary.json``. Without held-out rows, nothing is
    evaluated."""
    args = trainer.args

    def report(stage: str) -> dict[str, Any]:
        if not held_out:
            return {}
        result, _ = evaluate(trainer.model, trainer.processing_class, rows=held_out, reward_funcs=reward_funcs,
                             greedy=True, show_progress=False, config=args.rollout_config(), **rollout)
        print(f"{stage:<8} {label}{result.summary()}")
        return {f"{name}_{stage}": getattr(result, attribute) for attribute, name in figures.items()}

    before = report("before")
    trainer.train()
    summary = {**summary, "steps": trainer.state.global_step, **before, **report("after")}
    trainer.save_model(args.output_dir)
    with open(os.path.join(args.output_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    return summary

