"""Rewards that misbehave cost one completion, never the batch.

A reward function returns one value per completion in anything TRL reads (``_calculate_rewards`` iterates the
return): a list, a tuple, a numpy array, a tensor, a generator (:func:`reward_values`). TRL turns a reward of
``None`` into NaN: the completion is *unscorable* for that function, and a completion that
every function leaves unscorable gets advantage 0 and stays out of its group's baseline. :func:`as_reward` maps
every other bad value to ``None`` too: a NaN or infinite number, a string, a tensor of more than one element, an
object. :class:`GuardedReward` wraps a reward function with it (our trainers wrap every callable reward function),
and when the function raises on a batch, or does not return within ``timeout`` seconds, calls it again one
completion at a time (each within ``timeout``), so that only the completions it still raises or hangs on are
unscorable. Each bad value is counted in ``agentic/reward_invalid/<name>`` (the share of the batch).

With a ``timeout``, a synchronous function runs on a daemon thread of its own (a call that never returns is
abandoned there); without one it runs on the caller's thread, as in TRL.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any, Callable

logger = logging.getLogger(__name__)


def as_reward(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` when it is not one (``None``, NaN, inf, a non-number, a tensor or
    array of more than one element)."""
    if hasattr(value, "item") and not isinstance(value, numbers.Number):  # a torch tensor or a numpy array/scalar
        size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 1)
        if size != 1:
            return None
        value = value.item()
    if value is None or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def reward_values(what: str, values: Any, n: int) -> list[Any]:
    """A reward function's return as the list of its ``n`` values, read as TRL reads it (``_calculate_rewards``
    iterates it): a list, a tuple, a numpy array, a tensor (each element one value), a generator. A return TRL
    cannot read, or reads wrongly, is a ``ValueError`` in one line naming ``what`` (e.g. ``"reward function
    'em'"``): ``None`` (a forgotten ``return``), a number, a 0-d array, a string, a mapping (TRL would read its
    keys), a set (in no set order), or a count other than ``n``."""
    unordered = (str, bytes, Mapping, Set)
    if isinstance(values, Iterable) and not isinstance(values, unordered) and getattr(values, "ndim", 1) != 0:
        flat = getattr(values, "ndim", None) == 1 and callable(getattr(values, "tolist", None))
        values = values.tolist() if flat else list(values)  # an array's or tensor's numbers in one read
        if len(values) == n:
            return values
        got = f"{len(values)} values"
    else:
        got = _shortened(repr(values), 80)
    raise ValueError(f"{what} returned {got} for {n} completions; return one number (or None) per completion, in a "
                     "list, a tuple, a numpy array or a tensor")


def invalid_values(what: str, raw: Sequence[Any], clean: Sequence[float | None]) -> str | None:
    """One line naming the values of ``raw`` that :func:`as_reward` refused (``clean`` is ``None`` where the raw
    value is not): how many of how many, their types and one example, and what to return instead; ``None`` when
    every value was a finite number or ``None``. ``what`` names the function, e.g. ``"reward function 'em'"``."""
    bad = [v for v, c in zip(raw, clean) if c is None and v is not None]
    if not bad:
        return None
    kinds = Counter(_kind(v) for v in bad)
    example = _shortened(repr(bad[0]), 60)
    types = ", ".join(f"{kind} x{n}" if len(kinds) > 1 else kind for kind, n in kinds.items())
    return (f"{what} returned {len(bad)} of {len(raw)} values that are not finite numbers ({types}; e.g. {example}): "
            "each counts as unscorable (None); return a float per completion (None skips one)")


