"""What stops a run that turns out to train on nothing, and a trainer's arguments read as TRL binds them.

What only training can show (the environment fails on every row, a reward returns ``None`` for everything, the
endpoint refuses every request of the agents) stops the run with :class:`DegenerateTrainingError`; the run's health
(:class:`~trl_agentic.trainers.run_health.RunHealth`) decides when. What can be refused before training is in
:mod:`trl_agentic.kinds.checks`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any


class DegenerateTrainingError(RuntimeError):
    """Training stopped: no completion could be scored for ``max_degenerate_steps`` rounds in a row, or the
    endpoint refused every request of a round's agents."""


def keyword_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``GRPOTrainer(*args, **kwargs)``, all by name (``model``, ``reward_funcs``, ``args``, ...).

    Bound against TRL's own class, the one our boundary subclasses, not ``trl.GRPOTrainer`` looked up now: a user
    who runs TRL's script (``trl/scripts/grpo.py`` builds whatever ``trl.GRPOTrainer`` names) with
    ``trl.GRPOTrainer = AgenticGRPOTrainer`` would otherwise bind against our ``(*args, **kwargs)``."""
    from ..compat import GRPOTrainerBoundary

    (trl_trainer,) = GRPOTrainerBoundary.__bases__
    bound = inspect.signature(trl_trainer.__init__).bind_partial(None, *args, **kwargs).arguments
    return {name: value for name, value in bound.items() if name != "self"}
