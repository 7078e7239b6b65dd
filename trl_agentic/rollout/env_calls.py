"""Calling the environments of one batch: concurrently, each call under a timeout, each failure kept to its own
trajectory.

What a call can cost, and what a timeout can and cannot stop:

- A **sync** method runs on one of the engine's daemon worker threads (at most
  :data:`~trl_agentic.workers.MAX_CONCURRENT_BLOCKING_CALLS` at once). The threads live as long as the process, so a subprocess a tool
  starts from one (tied to its thread by ``PR_SET_PDEATHSIG``, as the sandbox's are) lives on after the call. On
  timeout the trajectory ends with ``env_timeout`` and the call is *abandoned*: Python cannot stop a thread, so a
  step that never returns keeps running on its thread (and keeps what it holds), but it no longer counts against the
  bound, a new thread takes its place for later calls, and daemon threads do not keep the process from exiting.
  Abandoned calls still running are logged.
- An environment with ``runs_on_caller_thread = True`` (TRL's ``tools=`` / ``environment_factory=``, as TRL calls
  them) has its sync methods and sync tools run on the thread that runs the rollout, one after another
  (:func:`~trl_agentic.workers.run_on_caller_thread`), each under its own timeout; its async ``step`` is then not
  timed as a whole (it waits its turn for that thread).
- An **async** method is cancelled at its timeout, which stops it at its next ``await``. An async method that
  *blocks the loop* (``time.sleep``, a sync client or a busy loop inside ``async def``) cannot be preempted, but the
  watchdog beside the loop (:mod:`trl_agentic.loop_watch`) names it: its trajectory ends with ``env_error`` and one
  line saying where it blocked and to write it as a plain ``def`` or use an async client, and the time it held the
  loop is not counted against the other calls' timeouts. A block that outlasts the batch's deadline abandons the
  whole event loop: the calls of the batch that had not finished end with ``env_timeout`` naming the step that
  blocked, and the next batch runs on a fresh loop (:mod:`trl_agentic.rollout.async_loop`).
- Anything an environment raises, ``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit`` included, and any
  ill-typed return value (:func:`~trl_agentic.environments.base.check_step_result`), ends that trajectory with
  ``env_error``. A real Ctrl-C reaches the main thread, which is not running environment code, and stops the run.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

from ..environments.base import check_reset_result, check_step_result
from ..loop_watch import Block, owned_context, within
from ..workers import run_in_thread, run_on_caller_thread
from .async_loop import LoopTimeout, submit, wait

logger = logging.getLogger(__name__)

_DEADLINE_GRACE_S = 5.0  # the batch deadline: the per-call timeout plus this

Method = Literal["reset", "step", "close"]
Check = Callable[[Any, str], Any]
"""Validates what a call returned (the value, and where it came from); returns it, or raises naming the problem."""


@dataclass(frozen=True)
class EnvFailure:
    """Why one environment call failed: ``kind`` is ``"env_error"`` or ``"env_timeout"``."""

    kind: Literal["env_error", "env_timeout"]
    detail: str


class _Raised(Exception):
    """Carries a ``BaseException`` an environment coroutine raised across asyncio's task boundary (asyncio would
    re-raise ``KeyboardInterrupt``/``SystemExit`` out of the event loop and kill it)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


async def _contained(awaitable: Any) -> Any:
    try:
        return await awaitable
    except (KeyboardInterrupt, SystemExit, GeneratorExit) as exc:
        raise _Raised(exc) from None


async def _invoke(env: Any, method: Method, arg: Any, timeout: float) -> Any:
    fn = getattr(env, method)
    args, kwargs = ((), arg) if method == "reset" else (((arg,), {}) if method == "step" else ((), {}))
    on_caller = getattr(env, "runs_on_caller_thread", False)
    if inspect.iscoroutinefunction(fn):
        # on the caller's thread, an async step waits its turn for each sync tool: each tool call has its own timeout
        step_timeout = None if on_caller else timeout
        result = await within(_contained(fn(*args, **kwargs)), step_timeout)
    elif on_caller:
        result = await run_on_caller_thread(fn, *args, timeout=timeout, **kwargs)
    else:
        result = await run_in_thread(fn, *args, timeout=timeout, **kwargs)
        if inspect.isawaitable(result):  # a sync method that returned a coroutine
            result = await within(_contained(result), timeout)
    return result


_UNFINISHED = object()
"""A call's result before it finishes."""


