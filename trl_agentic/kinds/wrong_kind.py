"""An argument of the wrong kind, refused in one line that names the argument it belongs to.

The trainers and every entry point take the same four kinds of rollout, each under its own name: ``environment=``
(a trl-agentic :class:`~trl_agentic.Environment` class or factory: ``reset`` and ``step``), TRL's
``environment_factory=`` (a class whose public methods are tools: ``reset`` and no ``step``; or a dict of them),
TRL's ``tools=`` (a list of functions) and ``agent=`` (``async def agent(client, **row)``). Given under another
name, each would fail later and further from the mistake (every trajectory ``env_error``, a ``TypeError`` deep in a
rollout, a reward of ``nan``); :func:`check_kinds` recognizes what it is from its shape alone, without calling it,
and says which name to pass it under. What it cannot tell apart (a zero-argument factory function) is left to the
checks of the kind it was given as.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..environments.base import environment_class


def _label(value: Any) -> str:
    cls = environment_class(value)
    return getattr(cls or value, "__name__", type(value).__name__)


def _is_trl_environment_class(cls: type | None) -> bool:
    """TRL's ``environment_factory`` class: ``reset``, no ``step``."""
    return cls is not None and callable(getattr(cls, "reset", None)) and not callable(getattr(cls, "step", None))


def _is_our_environment_class(cls: type | None) -> bool:
    """A trl-agentic environment class: a subclass of :class:`~trl_agentic.Environment`, or one that declares its
    ``action_format`` (:class:`~trl_agentic.environments.native_tools.ToolCallEnvironment`). A TRL class may have a
    tool method named ``step``: that alone does not make it ours."""
    from ..environments.base import Environment

    return cls is not None and (issubclass(cls, Environment) or hasattr(cls, "action_format"))


def _is_agent_function(value: Any) -> bool:
    """``async def agent(client, **row)``: a coroutine function (not a class) with a first positional parameter."""
    if isinstance(value, type) or not inspect.iscoroutinefunction(value):
        return False
    params = list(inspect.signature(value).parameters.values())
    return bool(params) and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                               inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _is_tool_function(value: Any) -> bool:
    """A plain function with a required parameter: what TRL's ``tools=`` lists (an environment factory takes none)."""
    if isinstance(value, type) or not inspect.isfunction(value) or inspect.iscoroutinefunction(value):
        return False
    return any(p.default is inspect.Parameter.empty and p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                                        inspect.Parameter.VAR_KEYWORD)
               for p in inspect.signature(value).parameters.values())


def _function_kind(value: Any) -> str | None:
    """``agent=`` or ``tools=[...]`` for an agent function or a tool function, else ``None``."""
    if _is_agent_function(value):
        return f"agent={_label(value)} ({_label(value)} is an async agent function that takes a client)"
    if _is_tool_function(value):
        return f"tools=[{_label(value)}] ({_label(value)} is a function with parameters: a tool)"
    return None


def _environment_kind(value: Any) -> str | None:
    """The argument ``environment=`` value belongs under, when it is not ``environment``."""
    from ..environments.trl_environments import TRLEnvironments

    if isinstance(value, TRLEnvironments):
        return None
    if isinstance(value, dict):
        return f"environment_factory={{...}} (a dict of TRL environment classes, e.g. {list(value)[:2]})"
    if isinstance(value, (list, tuple)):
        return "tools=[...] (TRL's list of tool functions)"
    if _is_trl_environment_class(environment_class(value)):
        return (f"environment_factory={_label(value)} ({_label(value)} is a TRL environment class: reset() and tool "
                "methods, no step())")
    return _function_kind(value)


def _factory_kind(value: Any) -> str | None:
    """The argument ``environment_factory=`` value belongs under, when it is not ``environment_factory``."""
    if isinstance(value, (list, tuple)):
        return "tools=[...] (a list of functions is TRL's tools=)"
    factories = value.values() if isinstance(value, dict) else [value]
    for factory in factories:
        if _is_our_environment_class(environment_class(factory)):
            return (f"environment={_label(factory)} ({_label(factory)} is a trl-agentic Environment: it has "
                    "step(); environment_factory= takes TRL's classes, whose public methods are tools)")
        right = _function_kind(factory)
        if right is not None:
            return right
    return None


def _tools_kind(value: Any) -> str | None:
    """The argument ``tools=`` value belongs under, when it is not ``tools``."""
    if callable(value) and not isinstance(value, type):
        return f"tools=[{_label(value)}] (a list, as TRL takes it)"
    for tool in value if isinstance(value, (list, tuple)) else [value]:
        cls = environment_class(tool)
        if _is_trl_environment_class(cls):
            return f"environment_factory={_label(tool)} ({_label(tool)} is a class with reset(): an environment)"
        if _is_our_environment_class(cls):
            return f"environment={_label(tool)} ({_label(tool)} is a trl-agentic Environment)"
    return None


def _agent_kind(value: Any) -> str | None:
    """The argument ``agent=`` value belongs under, when it is not ``agent``."""
    cls = environment_class(value)
    if _is_our_environment_class(cls):
        return f"environment={_label(value)} ({_label(value)} is a trl-agentic Environment)"
    if cls is not None and callable(getattr(cls, "reset", None)):
        return f"environment_factory={_label(value)} ({_label(value)} is a TRL environment class)"
    if isinstance(value, (list, tuple)):
        return "tools=[...] (a list of functions is TRL's tools=)"
    return None


_KINDS = {"environment": _environment_kind, "environment_factory": _factory_kind, "tools": _tools_kind,
          "agent": _agent_kind}


def check_kinds(**given: Any) -> None:
    """Refuse a rollout argument given under the wrong name (module docstring): ``given`` maps each of
    ``environment``, ``environment_factory``, ``tools`` and ``agent`` to its value (``None``: not given). Raises a
    one-line ``TypeError`` that names the argument to pass the value under."""
    for name, value in given.items():
        if value is None:
            continue
        right = _KINDS[name](value)
        if right is not None:
            raise TypeError(f"{name}= got {_label(value)}, which is not a{'n' if name[0] in 'ae' else ''} {name}: "
                            f"pass {right}")
