"""The settings of a rollout, declared once.

:class:`RolloutFields` declares the fields that are not TRL's (budgets per turn, protocol, timeouts), with their
``--help``; the trainers' configs (:class:`~trl_agentic.trainers.config.AgenticConfig`) and the evaluation command line
(:class:`~trl_agentic.evaluate.cli.EvaluateArguments`) inherit them. :class:`RolloutConfig` is what the engine runs
with: those fields plus TRL's ``max_completion_length`` and ``chat_template_kwargs``, validated, every value
resolved. :meth:`RolloutConfig.from_fields` builds it from any object carrying the fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Literal, get_args

from ..environments.base import check_stop_strings
from .observations import RolloutMode

ROLLOUT_MODES: tuple[str, ...] = get_args(RolloutMode)

ROLLOUT_DEFAULTS: dict[str, Any] = {"rollout_mode": "text", "max_turns": 4, "max_tokens_per_turn": 256}
"""The values of the fields left unset (``None``), unless native tool calls imply others
(:func:`native_tool_fields`)."""


def native_tool_fields(trl_tools: bool, max_completion_length: int,
                       max_tool_calling_iterations: int | None = None) -> dict[str, Any]:
    """The rollout fields native tool calls imply where they are left unset: chat rollouts (``rollout_mode``); with
    TRL's ``tools=`` / ``environment_factory=`` (``trl_tools``) also TRL's tool-loop budgets, so that a TRL script
    behaves as in TRL: one turn may use all of ``max_completion_length``, and at most
    ``max_tool_calling_iterations + 1`` model turns (no turn limit when that is unset: the token budget ends the
    rollout)."""
    values: dict[str, Any] = {"rollout_mode": "chat"}
    if trl_tools:
        values["max_tokens_per_turn"] = max_completion_length
        values["max_turns"] = (max_tool_calling_iterations + 1 if max_tool_calling_iterations is not None
                               else max_completion_length)
    return values


@dataclass
class RolloutFields:
    """The rollout settings that are not TRL's. Budgets: ``max_turns`` model turns, ``max_tokens_per_turn`` sampled
    tokens in one turn, ``max_observation_tokens`` of one observation's content; the whole trajectory's budget is
    TRL's ``max_completion_length`` (sampled and observation tokens)."""

    max_turns: int | None = field(
        default=None,
        metadata={"help": "Most model turns per trajectory. Unset: 4, or with TRL's tools=/environment_factory= "
                  "TRL's max_tool_calling_iterations + 1 (no turn limit when that is unset either: the token budget "
                  "ends the rollout)."},
    )
    max_tokens_per_turn: int | None = field(
        default=None,
        metadata={"help": "Most tokens sampled in one turn. Unset: 256, or with TRL's tools=/environment_factory= "
                  "max_completion_length (TRL's tool loop)."},
    )
    rollout_mode: str | None = field(
        default=None,
        metadata={"help": "'text': observations continue the text (base models, Search-R1). 'chat': each "
                  "observation is a new message rendered by the chat template (instruct models). Unset: 'chat' for "
                  "native tool calls (TRL's tools=/environment_factory=, a ToolCallEnvironment), else 'text'."},
    )
    observation_role: str = field(
        default="tool",
        metadata={"help": "Message role of observations in chat mode ('user' for templates without a tool role, "
                  "e.g. Gemma)."},
    )
    stop_strings: list[str] | None = field(
        default=None, metadata={"help": "Extra stop strings (the environment's own are always used)."}
    )
    max_observation_tokens: int = field(
        default=1024, metadata={"help": "Most tokens of one observation's content (the head is kept)."}
    )
    env_timeout: float = field(default=60.0, metadata={"help": "Seconds per environment reset/step/close call."})
    prefix_caching: bool = field(
        default=True,
        metadata={"help": "Keep each trajectory's KV cache across its turns with transformers generation, so that a "
                  "turn prefills only the tokens appended since the last (vLLM: its own enable_prefix_caching). "
                  "False: every turn prefills the whole conversation again, as TRL's tool loop does."},
    )
    max_cached_tokens: int | None = field(
        default=None,
        metadata={"help": "With prefix_caching: most positions the KV cache kept across turns may hold (a position "
                  "shared by several rows counts once; the least recently used go first). Unset: no bound."},
    )
    overlap_chunks: str = field(
        default="auto",
        metadata={"help": "Generate each turn in this many chunks so that one chunk's tool calls run while the next "
                  "generates: 'auto' (two chunks when the first turn's tools took at least a quarter of its "
                  "generation time), 1 (off), or a number."},
    )


