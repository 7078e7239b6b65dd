"""Blocking calls on long-lived daemon worker threads, awaited from an event loop with a timeout.

Environment steps and tools run here (:mod:`trl_agentic.rollout.env_calls`, :mod:`trl_agentic.tools`). The threads
live as long as the process, so a subprocess started from one (tied to its thread by ``PR_SET_PDEATHSIG``, as the
sandbox's are) outlives the call. A call that times out is *abandoned*: Python cannot stop a thread, so it keeps
running, but it no longer counts against :data:`MAX_CONCURRENT_BLOCKING_CALLS` and a new thread takes its place.
Standard library only: the tools package imports it on its own.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)

MAX_CONCURRENT_BLOCKING_CALLS = 64
"""Most sync environment calls running at once (each on its own daemon thread)."""

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
