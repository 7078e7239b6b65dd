"""The TRL reward-function contract, and the per-completion view (:class:`Sample`) the rewards score.

TRL calls a reward function as ``func(prompts=..., completions=..., completion_ids=..., **kwargs)`` where the
keyword arguments hold every dataset column as a list (one value per completion), ``trainer_state``,
``log_metric`` and ``log_extra``; the trainers of this package add ``trajectory`` (one
:class:`~trl_agentic.trajectory.Trajectory` per completion). A completion is a string for text prompts, or a list
of chat messages for conversational prompts. :class:`RewardFunction` turns that batch into one :class:`Sample` per
completion and scores each.
"""

from __future__ import annotations

import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..environments.tag_protocol import ANY_TOOL_TAGS
from .text import strip_blocks

if TYPE_CHECKING:
    from ..trajectory import Trajectory

logger = logging.getLogger(__name__)

RewardFunc = Callable[..., list[float | None]]
"""A TRL reward function: ``func(prompts, completions, **kwargs) -> list[float | None]``."""

OBSERVATION_TAGS: tuple[str, ...] = ANY_TOOL_TAGS.observation_tags
"""Tags that wrap observations in the text protocols (Search-R1 ``<information>``, ReTool ``<interpreter>``)."""

# Keyword arguments TRL / our trainers pass that are not dataset columns.
_NON_COLUMNS = frozenset(
    {"prompts", "completions", "completion_ids", "trajectory", "trainer_state", "log_metric", "log_extra",
     "environments"}
)


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # Multimodal content blocks: keep the text parts.
    return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))


def is_text_completion(completion: Any) -> bool:
    """Whether ``completion`` is what TRL gives reward functions: text, or a list of messages (mappings)."""
    if isinstance(completion, str):
        return True
    return isinstance(completion, Sequence) and all(isinstance(m, Mapping) for m in completion)


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The whole completion as text: the string itself, or the contents of all its messages joined by newlines."""
    if isinstance(completion, str):
        return completion
    return "\n".join(_message_text(m) for m in completion)


def assistant_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The model's part of a completion: the string itself, or the contents of its assistant messages only."""
    if isinstance(completion, str):
        return completion
    return "\n".join(_message_text(m) for m in completion if m.get("role", "assistant") == "assistant")


def golds_as_list(value: Any) -> list[str]:
    """Gold answers as a list of strings: a string, a number, a sequence (list, tuple, numpy array) or a Search-R1
    ``{"target": [...]}`` mapping; ``None`` gives an empty list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return golds_as_list(value.get("target"))
    if isinstance(value, Iterable):
        return [str(v) for v in value]
    return [str(value)]


@dataclass(frozen=True)
class Sample:
    """One completion with everything a reward may read.

    Attributes:
        prompt: The prompt (text or chat messages).
        completion: The completion as TRL passes it (text or chat messages).
        completion_ids: Completion token ids, when given.
        trajectory: The rollout, when the trainer passed ``trajectory`` (our trainers); ``None`` under plain TRL.
        columns: This completion's value of every dataset column.
    """

    prompt: Any
    completion: Any
    completion_ids: Sequence[int] | None
    trajectory: Trajectory | None
    columns: Mapping[str, Any]

    @property
    def text(self) -> str:
        """Model text and observations, in order: the actions interleaved with the observations when a trajectory
        is present, else the completion text."""
        if self.trajectory is None:
            return completion_text(self.completion)
        pairs = itertools.zip_longest(self.trajectory.actions, self.trajectory.observations, fillvalue=None)
        return "".join((action or "") + (observation or "") for action, observation in pairs)

    def model_text(self, observation_tags: Iterable[str] = OBSERVATION_TAGS) -> str:
        """The text the model wrote, without observations: ``"".join(trajectory.actions)`` when a trajectory is
        present; otherwise the completion's (assistant) text with every ``observation_tags`` block removed, so that
        an answer quoted inside an observation never counts as the model's."""
        if self.trajectory is not None:
            return "".join(self.trajectory.actions)
        return strip_blocks(assistant_text(self.completion), observation_tags)

    def column(self, names: str | Sequence[str]) -> Any:
        """The value of the first of ``names`` present among the dataset columns (``KeyError`` naming the columns
        when none is)."""
        candidates = [names] if isinstance(names, str) else list(names)
        for name in candidates:
            if name in self.columns:
                return self.columns[name]
        raise KeyError(f"none of the dataset columns {candidates} was passed to the reward function; "
                       f"available columns: {sorted(self.columns)}")


def make_samples(prompts: Sequence[Any], completions: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Sample]:
    """Split a TRL reward call into one :class:`Sample` per completion."""
    n = len(completions)
    trajectories = kwargs.get("trajectory") or [None] * n
    completion_ids = kwargs.get("completion_ids") or [None] * n
    if len(trajectories) != n:
        raise ValueError(f"got {len(trajectories)} trajectories for {n} completions")
    columns = {
        key: value for key, value in kwargs.items()
        if key not in _NON_COLUMNS and isinstance(value, Sequence) and not isinstance(value, str) and len(value) == n
    }
    prompts = list(prompts) if prompts is not None else [None] * n
    return [
        Sample(
            prompt=prompts[i],
            completion=completions[i],
            completion_ids=completion_ids[i],
            trajectory=trajectories[i],
            columns={key: value[i] for key, value in columns.items()},
        )
        for i in range(n)
    ]


class RewardFunction(ABC):
    """Base class of the reward functions here: a picklable callable with TRL's signature and a ``__name__``
    (TRL names its ``rewards/<name>`` metrics after it). Subclasses implement :meth:`score` for one sample."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        """One reward per completion (:meth:`score`); a completion that is neither text nor a list of messages (a
        list of ids, a dict, ``None``) scores 0.0, named in one warning per call."""
        samples = make_samples(prompts, completions, kwargs)
        rewards = [self.score(s) if is_text_completion(s.completion) else 0.0 for s in samples]
        odd = [s.completion for s in samples if not is_text_completion(s.completion)]
        if odd:
            example = repr(odd[0])
            example = example if len(example) <= 60 else example[:57] + "..."
            kinds = ", ".join(sorted({type(c).__name__ for c in odd}))
            logger.warning("%s scored %d of %d completions 0.0: they are not text or a list of messages (%s; e.g. "
                           "%s)", self.__name__, len(odd), len(samples), kinds, example)
        return rewards

    @abstractmethod
    def score(self, sample: Sample) -> float | None:
        """The reward of one completion (``None``: not applicable, which TRL treats as NaN and skips)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.__name__!r})"
