"""A watchdog beside an event loop: a coroutine that blocks the loop is noticed, its code named, and its owner told.

An event loop runs one callback at a time, so an ``async def`` agent or environment step that makes a blocking call
(``time.sleep``, a sync SDK or HTTP client, a long computation) stalls every other coroutine of the loop until it
returns, and no timeout on that loop can fire meanwhile. A :class:`LoopWatchdog` thread posts a no-op to the loop
every ``block_after / 10`` seconds; while one waits, the task running (``asyncio.current_task(loop)``) is sampled, and
a task that has held the loop for more than ``block_after`` seconds is blocking it: the loop thread's stack says
where. A first import (a framework imported inside ``async def``) holds the loop once per process: its time is not
counted as the task's. Whoever
started the culprit's work marked it with :func:`report_blocks_to` (a context variable; the tasks created under it
inherit the mark, recorded by the loop's task factory): that callback is called once per block, from the watchdog's
thread, with a :class:`Block`; ``stuck`` is called once if the block outlasts ``stuck_after`` seconds (imports
included).

The others are not blamed: :meth:`LoopWatchdog.stalled` is the time the loop spent blocked, measured on the loop, and
:func:`within` (a timeout for one awaitable) does not count it.

Standard library only: :mod:`trl_agentic.workers` uses :func:`within`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import sysconfig
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

logger = logging.getLogger(__name__)

BLOCK_AFTER_S = 2.0
"""How long a coroutine may hold its loop before it counts as blocking it (at most the timeout it runs under)."""

_owner: contextvars.ContextVar[Callable[["Block"], None] | None] = contextvars.ContextVar("trl_agentic_loop_owner",
                                                                                         default=None)
_owners: "weakref.WeakKeyDictionary[asyncio.Future, Callable[[Block], None]]" = weakref.WeakKeyDictionary()
_watchdogs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatchdog]" = weakref.WeakKeyDictionary()
_LIBRARY = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}) \
    + (str(Path(__file__).parent), "<frozen ")


@dataclass(frozen=True)
class Block:
    """A blocked loop: ``where`` the culprit's code is (``file:line in function``, the innermost frame outside the
    standard library, installed packages and this package), and for how long it had held the loop when reported."""

    where: str
    seconds: float

    def describe(self, who: str, kind: str = "agent") -> str:
        """One line for ``who`` (an agent, ``Env.step``): what happened and what to write instead."""
        return (f"{who} blocked the event loop for over {self.seconds:.1f} s at {self.where}: a blocking call inside "
                f"`async def` stalls every other {kind} on the loop; write it as a plain `def` (it then runs on a "
                "thread of its own) or use an async client (openai.AsyncOpenAI, httpx.AsyncClient, "
                "asyncio.to_thread for a blocking tool)")


def report_blocks_to(callback: Callable[[Block], None]) -> None:
    """Mark the current context: a task created from it from now on, and its own tasks, report a block it causes to
    ``callback`` (called from the watchdog's thread)."""
    _owner.set(callback)


def owned_context(callback: Callable[[Block], None]) -> contextvars.Context:
    """A copy of the current context marked with ``callback``: ``loop.create_task(coro, context=...)`` starts a task
    whose blocks are reported to it."""
    context = contextvars.copy_context()
    context.run(report_blocks_to, callback)
    return context


class LoopWatchdog:
    """Watches ``loop``, which runs on ``thread`` (module docstring). Install it before the loop runs a task (it sets
    the loop's task factory); :meth:`stop` ends the watch.

    A block is counted per task: while the loop does not answer, the task running is sampled every ``block_after / 10``
    seconds, and each task is timed from the first sample that saw it, so two tasks that block one after the other
    are two blocks, each reported on its own.

    Args:
        loop: The event loop.
        thread: The thread that runs it.
        block_after: Seconds a task may hold the loop before it counts as blocking it (may be changed later).
        stuck_after: Seconds after which a block that has not ended is reported to ``stuck`` (``None``: never).
        stuck: Called once per such block, from the watchdog's thread, with its :class:`Block`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 block_after: float = BLOCK_AFTER_S, stuck_after: float | None = None,
                 stuck: Callable[[Block], None] | None = None) -> None:
        self.loop, self.thread, self.block_after = loop, thread, block_after
        self.stuck_after, self.stuck = stuck_after, stuck
        self._stalled = 0.0
        self._posted: float | None = None  # when the ping still waiting was posted
        self._stop = threading.Event()
        loop.set_task_factory(_create_task)
        _watchdogs[loop] = self
        threading.Thread(target=self._watch, name="trl-agentic-loop-watchdog", daemon=True).start()

    def stalled(self) -> float:
        """Seconds the loop has spent blocked so far (pings that waited past the polling interval), as seen from the
        loop: a block is counted when it ends, before any timer that fell due meanwhile runs."""
        return self._stalled

    def stop(self) -> None:
        self._stop.set()

    def _interval(self) -> float:
        return max(0.01, self.block_after / 10)

    def _pong(self, posted: float) -> None:
        late = time.monotonic() - posted
        if late > self._interval():
            self._stalled += late
        self._posted = None

    def _watch(self) -> None:
        seen, holder = False, None  # whether a task was sampled during this ping's wait, and which
        held_since, since, reported, stuck = 0.0, 0.0, False, False  # since: the same, import time left out
        while not self._stop.wait(self._interval()):
            if not self.thread.is_alive() or self.loop.is_closed():
                return
            now, posted = time.monotonic(), self._posted
            if posted is None:  # the loop answered the last ping: post the next
                seen, self._posted = False, now
                try:
                    self.loop.call_soon_threadsafe(self._pong, now)
                except RuntimeError:  # closed meanwhile
                    return
                continue
            task = asyncio.current_task(self.loop)
            if not seen or task is not holder:  # a new holder: timed from this sample (the first: from the ping)
                held_since = since = now if seen else posted
                seen, holder, reported, stuck = True, task, False, False
            frame = sys._current_frames().get(self.thread.ident)
            if _importing(frame):
                since = now
            elif now - since > self.block_after and not reported:
                reported = True
                self._report(task, Block(_where(frame), now - since), self._owner(task))
            if self.stuck_after is not None and now - held_since > self.stuck_after and not stuck:
                stuck = True
                self._report(task, Block(_where(frame), now - held_since), self.stuck)

    @staticmethod
    def _owner(task: asyncio.Task | None) -> Callable[[Block], None] | None:
        return _owners.get(task) if task is not None else None

    @staticmethod
    def _report(task: asyncio.Task | None, block: Block, callback: Callable[[Block], None] | None) -> None:
        if callback is None:
            logger.warning("the event loop was blocked for over %.1f s at %s", block.seconds, block.where)
            return
        try:
            callback(block)
        except Exception:  # noqa: BLE001 - the watch goes on whatever the owner's callback does
            logger.exception("reporting a blocked event loop failed")


def _create_task(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
    """The watched loops' task factory: a task records the owner marked in the context it runs in."""
    task = asyncio.Task(coro, loop=loop, **kwargs)
    context = kwargs.get("context")
    owner = context.get(_owner) if context is not None else _owner.get()
    if owner is not None:
        _owners[task] = owner
    return task


def _importing(frame: Any) -> bool:
    """Whether a stack is importing a module: a first import blocks the loop once per process (an agent that imports
    its framework inside ``async def``), and is not reported; the loop's time is still not counted against the
    others."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _where(frame: Any) -> str:
    """The innermost frame of user code in a stack (the innermost frame if none)."""
    innermost = frame
    while frame is not None:
        if not frame.f_code.co_filename.startswith(_LIBRARY):
            break
        frame = frame.f_back
    frame = frame or innermost
    if frame is None:
        return "an unknown place"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


async def within(awaitable: Awaitable[Any], timeout: float | None) -> Any:
    """``await asyncio.wait_for(awaitable, timeout)``, except that on a watched loop the time the loop spent blocked
    (:meth:`LoopWatchdog.stalled`) is not counted: a coroutine is not timed out for another one's block."""
    loop = asyncio.get_running_loop()
    watchdog = _watchdogs.get(loop)
    if timeout is None or watchdog is None:
        return await asyncio.wait_for(awaitable, timeout)
    task = asyncio.ensure_future(awaitable)
    deadline, counted = loop.time() + timeout, watchdog.stalled()
    try:
        while not task.done():
            stalled = watchdog.stalled()
            deadline, counted = deadline + stalled - counted, stalled
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError
            await asyncio.wait({task}, timeout=remaining)
    except BaseException:
        task.cancel()
        raise
    return task.result()
