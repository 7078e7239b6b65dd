"""A background event loop for environment calls, with waits that always end.

Environments of one turn run concurrently on an event loop in a background thread, so that the engine works where
the caller already runs a loop (Jupyter, Colab) and ``asyncio.run`` would refuse.

Every wait on that loop has a deadline (:func:`wait`), and runs, while it waits, the calls the loop queued for the
waiting thread (:func:`~trl_agentic.workers.run_on_caller_thread`: TRL's sync tools); their time does not count
against the deadline. A :class:`~trl_agentic.loop_watch.LoopWatchdog` watches the loop: an ``async`` step that blocks
it (e.g. ``time.sleep`` inside ``async def``) is reported to the calls that started it
(:mod:`trl_agentic.rollout.env_calls`). A loop that stopped answering or whose thread died is abandoned, and the next
call starts a fresh one: a block that outlasts the deadline costs its batch's unfinished calls, never later batches. A ``KeyboardInterrupt`` in
the waiting thread (a real Ctrl-C) cancels the work on the loop and is re-raised at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Coroutine

from ..loop_watch import BLOCK_AFTER_S, LoopWatchdog
from ..workers import DaemonExecutor, serve_caller_jobs, wake_caller

logger = logging.getLogger(__name__)

_POLL_S = 0.25  # how often a wait checks that the loop's thread is alive
_PING_S = 1.0  # how long a loop may take to run a no-op before it counts as blocked


class LoopTimeout(TimeoutError):
    """The coroutine did not finish before its deadline (its unfinished work was cancelled)."""


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(DaemonExecutor())  # a hung to_thread job holds its own thread only
        self.thread = threading.Thread(target=self.loop.run_forever, name="trl-agentic-env-loop", daemon=True)
        self.thread.start()
        self.watchdog = LoopWatchdog(self.loop, self.thread)

    def healthy(self) -> bool:
        """Alive and able to run a callback within ``_PING_S``."""
        if not self.thread.is_alive() or self.loop.is_closed():
            return False
        ran = threading.Event()
        try:
            self.loop.call_soon_threadsafe(ran.set)
        except RuntimeError:  # closed meanwhile
            return False
        return ran.wait(_PING_S)


_current: _Loop | None = None
_lock = threading.Lock()


def _abandon(stale: _Loop) -> None:
    """Forget ``stale`` so that the next call starts a fresh loop; stop it if it still answers."""
    global _current
    with _lock:
        if _current is stale:
            _current = None
    stale.watchdog.stop()
    if stale.thread.is_alive() and not stale.loop.is_closed():
        try:
            stale.loop.call_soon_threadsafe(stale.loop.stop)
        except RuntimeError:
            pass
    logger.warning("the environment event loop stopped answering; later calls use a fresh loop")


@dataclass
class Submitted:
    """A coroutine running on the background loop, submitted at ``started`` (``time.monotonic``)."""

    future: concurrent.futures.Future
    handle: _Loop
    started: float


def submit(coro: Coroutine[Any, Any, Any], timeout: float = BLOCK_AFTER_S) -> Submitted:
    """Start ``coro`` on the background loop; :func:`wait` collects it. A coroutine that holds the loop for more
    than ``min(timeout, BLOCK_AFTER_S)`` seconds counts as blocking it."""
    global _current
    with _lock:  # the background loop, a fresh one if the last died or was abandoned
        if _current is None or not _current.thread.is_alive() or _current.loop.is_closed():
            _current = _Loop()
        handle = _current
    handle.watchdog.block_after = min(timeout, BLOCK_AFTER_S)
    return Submitted(asyncio.run_coroutine_threadsafe(coro, handle.loop), handle, time.monotonic())


def wait(submitted: Submitted, timeout: float | None = None) -> Any:
    """The result of a submitted coroutine, waiting until ``timeout`` seconds after its submission at most
    (``None``: no deadline, but a dead loop is still noticed within a fraction of a second).

    Raises:
        LoopTimeout: the deadline passed or the loop died; the coroutine was cancelled, and the loop replaced if it no
            longer answers.
    """
    future, handle = submitted.future, submitted.handle
    deadline = None if timeout is None else submitted.started + timeout
    future.add_done_callback(lambda _: wake_caller())  # ends serve_caller_jobs' wait at once
    try:
        while True:
            remaining = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            busy = serve_caller_jobs(remaining)  # calls that must run on this thread (workers.run_on_caller_thread)
            if deadline is not None:
                deadline += busy  # the loop waited for this thread meanwhile: not the calls' time
            try:
                return future.result(0)
            except concurrent.futures.TimeoutError:
                if not handle.thread.is_alive():
                    _abandon(handle)
                    raise LoopTimeout("the environment event loop died") from None
                if deadline is not None and time.monotonic() >= deadline:
                    future.cancel()
                    if not handle.healthy():
                        _abandon(handle)
                    raise LoopTimeout(f"environment calls did not finish within {timeout:.1f} s") from None
    except BaseException:  # KeyboardInterrupt (a real Ctrl-C) or LoopTimeout: stop the work on the loop
        future.cancel()
        raise
