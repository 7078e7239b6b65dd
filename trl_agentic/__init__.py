"""trl-agentic: agentic RL on top of Hugging Face TRL.

The top level holds what a user types to train an agent: the trainers and their configs, the environment protocol
(``Environment``, ``StepResult``, ``TagEnvironment``, ``TagProtocol``) and rollouts (``Trajectory``,
``RolloutConfig``, ``run_rollouts``). Everything else is imported by its module path: tools from
``trl_agentic.tools``, rewards from ``trl_agentic.rewards``, SFT from ``trl_agentic.sft``, tasks from
``trl_agentic.tasks``, ``trl_agentic.evaluate``, ``trl_agentic.render``, ``trl_agentic.algorithms``.

Names are imported lazily so that ``import trl_agentic`` (and ``import trl_agentic.tools``) stays light and never
imports an optional extra.
"""

from __future__ import annotations

import importlib
from typing import Any

from .quiet import silence_unactionable

silence_unactionable()  # before TRL, transformers and bitsandbytes are imported: trl_agentic/quiet.py

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # the trainers and their configs
    "AgenticGRPOTrainer": "trl_agentic.trainers.grpo",
    "AgenticGRPOConfig": "trl_agentic.trainers.grpo",
    "AgenticPPOTrainer": "trl_agentic.trainers.ppo",
    "AgenticPPOConfig": "trl_agentic.trainers.ppo",
    # environments
    "Environment": "trl_agentic.environments.base",
    "StepResult": "trl_agentic.environments.base",
    "TagEnvironment": "trl_agentic.environments.tag_environment",
    "TagProtocol": "trl_agentic.environments.tag_protocol",
    # rollouts
    "Trajectory": "trl_agentic.trajectory",
    "RolloutConfig": "trl_agentic.rollout.config",
    "run_rollouts": "trl_agentic.rollouts",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trl_agentic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