def _shortened(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters with ``...`` when longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(value: Any) -> str:
    """The type of a refused reward value, as a user would name it (``nan``/``inf`` for non-finite floats)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return "nan" if math.isnan(float(value)) else "inf" if math.isinf(float(value)) else type(value).__name__
    return type(value).__name__


def _row(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    return {k: ([v[i]] if isinstance(v, Sequence) and not isinstance(v, str) and len(v) == n else v)
            for k, v in kwargs.items()}


class _Guard:
    def __init__(self, func: Callable[..., Any], timeout: float | None = None) -> None:
        self.func = func
        self.timeout = timeout
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def _clean(self, values: Any, n: int, kwargs: dict[str, Any]) -> list[float | None]:
        values = reward_values(f"reward function {self.__name__!r}", values, n)
        rewards = [as_reward(v) for v in values]
        bad = sum(1 for v, r in zip(values, rewards) if r is None and v is not None)
        if bad:
            logger.warning("%s", invalid_values(f"reward function {self.__name__!r}", values, rewards))
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            log_metric(f"agentic/reward_invalid/{self.__name__}", bad / max(n, 1))
        return rewards

    def _warn_retry(self, exc: Exception) -> None:
        if isinstance(exc, RewardTimeout):
            logger.warning("reward function %r %s on a batch; scoring one completion at a time", self.__name__, exc)
            return
        text = _shortened(" ".join(str(exc).split()), 200)
        logger.warning("reward function %r raised %s: %s; scoring one completion at a time",
                       self.__name__, type(exc).__name__, text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.func!r})"


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A call's arguments by name (TRL passes keywords only; ``prompts`` and ``completions`` may come first by
    position) and how many completions it scores: ``len(completions)``, or the length of its first list argument (a
    TRL environment reward called with ``environments=`` alone)."""
    kwargs = {**dict(zip(("prompts", "completions"), args)), **kwargs}
    for value in (kwargs.get("completions"), *kwargs.values()):
        if isinstance(value, Sequence) and not isinstance(value, str):
            return kwargs, len(value)
    return kwargs, 0


def _single(one: Any) -> Any:
    """The value of a one-completion call's return (:func:`reward_values`); ``None`` when it holds not one."""
    try:
        return reward_values("", one, 1)[0]
    except ValueError:
        return None


def _drawn(values: Any) -> Any:
    """A reward function's return, a generator's values drawn: its code runs here, within the call the guard times
    and retries, not later when the values are read."""
    return list(values) if isinstance(values, Iterator) else values


class RewardTimeout(Exception):
    """A reward call did not return within the guard's ``timeout``."""


def _within(timeout: float | None, call: Any) -> Any:
    """``call()``, on a daemon thread when ``timeout`` is set; :class:`RewardTimeout` when it has not returned by
    then (the thread is abandoned)."""
    if timeout is None:
        return call()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="reward-function")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise RewardTimeout(f"did not return within reward_timeout={timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class GuardedReward(_Guard):
    """A synchronous TRL reward function whose bad values become ``None`` (see the module docstring)."""

    def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        kwargs, n = _arguments(args, kwargs)
        try:
            values = _within(self.timeout, lambda: _drawn(self.func(**kwargs)))
        except Exception as exc:  # retry one completion at a time: only the ones it still fails on are lost
            self._warn_retry(exc)
            values = []
            for i in range(n):
                try:
                    values.append(_single(_within(self.timeout, lambda i=i: _drawn(self.func(**_row(kwargs, i, n))))))
                except Exception:  # noqa: BLE001 - this completion stays unscorable
                    values.append(None)
        return self._clean(values, n, kwargs)


class AsyncGuardedReward(_Guard):
    """An ``async`` TRL reward function whose bad values become ``None`` (see the module docstring)."""

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        kwargs, n = _arguments(args, kwargs)
        try:
            values = _drawn(await self._within(self.func(**kwargs)))
        except Exception as exc:
            self._warn_retry(exc)
            values = []
            for i in range(n):
                try:
                    values.append(_single(_drawn(await self._within(self.func(**_row(kwargs, i, n))))))
                except Exception:  # noqa: BLE001
                    values.append(None)
        return self._clean(values, n, kwargs)

    async def _within(self, call: Any) -> Any:
        if self.timeout is None:
            return await call
        try:
            return await asyncio.wait_for(call, self.timeout)
        except asyncio.TimeoutError:
            raise RewardTimeout(f"did not return within reward_timeout={self.timeout:g} s") from None


def guard_reward(func: Any, timeout: float | None = None) -> Any:
    """Wrap a reward function (sync or async) in its guard, each call bounded by ``timeout`` seconds (``None``: no
    bound, on the caller's thread); reward models (``nn.Module``), model ids (``str``) and functions already
    guarded are returned unchanged."""
    if isinstance(func, _Guard) or is_reward_model(func) or not callable(func):
        return func
    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))
    return AsyncGuardedReward(func, timeout) if is_async else GuardedReward(func, timeout)


def is_reward_model(func: Any) -> bool:
    """Whether a reward function is a reward model TRL scores with (a model id or an ``nn.Module``), not a Python
    function our trainers call with keyword arguments."""
    import torch

    return isinstance(func, (str, torch.nn.Module))
