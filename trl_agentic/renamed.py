"""Keyword arguments that other libraries spell differently, answered with the name to use.

RL code says ``done`` (Gym before 0.26) where Gymnasium and :class:`~trl_agentic.StepResult` say ``terminated`` and
``truncated``; TRL's former ``PPOConfig`` said ``kl_coef`` where :class:`~trl_agentic.AgenticPPOConfig` says
``beta``. Python's bare "unexpected keyword argument 'done'" does not say what to write instead; a class decorated
with :func:`renamed_arguments` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T", bound=type)


def renamed_arguments(names: Mapping[str, str]) -> Callable[[T], T]:
    """Class decorator: ``cls(..., key=...)`` with a key of ``names`` raises ``TypeError`` naming what to pass
    instead (``names[key]``); every other call goes to the class's own ``__init__`` unchanged (apply it above
    ``@dataclass``)."""

    def decorate(cls: T) -> T:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for key in kwargs:
                if key in names:
                    raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {key!r}: {names[key]}")
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        return cls

    return decorate
