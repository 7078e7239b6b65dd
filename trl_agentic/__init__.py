"""trl-agentic: agentic RL on top of Hugging Face TRL.

Names are imported lazily so that ``import trl_agentic`` (and ``import trl_agentic.tools``) stays light and never
imports an optional extra.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Environment": "trl_agentic.environment",
    "StepResult": "trl_agentic.environment",
    "Trajectory": "trl_agentic.trajectory",
    "save_trajectories": "trl_agentic.trajectory",
    "load_trajectories": "trl_agentic.trajectory",
    "TagEnvironment": "trl_agentic.tag_environment",
    "run_rollouts": "trl_agentic.rollout.engine",
    "RolloutConfig": "trl_agentic.rollout.engine",
    "RolloutEngine": "trl_agentic.rollout.engine",
    "HFGenerator": "trl_agentic.rollout.generation",
    "kl_penalty": "trl_agentic.algorithms.kl",
    "AgenticGRPOTrainer": "trl_agentic.trainers.grpo",
    "AgenticGRPOConfig": "trl_agentic.trainers.grpo",
    "AgenticPPOTrainer": "trl_agentic.trainers.ppo",
    "AgenticPPOConfig": "trl_agentic.trainers.ppo",
    "ValueModel": "trl_agentic.critic",
    "SharedValueHead": "trl_agentic.critic",
    "render_html": "trl_agentic.render",
    "TagProtocol": "trl_agentic.tag_protocol",
    # SFT warm start, rejection sampling
    "sft_dataset": "trl_agentic.sft",
    "trajectory_to_sft_example": "trl_agentic.sft",
    "transcript_to_trajectory": "trl_agentic.sft",
    "demonstration_to_trajectory": "trl_agentic.sft",
    "DemonstrationError": "trl_agentic.sft",
    "rejection_sampling": "trl_agentic.sft",
    # tools
    "PythonSandbox": "trl_agentic.tools",
    "E2BSandbox": "trl_agentic.tools",
    "Calculator": "trl_agentic.tools",
    "SearchTool": "trl_agentic.tools",
    "BM25Retriever": "trl_agentic.tools",
    "DenseRetriever": "trl_agentic.tools",
    "RetrievalClient": "trl_agentic.tools",
    "RetrievalServer": "trl_agentic.tools",
    # rewards
    "CompositeReward": "trl_agentic.rewards",
    "Component": "trl_agentic.rewards",
    "MathAnswerReward": "trl_agentic.rewards",
    "QAReward": "trl_agentic.rewards",
    "CodeTestsReward": "trl_agentic.rewards",
    "FormatReward": "trl_agentic.rewards",
    "SearchR1Reward": "trl_agentic.rewards",
    "ToolUseReward": "trl_agentic.rewards",
    "LengthPenalty": "trl_agentic.rewards",
    "TurnReward": "trl_agentic.rewards",
    "progressive_reward": "trl_agentic.rewards",
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
