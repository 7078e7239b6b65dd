"""The key of a state that another ecosystem reports as data (a TextArena game's ``game_state``, an OpenEnv
observation): text equal exactly when the data is equal, for GiGPO's anchor states (``StepInfo.state_key``,
:mod:`trl_agentic.algorithms.gigpo`).

The text is canonical: a dict's entries and a set's items are sorted by their own text, so that the order they were
inserted in, and the hash seed of the process that holds them (which orders a set of strings), change nothing; keys
that are not strings (TextArena's player ids) are kept apart from strings. Objects of a game's own classes (TextArena's
``RushHour`` cars, ``__slots__`` classes) are written by their fields, never by their ``repr`` (whose address differs in
every process).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 32
"""How deep a state may nest before it gets no key (a reference cycle, or an object graph that is not a state)."""


class _Unkeyed(Exception):
    """A value without a stable text (a function, an object whose only text is its address), or nesting past
    :data:`MAX_DEPTH`."""


def state_key(value: Any) -> str | None:
    """``value`` as canonical text (module docstring); ``None`` when it holds a value without a stable text."""
    try:
        return _text(value, 0)
    except _Unkeyed:
        return None


def _text(value: Any, depth: int) -> str:
    if depth > MAX_DEPTH:
        raise _Unkeyed
    if value is None or isinstance(value, (bool, int, float, str)):
        return json.dumps(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, (bytes, bytearray)):
        return f"bytes:{bytes(value).hex()}"
    if isinstance(value, Mapping):
        return "{" + ",".join(sorted(f"{_text(k, depth + 1)}:{_text(v, depth + 1)}" for k, v in value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_text(item, depth + 1) for item in value) + "]"
    if isinstance(value, (set, frozenset)):
        return "set[" + ",".join(sorted(_text(item, depth + 1) for item in value)) + "]"
    return type(value).__qualname__ + _text(_fields(value), depth + 1)


def _fields(value: Any) -> Any:
    """What an object other than plain data is written by: a pydantic model's fields, an array's items, a dataclass's
    or a plain object's attributes (``__dict__`` and ``__slots__``)."""
    if callable(value) or isinstance(value, type):
        raise _Unkeyed
    if callable(getattr(value, "model_dump", None)):
        return value.model_dump()
    if callable(getattr(value, "tolist", None)):
        return value.tolist()
    if dataclasses.is_dataclass(value):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    attributes = {}
    for cls in type(value).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                attributes[name] = getattr(value, name)
    attributes.update(getattr(value, "__dict__", {}))
    if not attributes:
        raise _Unkeyed
    return attributes


__all__ = ["state_key"]