async def call_one(env: Any, method: Method, arg: Any, timeout: float, check: Check | None = None,
                   name: str | None = None) -> Any:
    """Call ``env.<method>`` and validate its result (``check(result, name)`` when given, else the check of an
    :class:`~trl_agentic.Environment`'s method); returns the result, or an :class:`EnvFailure` whose detail starts
    with ``name`` (``<class>.<method>``)."""
    name = name or f"{type(env).__name__}.{method}"
    try:
        result = await _invoke(env, method, arg, timeout)
        if check is not None and method != "close":
            return check(result, name)
        if method == "reset":
            return check_reset_result(result, type(env).__name__)
        if method == "step":
            return check_step_result(result, type(env).__name__)
        return None
    except asyncio.TimeoutError:
        return EnvFailure("env_timeout", f"{name} took longer than env_timeout={timeout} s")
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or getattr(task, "cancelling", lambda: 1)():  # the batch itself is being cancelled: let it
            raise
        return EnvFailure("env_error", f"{name} raised CancelledError")
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt, ... raised by the environment
        exc = exc.exc if isinstance(exc, _Raised) else exc
        logger.debug("%s raised %s: %s", name, type(exc).__name__, exc)  # named once per round by the trainer
        return EnvFailure("env_error", f"{name} raised {type(exc).__name__}: {exc}")


class PendingCalls:
    """``method`` started on every environment concurrently (``args[i]`` for ``envs[i]``), returning at once: the
    calls run on the background loop while the caller goes on (e.g. generating for other trajectories).
    :meth:`results` waits for them (at most the per-call timeout plus a few seconds after their start) and gives
    each validated result or an :class:`EnvFailure`, in order. ``seconds`` is the wall time from the start until the
    last call finished. ``check`` validates each result instead of an :class:`~trl_agentic.Environment`'s check (a
    game's :class:`~trl_agentic.environments.seats.SeatTurn`); ``names`` names each call in its failure (default:
    ``<class>.<method>``)."""

    def __init__(self, envs: list[Any], method: Method, args: list[Any], timeout: float, check: Check | None = None,
                 names: list[str] | None = None) -> None:
        self.method, self.timeout, self.check = method, timeout, check
        skipped = [method == "close" and not hasattr(env, "close") for env in envs]
        self._results: list[Any] = [None if skip else _UNFINISHED for skip in skipped]
        self._names = names or [f"{type(env).__name__}.{method}" for env in envs]
        self._blocks: dict[int, Block] = {}  # written by the loop's watchdog thread
        self.seconds = 0.0
        self._submitted = None
        if envs:
            self._submitted = submit(self._batch(envs, args, skipped), timeout)

    async def _batch(self, envs: list[Any], args: list[Any], skipped: list[bool]) -> None:
        started = time.monotonic()

        async def one(i: int) -> None:
            result = await call_one(envs[i], self.method, args[i], self.timeout, self.check, self._names[i])
            self._results[i] = self._blocked(i) or result

        loop = asyncio.get_running_loop()
        tasks = []
        for i, skip in enumerate(skipped):
            if not skip:  # each call's task reports a block of the loop it causes for its own index
                report = functools.partial(self._blocks.setdefault, i)
                tasks.append(loop.create_task(one(i), context=owned_context(report)))
        await asyncio.gather(*tasks)
        self.seconds = time.monotonic() - started

    def _blocked(self, i: int) -> EnvFailure | None:
        block = self._blocks.get(i)
        return None if block is None else EnvFailure("env_error", block.describe(self._names[i], "environment"))

    def results(self) -> list[Any]:
        if self._submitted is not None:
            try:
                wait(self._submitted, self.timeout + _DEADLINE_GRACE_S)
            except LoopTimeout as exc:
                logger.warning("environment %s calls: %s", self.method, exc)
            self._submitted = None
            culprit = "".join(f" by {self._names[i]}" for i in sorted(self._blocks)[:1])
            for i, result in enumerate(self._results):
                if result is _UNFINISHED:
                    self._results[i] = self._blocked(i) or EnvFailure(
                        "env_timeout", f"{self.method} did not finish: the event loop was blocked{culprit}")
        return self._results


def call_all(envs: list[Any], method: Method, args: list[Any], timeout: float, check: Check | None = None,
             names: list[str] | None = None) -> list[Any]:
    """Call ``method`` on every environment concurrently and return, in order, each validated result or an
    :class:`EnvFailure`. The whole batch waits at most ``timeout`` plus a few seconds: a call not finished by then
    (the loop was blocked) is an ``env_timeout``. Environments without ``close`` are skipped for
    ``method="close"``. ``check`` and ``names``: see :class:`PendingCalls`."""
    return PendingCalls(envs, method, args, timeout, check, names).results()
