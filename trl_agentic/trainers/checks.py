"""Stop a run that turns out to train on nothing, and read a trainer's arguments as TRL binds them.

What only training can show (the environment fails on every row, a reward returns ``None`` for everything) is
watched by :class:`DegenerateStepMonitor`: ``max_degenerate_steps`` generation rounds in a row in which no
completion can be scored stop the run with :class:`DegenerateTrainingError`; so does, at once, a round of agents
whose every request the endpoint refused (:meth:`DegenerateStepMonitor.observe_refusals`). What can be refused
before training is in :mod:`trl_agentic.kinds.checks`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any


class DegenerateTrainingError(RuntimeError):
    """Training stopped: no completion could be scored for ``max_degenerate_steps`` rounds in a row."""

class DegenerateStepMonitor:
    """Counts generation rounds in a row in which no completion of the (global) batch could be scored: every
    trajectory ended ``env_error``/``env_timeout`` or every reward function returned ``None``. Such a round has
    every advantage 0 and trains nothing; ``max_steps`` of them in a row stop the run (``0`` never stops it)."""

    def __init__(self, max_steps: int, trajectory_dir: str | None) -> None:
        self.max_steps = max_steps
        self.trajectory_dir = trajectory_dir
        self.in_a_row = 0

    def observe(self, unscorable: Sequence[bool], trajectories: Sequence[Any]) -> str | None:
        """Count one round; return the error message when the run must stop, else ``None``.

        Args:
            unscorable: Per completion of the global batch, whether no reward function could score it.
            trajectories: This process's trajectories (their ``error`` is quoted).
        """
        if not unscorable or not all(unscorable):
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        if self.max_steps <= 0 or self.in_a_row < self.max_steps:
            return None
        failed = [t for t in trajectories if getattr(t, "env_failed", False)]
        if failed:
            cause = f"every trajectory ended {failed[0].stop_reason}; the first error: {failed[0].error or '(none)'}"
        else:
            cause = ("every reward function returned None (or raised) for every completion; their warnings above "
                     "say why")
        where = (f"the trajectories are in {self.trajectory_dir}/trajectories-rank*.jsonl" if self.trajectory_dir
                 else "set trajectory_dir= to keep the trajectories")
        return (f"stopped after {self.in_a_row} generation rounds in a row in which no completion could be scored "
                f"({cause}); {where}; max_degenerate_steps=0 turns this check off")


    def observe_refusals(self, model_calls: int, refused: int, first_refusal: str | None) -> str | None:
        """A round of agents (counts over all processes) in which no request reached the model and the endpoint
        refused some (400: e.g. tools with a chat template that has no response template, or a request it does not
        serve) trains nothing, and every later round would be refused alike: return the error message that stops
        the run now, else ``None`` (``max_degenerate_steps=0`` never stops it).

        Args:
            model_calls: Model calls the round's agents made.
            refused: Requests the endpoint refused.
            first_refusal: The endpoint's message for one of them, when this process has one.
        """
        if self.max_steps <= 0 or model_calls or not refused:
            return None
        return (f"stopped at the first generation round: the endpoint refused every request of every agent ({refused}"
                f" answered 400, none reached the model), e.g. {first_refusal or '(on another process)'}; fix that and "
                "run again (max_degenerate_steps=0 turns this check off)")

def keyword_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``GRPOTrainer(*args, **kwargs)``, all by name (``model``, ``reward_funcs``, ``args``, ...).

    Bound against TRL's own class, the one our boundary subclasses, not ``trl.GRPOTrainer`` looked up now: a user
    who runs TRL's script (``trl/scripts/grpo.py`` builds whatever ``trl.GRPOTrainer`` names) with
    ``trl.GRPOTrainer = AgenticGRPOTrainer`` would otherwise bind against our ``(*args, **kwargs)``."""
    from ..compat import GRPOTrainerBoundary

    (trl_trainer,) = GRPOTrainerBoundary.__bases__
    bound = inspect.signature(trl_trainer.__init__).bind_partial(None, *args, **kwargs).arguments
    return {name: value for name, value in bound.items() if name != "self"}
