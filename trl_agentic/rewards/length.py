"""Length shaping: penalties in [-1, 0] on the number of turns or of agent tokens.

* Linear: ``r(L) = -min(1, max(0, L - target) / window)``, 0 up to ``target`` and -1 from ``target + window``.
* Sigmoid: ``r(L) = -1 / (1 + exp(-(L - target) / scale))``, a smooth step that is -0.5 at ``target``.
* Overlong soft punishment (DAPO, Yu et al. 2025, arXiv 2503.14476, "overlong reward shaping"), with budget
  ``L_max`` and its last ``L_cache`` tokens as the soft zone::

      r(L) = 0                                   if L <= L_max - L_cache
             ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
             -1                                  if L > L_max

Token length counts only the tokens the model sampled: ``sum(trajectory.env_mask)`` when a trajectory is present,
else ``sum(env_mask)`` when the trainer passes an ``env_mask`` keyword (TRL does so for a ``rollout_func`` that
returns one while tools are set). Observation tokens never count (counting them triggers false overlong penalties,
OpenRLHF #1252). Otherwise the length is ``len(completion_ids)``, exact for single-turn completions; when a chat
completion holds tool messages (TRL's own tool loop) those ids include the tool output, and a warning says so once.
Turns: ``trajectory.num_turns``; else the number of assistant messages; else, for text, the number of observation
blocks plus one.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import partial
from typing import Literal

from ..environments.tag_protocol import ANY_TOOL_TAGS, TagProtocol
from .base import RewardFunction, Sample
from .text import find_blocks


def linear_length_penalty(length: float, target: float, window: float) -> float:
    """``-min(1, max(0, length - target) / window)``."""
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    return -min(1.0, max(0.0, length - target) / window)


def sigmoid_length_penalty(length: float, target: float, scale: float) -> float:
    """``-1 / (1 + exp(-(length - target) / scale))``."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    z = (length - target) / scale
    return -1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


def overlong_penalty(length: float, max_length: float, cache_length: float) -> float:
    """DAPO's overlong soft punishment (arXiv 2503.14476): 0 up to ``max_length - cache_length``, then linear down
    to -1 at ``max_length``, -1 beyond."""
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length <= max_length, got {cache_length}, {max_length}")
    soft_start = max_length - cache_length
    if length <= soft_start:
        return 0.0
    if length <= max_length:
        return (soft_start - length) / cache_length
    return -1.0


class LengthPenalty(RewardFunction):
    """A length penalty as a reward function; build it with :meth:`linear`, :meth:`sigmoid` or :meth:`overlong`.

    Args:
        penalty: Maps a length to a reward.
        unit: ``"tokens"`` (agent tokens only) or ``"turns"``.
        protocol: The tag protocol, whose observation tags count turns in plain text.
        name: ``__name__`` (metric name in TRL).
    """

    def __init__(
        self,
        penalty: Callable[[float], float],
        unit: Literal["tokens", "turns"] = "tokens",
        protocol: TagProtocol = ANY_TOOL_TAGS,
        name: str = "length_penalty",
    ) -> None:
        if unit not in ("tokens", "turns"):
            raise ValueError(f"unit must be 'tokens' or 'turns', got {unit!r}")
        super().__init__(name)
        self.penalty = penalty
        self.unit = unit
        self.protocol = protocol
        self._warned = False

    @classmethod
    def linear(cls, target: float, window: float, unit: Literal["tokens", "turns"] = "tokens",
               name: str = "length_penalty") -> LengthPenalty:
        """Linear penalty beyond ``target`` reaching -1 at ``target + window``."""
        linear_length_penalty(0, target, window)  # validate
        return cls(partial(linear_length_penalty, target=target, window=window), unit, name=name)

    @classmethod
    def sigmoid(cls, target: float, scale: float, unit: Literal["tokens", "turns"] = "tokens",
                name: str = "length_penalty") -> LengthPenalty:
        """Sigmoid penalty centred on ``target``."""
        sigmoid_length_penalty(0, target, scale)  # validate
        return cls(partial(sigmoid_length_penalty, target=target, scale=scale), unit, name=name)

    @classmethod
    def overlong(cls, max_length: int, cache_length: int, unit: Literal["tokens", "turns"] = "tokens",
                 name: str = "overlong_penalty") -> LengthPenalty:
        """DAPO overlong soft punishment over the last ``cache_length`` of a ``max_length`` budget."""
        overlong_penalty(0, max_length, cache_length)  # validate
        return cls(partial(overlong_penalty, max_length=max_length, cache_length=cache_length), unit, name=name)

    def length(self, sample: Sample) -> int:
        """The sample's length in ``unit`` (see the module docstring)."""
        trajectory, completion = sample.trajectory, sample.completion
        if self.unit == "turns":
            if trajectory is not None:
                return trajectory.num_turns
            if not isinstance(completion, str):
                return sum(m.get("role", "assistant") == "assistant" for m in completion)
            return 1 + sum(len(find_blocks(completion, tag)) for tag in self.protocol.observation_tags)
        if trajectory is not None:
            return trajectory.num_agent_tokens
        env_mask = sample.columns.get("env_mask")
        if env_mask is not None:
            return int(sum(env_mask))
        if sample.completion_ids is None:
            raise ValueError("token length needs `trajectory` or `completion_ids`")
        if not self._warned and not isinstance(completion, str) and any(m.get("role") == "tool" for m in completion):
            self._warned = True
            warnings.warn(
                f"{self.__name__}: completions contain tool messages but no trajectory; their token count includes "
                "the tool output. Use the trl_agentic trainers (which pass `trajectory`) to count agent tokens only.",
                stacklevel=3,
            )
        return len(sample.completion_ids)

    def score(self, sample: Sample) -> float:
        return self.penalty(self.length(sample))