@dataclass
class RolloutConfig(RolloutFields):
    """What the engine runs with (:mod:`trl_agentic.rollout.engine`): :class:`RolloutFields`, every unset one given
    its default (:data:`ROLLOUT_DEFAULTS`), plus

    Attributes:
        max_completion_length: Most completion tokens in all (sampled + observation tokens), as in TRL.
        chat_template_kwargs: Passed to ``apply_chat_template`` (``chat_template`` replaces the tokenizer's).

    ``max_tokens_per_turn`` is clamped to ``max_completion_length``; ``overlap_chunks`` is ``"auto"`` or an int.
    """

    max_completion_length: int = 1024
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, default in ROLLOUT_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout_mode must be 'text' or 'chat', got {self.rollout_mode!r}")
        for name in ("max_turns", "max_tokens_per_turn", "max_completion_length", "max_observation_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.max_tokens_per_turn = min(self.max_tokens_per_turn, self.max_completion_length)
        self.stop_strings = tuple(check_stop_strings(self.stop_strings or (), "stop_strings"))
        if isinstance(self.env_timeout, bool) or not isinstance(self.env_timeout, (int, float)) \
                or not self.env_timeout > 0:
            raise ValueError(f"env_timeout must be a positive number of seconds, got {self.env_timeout!r}")
        if self.max_cached_tokens is not None and (isinstance(self.max_cached_tokens, bool)
                                                   or not isinstance(self.max_cached_tokens, int)
                                                   or self.max_cached_tokens < 0):
            raise ValueError(f"max_cached_tokens must be a number of positions >= 0 or None, got "
                             f"{self.max_cached_tokens!r}")
        self.overlap_chunks = _chunks(self.overlap_chunks)

    @classmethod
    def from_fields(cls, source: Any, **values: Any) -> "RolloutConfig":
        """The config of an object carrying :class:`RolloutFields` (a trainer's config, the evaluation CLI's
        arguments) and ``max_completion_length`` / ``chat_template_kwargs``; ``values`` override."""
        names = [f.name for f in dataclass_fields(cls)]
        taken = {name: getattr(source, name) for name in names if hasattr(source, name)}
        taken["chat_template_kwargs"] = dict(taken.get("chat_template_kwargs") or {})
        return cls(**{**taken, **values})

    @classmethod
    def from_arguments(cls, config: "RolloutConfig | None", fields: dict[str, Any],
                       implied: dict[str, Any] | None = None) -> "RolloutConfig":
        """``config``, or a config built from ``fields`` (a function's ``**config_kwargs``), never both; ``implied``
        (e.g. :func:`native_tool_fields`) fills the fields ``fields`` leaves out or unset."""
        if config is not None and fields:
            raise TypeError("pass either config= or RolloutConfig fields as keyword arguments, not both")
        if config is not None:
            return config
        unknown = sorted(set(fields) - {f.name for f in dataclass_fields(cls)})
        if unknown:
            raise TypeError(f"{unknown[0]!r} is not a rollout setting; the settings are RolloutConfig's fields: "
                            f"{', '.join(f.name for f in dataclass_fields(cls))}")
        return cls(**{**(implied or {}), **{name: value for name, value in fields.items() if value is not None}})


def _chunks(value: Any) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    try:
        chunks = int(value)
    except (TypeError, ValueError):
        chunks = None
    if isinstance(value, bool) or chunks is None or chunks < 1 or (isinstance(value, float) and value != chunks):
        raise ValueError(f"overlap_chunks must be 'auto' or an integer >= 1, got {value!r}")
    return chunks

