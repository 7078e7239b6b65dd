"""Run a function in reusable worker processes under a hard wall-clock deadline (:class:`DeadlinePool`).

A check that never finishes (sympy expanding ``9^{9^{9^{9^9}}}`` inside one C call that holds the GIL) cannot be
stopped in the process that runs it: ``signal.alarm`` works only on the main thread and only between bytecodes,
and a thread cannot be killed. So the check runs in a worker process; the caller waits on a pipe (any thread can)
and kills the worker when the deadline passes. Workers are kept between calls (a check costs a pipe round trip,
not a process start), at most ``max_workers`` of them; a killed or crashed worker is replaced on the next call.

Protocol: the worker imports ``module:function`` and writes ``{"ready": true}``; then, for each request line
``[args...]`` on its stdin, it writes one line ``{"value": ...}`` or ``{"error": "..."}`` on its stdout. Values and
arguments are JSON. The worker's address space is limited to ``memory_mb``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[3])
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from trl_agentic.rewards.verifiers.deadline import serve; serve(sys.argv[2], int(sys.argv[3]))"
)


class DeadlineExceeded(TimeoutError):
    """The call did not finish before its deadline (its worker was killed)."""


class WorkerFailed(RuntimeError):
    """The worker died, or answered something that is not a reply."""


class _Process:
    """One worker process and the bytes read from it so far."""

    def __init__(self, target: str, memory_mb: int, startup_timeout: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, _ROOT, target, str(memory_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        self.buffer = b""
        os.set_blocking(self.proc.stdout.fileno(), False)
        try:
            if not self._reply(time.monotonic() + startup_timeout).get("ready"):
                raise WorkerFailed(f"the worker for {target} did not start")
        except BaseException:
            self.kill()
            raise

    def call(self, args: list[Any], deadline: float) -> dict[str, Any]:
        try:
            self.proc.stdin.write(json.dumps(args).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise WorkerFailed(f"the worker is gone ({exc})") from exc
        return self._reply(deadline)

    def _reply(self, deadline: float) -> dict[str, Any]:
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded("the call outlasted its deadline")
                if not sel.select(remaining):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise WorkerFailed(f"the worker exited (status {self.proc.poll()})")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise WorkerFailed("the worker sent an invalid reply") from exc
        if not isinstance(reply, dict):
            raise WorkerFailed("the worker sent an invalid reply")
        return reply

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class DeadlinePool:
    """Calls ``target`` (``"module:function"``) in worker processes, each call under a hard deadline.

    Args:
        target: The function, importable in a fresh interpreter with this package on the path.
        max_workers: Workers kept at most (concurrent calls beyond that wait for one).
        memory_mb: Address-space limit of each worker (``RLIMIT_AS``); 0 for none.
        startup_timeout: Seconds a new worker may take to import ``target``.
    """

    def __init__(self, target: str, max_workers: int = 4, memory_mb: int = 2048, startup_timeout: float = 120.0):
        self.target = target
        self.max_workers = max(1, int(max_workers))
        self.memory_mb = int(memory_mb)
        self.startup_timeout = float(startup_timeout)
        self._idle: list[_Process] = []
        self._count = 0
        self._cond = threading.Condition()

    def _acquire(self) -> _Process:
        with self._cond:
            while not self._idle and self._count >= self.max_workers:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Process(self.target, self.memory_mb, self.startup_timeout)
        except BaseException:
            self._discard(None)
            raise

    def _discard(self, process: _Process | None) -> None:
        if process is not None:
            process.kill()
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def call(self, *args: Any, timeout: float) -> Any:
        """``target(*args)`` in a worker; raises :class:`DeadlineExceeded` after ``timeout`` seconds (the worker is
        killed), :class:`WorkerFailed` when the worker dies, and ``RuntimeError`` with the worker's message when
        the function raised."""
        process = self._acquire()
        try:
            reply = process.call(list(args), time.monotonic() + timeout)
        except BaseException:
            self._discard(process)
            raise
        with self._cond:
            self._idle.append(process)
            self._cond.notify()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply.get("value")

    def close(self) -> None:
        """Kill the idle workers (busy ones are killed when their call ends badly, or at exit)."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for process in idle:
            process.kill()


def serve(target: str, memory_mb: int) -> None:
    """The worker's loop (see the module docstring)."""
    import importlib
    import resource

    if memory_mb > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    module, name = target.split(":")
    function = getattr(importlib.import_module(module), name)
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the replies
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            reply = json.dumps({"value": function(*json.loads(line))})
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            reply = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        out.write(reply + "\n")
        out.flush()
