"""Calling the environments of one batch: concurrently, each call under a timeout, each failure kept to its own
trajectory.

What a call can cost, and what a timeout can and cannot stop:

- A **sync** method runs on one of the engine's daemon worker threads (at most
  :data:`MAX_CONCURRENT_BLOCKING_CALLS` at once). The threads live as long as the process, so a subprocess a tool
  starts from one (tied to its thread by ``PR_SET_PDEATHSIG``, as the sandbox's are) lives on after the call. On
  timeout the trajectory ends with ``env_timeout`` and the call is *abandoned*: Python cannot stop a thread, so a
  step that never returns keeps running on its thread (and keeps what it holds), but it no longer counts against the
  bound, a new thread takes its place for later calls, and daemon threads do not keep the process from exiting.
  Abandoned calls still running are logged.
- An **async** method is cancelled at its timeout, which stops it at its next ``await``. An async method that
  *blocks the loop* (``time.sleep`` or a busy loop inside ``async def``) cannot be preempted: the batch's deadline
  then abandons the whole event loop, the calls of the batch that had not finished end with ``env_timeout``, and the
  next batch runs on a fresh loop (:mod:`trl_agentic.rollout.async_loop`).
- Anything an environment raises, ``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit`` included, and any
  ill-typed return value (:func:`~trl_agentic.environment.check_step_result`), ends that trajectory with
  ``env_error``. A real Ctrl-C reaches the main thread, which is not running environment code, and stops the run.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

from ..environment import check_reset_result, check_step_result
from .async_loop import LoopTimeout, submit, wait

logger = logging.getLogger(__name__)

MAX_CONCURRENT_BLOCKING_CALLS = 64
"""Most sync environment calls running at once (each on its own daemon thread)."""

_DEADLINE_GRACE_S = 5.0  # the batch deadline: the per-call timeout plus this

Method = Literal["reset", "step", "close"]


@dataclass(frozen=True)
class EnvFailure:
    """Why one environment call failed: ``kind`` is ``"env_error"`` or ``"env_timeout"``."""

    kind: Literal["env_error", "env_timeout"]
    detail: str


class _Abandoned:
    """Counts sync calls still running after their timeout."""

    def __init__(self) -> None:
        self.running = 0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.running += n
            running = self.running
        if n > 0 and running and running % 8 == 0:
            logger.warning(
                "%d environment calls are still running after their timeout (Python cannot stop a thread); fix the "
                "environment that hangs", running,
            )


abandoned_calls = _Abandoned()


class _DaemonWorkers:
    """Long-lived daemon threads that run blocking calls. A call that finds no idle thread starts one, so a thread
    stuck in a call that never returns is never waited for; idle threads wait for the next call."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # that idle thread takes this job
        if spawn:
            threading.Thread(target=self._serve, name="trl-agentic-env-worker", daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


_workers = _DaemonWorkers()


_slots: dict[int, asyncio.Semaphore] = {}


def _loop_slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    key = id(loop)
    if key not in _slots:
        _slots.clear()  # a new loop: the old one was abandoned
        _slots[key] = asyncio.Semaphore(MAX_CONCURRENT_BLOCKING_CALLS)
    return _slots[key]


def _settle(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if not future.done():
        ok, value = outcome
        future.set_result(value) if ok else future.set_exception(value)


async def run_in_thread(fn: Callable[..., Any], *args: Any, timeout: float | None, **kwargs: Any) -> Any:
    """Run a blocking call on a daemon worker thread and await it, at most ``timeout`` seconds
    (``asyncio.TimeoutError`` then; the call is abandoned, see the module docstring). At most
    :data:`MAX_CONCURRENT_BLOCKING_CALLS` such calls run at once per event loop."""
    slots = _loop_slots()
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    state = {"timed_out": False}
    lock = threading.Lock()

    def target() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - the environment's exception, whatever it is, goes to the caller
            outcome = (False, exc)
        with lock:
            if state["timed_out"]:
                abandoned_calls.add(-1)
                return
        try:
            loop.call_soon_threadsafe(_settle, future, outcome)
        except RuntimeError:  # the loop was closed (abandoned) meanwhile
            pass

    async with slots:
        _workers.run(target)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            with lock:
                if not future.done():
                    state["timed_out"] = True
                    abandoned_calls.add(1)
            raise


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
    if inspect.iscoroutinefunction(fn):
        result = await asyncio.wait_for(_contained(fn(*args, **kwargs)), timeout)
    else:
        result = await run_in_thread(fn, *args, timeout=timeout, **kwargs)
        if inspect.isawaitable(result):  # a sync method that returned a coroutine
            result = await asyncio.wait_for(_contained(result), timeout)
    return result


def _env_name(env: Any) -> str:
    return type(env).__name__


async def call_one(env: Any, method: Method, arg: Any, timeout: float) -> Any:
    """Call ``env.<method>`` and validate its result; returns the result, or an :class:`EnvFailure`."""
    name = f"{_env_name(env)}.{method}"
    try:
        result = await _invoke(env, method, arg, timeout)
        if method == "reset":
            return check_reset_result(result, _env_name(env))
        if method == "step":
            return check_step_result(result, _env_name(env))
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
        logger.warning("%s raised %s: %s", name, type(exc).__name__, exc)
        return EnvFailure("env_error", f"{name} raised {type(exc).__name__}: {exc}")


class PendingCalls:
    """Environment calls started by :func:`start_all`; :meth:`results` waits for them (at most the per-call timeout
    plus a few seconds after their start) and gives each validated result or an :class:`EnvFailure`, in order.
    ``seconds`` is the wall time from the start until the last call finished."""

    def __init__(self, envs: list[Any], method: Method, args: list[Any], timeout: float) -> None:
        self.method, self.timeout = method, timeout
        unfinished = EnvFailure("env_timeout", f"{method} did not finish: the event loop was blocked")
        skipped = [method == "close" and not hasattr(env, "close") for env in envs]
        self._results: list[Any] = [None if skip else unfinished for skip in skipped]
        self.seconds = 0.0
        self._submitted = None
        if envs:
            self._submitted = submit(self._batch(envs, args, skipped))

    async def _batch(self, envs: list[Any], args: list[Any], skipped: list[bool]) -> None:
        started = time.monotonic()

        async def one(i: int) -> None:
            self._results[i] = await call_one(envs[i], self.method, args[i], self.timeout)

        await asyncio.gather(*(one(i) for i, skip in enumerate(skipped) if not skip))
        self.seconds = time.monotonic() - started

    def results(self) -> list[Any]:
        if self._submitted is not None:
            try:
                wait(self._submitted, self.timeout + _DEADLINE_GRACE_S)
            except LoopTimeout as exc:
                logger.warning("environment %s calls: %s", self.method, exc)
            self._submitted = None
        return self._results


def start_all(envs: list[Any], method: Method, args: list[Any], timeout: float) -> PendingCalls:
    """Start ``method`` on every environment concurrently (``args[i]`` for ``envs[i]``) and return at once; the
    calls run on the background loop while the caller goes on (e.g. generating for other trajectories)."""
    return PendingCalls(envs, method, args, timeout)


def call_all(envs: list[Any], method: Method, args: list[Any], timeout: float) -> list[Any]:
    """Call ``method`` on every environment concurrently and return, in order, each validated result or an
    :class:`EnvFailure`. The whole batch waits at most ``timeout`` plus a few seconds: a call not finished by then
    (the loop was blocked) is an ``env_timeout``. Environments without ``close`` are skipped for
    ``method="close"``."""
    return start_all(envs, method, args, timeout).results()
