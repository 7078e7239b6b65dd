"""Blocking calls awaited from an event loop with a timeout: on long-lived daemon worker threads, or on the thread
that runs the rollout.

**Worker threads** (:func:`run_in_thread`): environment steps and our tools run here
(:mod:`trl_agentic.rollout.env_calls`, :mod:`trl_agentic.tools`). The threads live as long as the process, so a
subprocess started from one (tied to its thread by ``PR_SET_PDEATHSIG``, as the sandbox's are) outlives the call. A
call that times out is *abandoned*: Python cannot stop a thread, so it keeps running, but it no longer counts
against :data:`MAX_CONCURRENT_BLOCKING_CALLS` and a new thread takes its place.

**The rollout's thread** (:func:`run_on_caller_thread`): TRL 1.16 calls sync tools (``tools=``, the methods of an
``environment_factory`` instance) and ``reset`` on the training thread, one after another, so a tool may rely on it:
``signal.alarm`` for a timeout of its own (TRL's ``examples/scripts/grpo_agent.py``), a sqlite connection opened in
``__init__``. Such calls are queued by the event loop and run by the thread that waits for it
(:func:`serve_caller_jobs`, called by :func:`trl_agentic.rollout.async_loop.wait`), in the order they were queued.
Their timeout: on the main thread, a watchdog thread sends :data:`DEADLINE_SIGNAL` to it at the deadline and the
handler raises :class:`CallerDeadline`, which interrupts Python code and blocking system calls (``time.sleep``, a
socket read) but not a long computation inside one C call (it is raised when that call returns); the tool's own
``SIGALRM`` is left alone. On another thread the call runs without a deadline.

Standard library only (and :mod:`trl_agentic.loop_watch`: a watched loop's blocks are not counted against a call's
timeout): the tools package imports it on its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import signal
import threading
import time
from typing import Any, Callable

from .loop_watch import within

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


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """The default executor of the library's event loops (``loop.set_default_executor``): every job on a daemon
    worker (:class:`_DaemonWorkers`: a fresh thread when none is idle). asyncio's own default pool has a few threads
    (``min(32, cores + 4)``), shared by ``asyncio.to_thread`` and ``loop.getaddrinfo``: a few agents whose
    ``to_thread`` call never returns would fill it, and every other agent's HTTP connection would wait for a thread
    to resolve ``127.0.0.1``. Here a job that never returns holds only its own thread."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)  # no thread is ever started by the pool itself

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - the caller's exception, delivered to the caller
                future.set_exception(exc)

        _workers.run(job)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to shut down: the workers are daemon threads shared by the process."""


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
            return await within(asyncio.shield(future), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            with lock:
                if not future.done():
                    state["timed_out"] = True
                    abandoned_calls.add(1)
            raise


# -- the rollout's thread -------------------------------------------------------------------------------------------
DEADLINE_SIGNAL = getattr(signal, "SIGRTMIN", 34) + 7 if hasattr(signal, "pthread_kill") else None
"""The signal that ends a call on the main thread at its deadline: a real-time signal nothing else uses (``SIGALRM``,
``SIGUSR1``/``SIGUSR2`` are left to the tools and to job schedulers)."""


class CallerDeadline(BaseException):
    """Raised inside a call on the rollout's thread when its timeout passes. A ``BaseException``, so that a tool's
    ``except Exception`` does not swallow it."""


class _CallerJobs:
    """The queue of calls for the rollout's thread, and the deadline of the one running."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.RLock()  # reentrant: the handler runs on the thread that may hold it
        self.active: object | None = None  # the token of the call whose deadline may fire
        self.installed = False

    def handler(self, signum: int, frame: Any) -> None:
        with self.lock:
            expired, self.active = self.active, None
        if expired is not None:
            raise CallerDeadline()

    def run(self, fn: Callable[[], Any], timeout: float | None) -> Any:
        """Run ``fn`` here, interrupted at ``timeout`` when this is the main thread (module docstring)."""
        main = threading.current_thread() is threading.main_thread()
        if timeout is None or DEADLINE_SIGNAL is None or not main:
            return fn()
        if not self.installed:  # installed once, never removed: a late signal finds it and does nothing
            signal.signal(DEADLINE_SIGNAL, self.handler)
            self.installed = True
        token, target = object(), threading.get_ident()

        def fire() -> None:
            with self.lock:
                if self.active is token:
                    signal.pthread_kill(target, DEADLINE_SIGNAL)

        watchdog = threading.Timer(timeout, fire)
        watchdog.daemon = True
        with self.lock:
            self.active = token
        watchdog.start()
        try:
            return fn()
        finally:
            with self.lock:
                self.active = None
            watchdog.cancel()


_caller_jobs = _CallerJobs()


async def run_on_caller_thread(fn: Callable[..., Any], *args: Any, timeout: float | None, **kwargs: Any) -> Any:
    """Run a blocking call on the thread that waits for the event loop (module docstring) and await its result.
    ``asyncio.TimeoutError`` when it ran past ``timeout``; its own exception otherwise."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def job() -> None:
        try:
            outcome: tuple[bool, Any] = (True, _caller_jobs.run(lambda: fn(*args, **kwargs), timeout))
        except CallerDeadline:
            outcome = (False, asyncio.TimeoutError())
        except KeyboardInterrupt as exc:  # a real Ctrl-C on the main thread stops the run, as in TRL's loop
            _settle_threadsafe(loop, future, (False, exc))
            raise
        except BaseException as exc:  # noqa: BLE001 - the call's exception, whatever it is, goes to the awaiting code
            outcome = (False, exc)
        _settle_threadsafe(loop, future, outcome)

    _caller_jobs.queue.put(job)
    return await future


def _settle_threadsafe(loop: asyncio.AbstractEventLoop, future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, outcome)
    except RuntimeError:  # the loop was abandoned meanwhile
        pass


def wake_caller() -> None:
    """End the wait of :func:`serve_caller_jobs` (a job that does nothing)."""
    _caller_jobs.queue.put(lambda: None)


def serve_caller_jobs(seconds: float) -> float:
    """Run the queued calls of :func:`run_on_caller_thread` on this thread, waiting up to ``seconds`` for the first
    one; returns the time spent running calls (the caller's deadlines do not count it)."""
    try:
        job = _caller_jobs.queue.get(timeout=seconds) if seconds > 0 else _caller_jobs.queue.get_nowait()
    except queue.Empty:
        return 0.0
    started = time.monotonic()
    while True:
        job()
        try:
            job = _caller_jobs.queue.get_nowait()
        except queue.Empty:
            return time.monotonic() - started
