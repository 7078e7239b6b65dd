"""Reward functions for agentic RL, each a TRL reward function ``func(prompts, completions, **kwargs)``.

* Outcome verifiers: :class:`MathAnswerReward` (math-verify), :class:`QAReward` (exact match / token F1),
  :class:`SearchR1Reward` (Search-R1 v0.3's EM + format table), :class:`CodeTestsReward` (unit tests in the
  Python sandbox).
* Shaping: :class:`FormatReward` (tag protocol), :class:`ToolUseReward` (ToolRL-style), :class:`LengthPenalty`
  (linear, sigmoid, DAPO overlong), :class:`TurnReward` (environment turn rewards).
* Composition: :class:`CompositeReward` of weighted, capped :class:`Component` terms, weight schedules, and
  :func:`progressive_reward`.

Nothing here imports an optional extra at import time (math-verify is imported on first use).
"""

from ..environments.tag_protocol import RETOOL_TAGS, SEARCH_R1_TAGS, TagProtocol
from .base import OBSERVATION_TAGS, RewardFunc, RewardFunction, Sample, make_samples
from .composite import Component, CompositeReward, progressive_reward
from .format import FormatReport, FormatReward, ProtocolFormatReward, check_format
from .length import LengthPenalty, linear_length_penalty, overlong_penalty, sigmoid_length_penalty
from .schedules import (
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    PiecewiseSchedule,
    Schedule,
    training_progress,
)
from .search_r1 import SearchR1Reward
from .tool_use import ToolCall, ToolUseReward, extract_tool_calls
from .turns import TurnReward, aggregate_turn_rewards
from .verifiers import (
    CodeTestsReward,
    MathAnswerReward,
    QAReward,
    exact_match,
    extract_answer,
    extract_gold,
    extract_program,
    math_equal,
    normalize_answer,
    token_f1,
)

__all__ = [
    "OBSERVATION_TAGS",
    "RETOOL_TAGS",
    "SEARCH_R1_TAGS",
    "CodeTestsReward",
    "Component",
    "CompositeReward",
    "ConstantSchedule",
    "CosineSchedule",
    "FormatReport",
    "FormatReward",
    "LengthPenalty",
    "LinearSchedule",
    "MathAnswerReward",
    "PiecewiseSchedule",
    "ProtocolFormatReward",
    "QAReward",
    "RewardFunc",
    "RewardFunction",
    "Sample",
    "Schedule",
    "SearchR1Reward",
    "TagProtocol",
    "ToolCall",
    "ToolUseReward",
    "TurnReward",
    "aggregate_turn_rewards",
    "check_format",
    "exact_match",
    "extract_answer",
    "extract_gold",
    "extract_program",
    "extract_tool_calls",
    "linear_length_penalty",
    "make_samples",
    "math_equal",
    "normalize_answer",
    "overlong_penalty",
    "progressive_reward",
    "sigmoid_length_penalty",
    "token_f1",
    "training_progress",
]
