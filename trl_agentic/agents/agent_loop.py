"""The event loop the agents run on: one daemon thread, a :class:`~trl_agentic.loop_watch.LoopWatchdog` beside it,
replaced by a fresh loop when a block never ends.

Every ``async def`` agent of a round is a task of this loop, so the agents can share what is bound to one event loop
(a module-level async client, an ``asyncio.Lock``, a server an integration holds for the round). An agent that blocks
the loop (a blocking call inside ``async def``) is reported by the watchdog to the callback its task was created
with; if the block outlasts ``stuck_after`` seconds, the loop is given up: ``stuck`` is told (the rollout starts the
round's other agents again on the fresh loop), and the next :meth:`AgentLoop.submit` runs on a fresh loop (the blocked
thread is abandoned: Python cannot stop it; the given-up loop stops once its block ends).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from typing import Any, Callable, Coroutine

from ..loop_watch import Block, LoopWatchdog
from ..workers import DaemonExecutor


class AgentLoop:
    """See the module docstring.

    Args:
        block_after: Seconds a task may hold the loop before it counts as blocking it.
        stuck_after: Seconds after which a block that has not ended gives the loop up.
        stuck: Called once per given-up loop, from the watchdog's thread, with the :class:`Block`.
    """

    def __init__(self, block_after: float, stuck_after: float, stuck: Callable[[Block], None]) -> None:
        self.block_after, self.stuck_after, self._on_stuck = block_after, stuck_after, stuck
        self.lost = threading.Event()
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(DaemonExecutor())  # a hung to_thread job holds its own thread only
        thread = threading.Thread(target=self.loop.run_forever, name="trl-agentic-agents", daemon=True)
        thread.start()
        self.watchdog = LoopWatchdog(self.loop, thread, self.block_after, self.stuck_after, self._stuck)
        self.lost.clear()

    def _stuck(self, block: Block) -> None:
        self.lost.set()
        self._on_stuck(block)

    def submit(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> concurrent.futures.Future:
        """Run ``coro`` on the loop (a fresh one if the last was given up) as a task in a copy of ``context`` (the
        tasks it starts inherit it); thread-safe. Cancelling the future cancels the task."""
        with self._lock:
            if self.lost.is_set():
                self.stop()
                self._start()
            return context.run(asyncio.run_coroutine_threadsafe, coro, self.loop)

    def stop(self) -> None:
        """Stop watching and stop the loop (at once, or when its block ends)."""
        self.watchdog.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
