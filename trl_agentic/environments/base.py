"""The environment protocol: text in, text out, one instance per trajectory.

Modelled on Gymnasium's ``Env`` (``gymnasium/core.py``), over text. The rollout engine creates one fresh instance per
trajectory, calls :meth:`Environment.reset` with the dataset row, then :meth:`Environment.step` with the text the
model produced in each turn, until the environment says ``terminated`` or ``truncated`` or a budget runs out, and
finally :meth:`Environment.close`. Each method may be a plain or an ``async`` method.

Subclassing :class:`Environment` is optional: any object with ``reset`` and ``step`` works (``close`` and
``stop_strings`` are then taken as absent). What ``reset`` and ``step`` return is checked (:func:`check_step_result`,
:func:`check_reset_result`); a wrong type costs that trajectory alone (``stop_reason="env_error"``), with an error
naming the environment, the field and the type.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence, TypedDict

from ..renamed import renamed_arguments


class StepInfo(TypedDict, total=False):
    """The keys of ``StepResult.info`` that the library reads (metrics, rewards, SFT replays, trackers, evaluation),
    always through :func:`read_info`; an environment may add any other. Every count is an ``int`` for this turn (a
    ``bool`` is read as 0 or 1). The environments of the library write them all this way; a value of another type
    is refused with the key named (:func:`check_step_result`: it costs that trajectory).

    Attributes:
        tool: The names of the tools called in this turn, in call order (``[]``: none).
        tool_calls: Native tool calls the response template parsed.
        tool_error: Calls that failed: raised, timed out, returned something that is not text (native calls: also
            a call naming no tool).
        tool_timeout: Calls that ran out of time (also counted in ``tool_error``).
        unknown_tool: Calls (or tags) naming a tool the environment does not have.
        invalid: Calls, or a turn, the protocol could not read (a malformed tag or tool-call block).
        observation_truncated: Observations a tool shortened to fit its size limit.
        calls: Native: ``{"name", "arguments"}`` of each call, as parsed.
        state_key: The environment state this step led to, as text equal for equal states (the board, a room's
            name, a hash of what matters): the state the next turn starts from. GiGPO groups the steps of a group's
            trajectories that start from equal keys (:mod:`trl_agentic.algorithms.gigpo`); without it a state is
            keyed by the observation history (``AgenticGRPOConfig.gigpo_state_key``).
    """

    tool: list[str]
    tool_calls: int
    tool_error: int
    tool_timeout: int
    unknown_tool: int
    invalid: int
    observation_truncated: int
    calls: list[dict[str, Any]]
    state_key: str


COUNT_KEYS = ("tool_calls", "tool_error", "tool_timeout", "unknown_tool", "invalid", "observation_truncated")
"""The integer counts of :class:`StepInfo`."""


@dataclass(frozen=True)
class TurnInfo:
    """The keys of a turn's ``info`` the library reads, typed (:class:`StepInfo`; absent keys: none, 0).
    ``reports_tools``: the ``tool`` key is present (an environment that offers tools reports this turn's calls,
    ``[]`` for none); ``state_key``: the key of the state the step led to, ``None`` when the environment gave none."""

    tool: tuple[str, ...] = ()
    reports_tools: bool = False
    tool_calls: int = 0
    tool_error: int = 0
    tool_timeout: int = 0
    unknown_tool: int = 0
    invalid: int = 0
    observation_truncated: int = 0
    calls: tuple[dict[str, Any], ...] = ()
    state_key: str | None = None


def read_info(info: Any, where: str = "StepResult.info") -> TurnInfo:
    """The typed :class:`TurnInfo` of a turn's ``info`` (a ``StepResult.info``, or a ``Trajectory.turn_infos``
    entry): the one way the library reads it. A value of the wrong type raises :class:`EnvironmentOutputError`
    naming ``where`` and the key (no coercion: ``"1"`` is not a count)."""
    if not isinstance(info, dict):
        raise EnvironmentOutputError(f"{where} must be a dict, got {type(info).__name__}")
    values: dict[str, Any] = {}
    for key in COUNT_KEYS:
        value = info.get(key, 0)
        if value is None:
            value = 0
        if not isinstance(value, numbers.Integral) or value < 0:
            raise EnvironmentOutputError(f"{where}[{key!r}] must be a count (an int >= 0 or a bool), got {value!r} "
                                         f"({type(value).__name__})")
        values[key] = int(value)
    tool = info.get("tool") or []
    if not isinstance(tool, (list, tuple)) or not all(isinstance(name, str) for name in tool):
        raise EnvironmentOutputError(f"{where}['tool'] must be a list of tool names (str), got {tool!r:.80}")
    calls = info.get("calls") or []
    if not isinstance(calls, (list, tuple)) or not all(isinstance(call, dict) for call in calls):
        raise EnvironmentOutputError(f"{where}['calls'] must be a list of {{'name', 'arguments'}} dicts, got "
                                     f"{calls!r:.80}")
    state_key = info.get("state_key")
    if state_key is not None and not isinstance(state_key, str):
        raise EnvironmentOutputError(f"{where}['state_key'] must be text equal for equal states (a str), got "
                                     f"{type(state_key).__name__}; pass str(key) or a hash of the state")
    return TurnInfo(tool=tuple(tool), reports_tools="tool" in info, calls=tuple(calls), state_key=state_key, **values)


@renamed_arguments({"done": "use terminated=True when the task ended (and truncated=True when the episode was cut "
                             "short), as Gymnasium's step() does"})
@dataclass
class StepResult:
    """What :meth:`Environment.step` returns for one action.

    Attributes:
        observation: Text appended after the model's action (masked out of training); ``None`` appends nothing. In
            chat mode also a list of messages (``{"role": "tool", "name": ..., "content": ...}``, what
            :class:`~trl_agentic.environments.native_tools.ToolCallEnvironment` returns; a content is text, or a list of content
            parts as a tool returned it), rendered together by the chat template.
        reward: Turn-level reward of this action, a finite number, kept as ``trajectory.turn_rewards``: reward
            functions may read it (``TurnReward``), and PPO's turn-level GAE and GiGPO's step returns add it to the
            turn's reward (``docs/credit.md``).
        terminated: The task reached a terminal state (an answer was given): no further turn.
        truncated: The environment cut the episode short for its own reason (a step limit of its own, a broken
            tool): no further turn. Budgets of the engine (``max_turns``, tokens) are recorded separately, in
            ``Trajectory.stop_reason``.
        info: Details kept on the trajectory (``Trajectory.turn_infos``): any key, and those the library reads, typed
            by :class:`StepInfo`.
    """

    observation: str | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment:
    """Base class of environments (optional: any object with ``reset`` and ``step`` is accepted).

    Attributes:
        stop_strings: Strings after which generation stops within a turn (e.g. ``"</search>"``), in addition to the
            end-of-sequence tokens; the engine reads them from the first environment of a batch.
        action_format: What :meth:`step` receives: ``"text"``, the turn's text (decoded without special tokens);
            or ``"message"``, the assistant message the chat template's response template parsed from it
            (``content``, ``tool_calls``), with the environment's ``tools`` rendered in the prompt
            (:class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`).
    """

    stop_strings: Sequence[str] = ()
    action_format: Literal["text", "message"] = "text"

    def reset(self, **row: Any) -> str | None:
        """Start an episode for one dataset row (all its columns as keyword arguments).

        Returns:
            Text appended to the prompt (tokenized as untrusted text: special-token strings in it stay plain
            text), or ``None``.
        """
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        """Act on the text the model produced in this turn (decoded without special tokens)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (a sandbox session, a connection). Called once when the trajectory ends, also after an
        error; the default does nothing."""


def check_stop_strings(value: Any, where: str) -> list[str]:
    """``value`` as a list of stop strings; a bare string (which would stop at each of its characters) or a
    non-string entry raises a ``TypeError`` naming ``where`` and the fix."""
    if isinstance(value, str):
        raise TypeError(f"{where} is the string {value!r}, which would stop generation at each of its characters; "
                        f"write [{value!r}]")
    if not all(isinstance(s, str) and s for s in value):
        raise TypeError(f"{where} must be a list of non-empty strings, got {value!r}")
    return list(value)


def environment_class(environment: Any) -> type | None:
    """The class ``environment`` builds, when that is known without calling it: the class itself, or the class
    inside (nested) ``functools.partial``; ``None`` for any other factory."""
    while isinstance(environment, functools.partial):
        environment = environment.func
    return environment if isinstance(environment, type) else None


def check_environment_factory(environment: Any) -> None:
    """``environment`` must make a fresh environment per trajectory: a class or a zero-argument factory, not an
    instance; a class's declared ``stop_strings`` must be a list. Raises a one-line ``TypeError`` with the fix."""
    if not isinstance(environment, type) and hasattr(environment, "reset") and hasattr(environment, "step"):
        name = type(environment).__name__
        raise TypeError(f"environment= got an instance of {name}; pass {name} (the class) or a zero-argument factory "
                        "such as functools.partial(...): each trajectory needs a fresh environment")
    if not callable(environment):
        raise TypeError("environment must be an Environment class or a zero-argument factory (e.g. "
                        f"functools.partial(TagEnvironment, tools=...)), got {type(environment).__name__}")
    cls = environment_class(environment)
    declared = getattr(cls, "stop_strings", ())
    if cls is not None and isinstance(declared, (str, list, tuple)):  # a property is read per instance, by the engine
        check_stop_strings(declared, f"{cls.__name__}.stop_strings")


EnvironmentFactory = Callable[[], Any]
"""A class or zero-argument callable that returns a fresh environment."""


class EnvironmentOutputError(TypeError):
    """An environment returned a value of the wrong type; the message names the environment, the field and the
    type, and says what to return instead."""


def _check_text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise EnvironmentOutputError(f"{where} must be a str or None, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EnvironmentOutputError(
            f"{where} is not valid text (a lone surrogate at index {exc.start}); decode tool output with "
            "errors='replace'"
        ) from None
    return value


def _check_nested_text(value: Any, where: str) -> None:
    """Every string inside a list/tuple/dict result is valid text."""
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_nested_text(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            _check_nested_text(item, f"{where}[{j}]")


def check_reset_result(value: Any, env_name: str) -> str | None:
    """Validate what ``reset`` returned: a ``str`` (valid Unicode) or ``None``."""
    return _check_text(value, f"{env_name}.reset() return value")


def check_step_result(value: Any, env_name: str) -> StepResult:
    """Validate what ``step`` returned and give it back: a :class:`StepResult` whose ``observation`` is text or
    ``None``, whose ``reward`` is a finite real number, whose flags are booleans and whose ``info`` is a dict."""
    where = f"{env_name}.step()"
    if not isinstance(value, StepResult):
        raise EnvironmentOutputError(
            f"{where} must return a trl_agentic.StepResult(observation, reward, terminated, truncated, info), got "
            f"{type(value).__name__}"
        )
    if isinstance(value.observation, list):
        for i, message in enumerate(value.observation):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise EnvironmentOutputError(f"{where}.observation[{i}] must be a message dict with a 'role', got "
                                             f"{type(message).__name__}")
            content = message.get("content")
            if isinstance(content, list):  # a TRL tool's list result (content parts, rows), kept as it came
                _check_nested_text(content, f"{where}.observation[{i}]['content']")
            else:
                _check_text(content, f"{where}.observation[{i}]['content']")
    else:
        _check_text(value.observation, f"{where}.observation")
    reward = value.reward
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvironmentOutputError(f"{where}.reward must be a finite number, got {reward!r} ({type(reward).__name__})")
    for flag in ("terminated", "truncated"):
        if not isinstance(getattr(value, flag), (bool, numbers.Integral)):
            raise EnvironmentOutputError(f"{where}.{flag} must be a bool, got {type(getattr(value, flag)).__name__}")
    read_info(value.info, f"{where}.info")  # the keys the library reads, typed
    return value
