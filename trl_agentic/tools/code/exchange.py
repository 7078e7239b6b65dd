"""One request to a worker and what comes back (:class:`Exchange`): the request written, stdout and stderr read,
the reply parsed, all without blocking and under a wall-clock deadline, a per-block CPU-time limit and an output
limit. A worker may ask the parent something in the middle of a block (``{"rpc": ...}``); the exchange answers
with ``{"rpc_reply": ...}`` from its ``on_rpc`` callback and goes on waiting for the reply.
"""

from __future__ import annotations

import os
import selectors
import time
from dataclasses import dataclass
from typing import Any, Callable

from .proctree import ProcessTree
from .protocol import BAD, ByteHeadTail, frame, pop_message, read_chunk

RpcHandler = Callable[[Any, float], Any]
"""``on_rpc(question, deadline) -> answer`` (JSON values); ``deadline`` is the exchange's, on ``time.monotonic``."""


@dataclass
class Outcome:
    """What one exchange with a worker gave.

    Attributes:
        stdout, stderr: The program's output streams (head and tail kept).
        message: The worker's reply, or None when there was none (then the worker has been killed).
        timed_out, cpu_limit, output_limit, closed, protocol_error, eof: Why there was no reply: the deadline
            passed, the block used more CPU time than allowed, the program wrote too much, the session was closed
            meanwhile, the reply was malformed, the worker exited.
        forged: Messages without the request's nonce (the program wrote them on the reply pipe); ignored.
        returncode: The worker's exit status when it ended during the exchange.
        duration_s: Wall time of the exchange.
    """

    stdout: ByteHeadTail
    stderr: ByteHeadTail
    message: dict[str, Any] | None = None
    timed_out: bool = False
    cpu_limit: bool = False
    output_limit: bool = False
    closed: bool = False
    protocol_error: bool = False
    forged: int = 0
    eof: bool = False
    returncode: int | None = None
    duration_s: float = 0.0


class CpuMeter:
    """CPU seconds used by a worker's process tree since the meter was made, checked at most every 0.1 s."""

    def __init__(self, tree: ProcessTree, limit: float):
        self.tree = tree
        self.limit = limit
        self.start = tree.cpu_seconds(rescan=False)
        self.checked = time.monotonic()

    def exceeded(self) -> bool:
        now = time.monotonic()
        if now - self.checked < 0.1:
            return False
        self.checked = now
        return self.tree.cpu_seconds() - self.start > self.limit


class Exchange:
    """Writes one request to a worker's pipes and reads until its reply, the deadline or a violation.

    Args:
        fds: The parent's ends: ``(request, reply, stdout, stderr)``.
        outcome: Filled in as the exchange goes.
        deadline: ``time.monotonic()`` value at which the exchange gives up (``outcome.timed_out``).
        read_limit: Most bytes of stdout + stderr (``outcome.output_limit``).
        dead: Says whether the worker was killed from another thread (``outcome.closed``).
        on_rpc: Answers the worker's questions; None: a question counts as the reply.
        nonce: The request's nonce: a message that does not carry it is not the worker's (``outcome.forged``).
    """

    def __init__(
        self,
        fds: tuple[int, int, int, int],
        outcome: Outcome,
        deadline: float,
        read_limit: int,
        dead: Callable[[], bool],
        on_rpc: RpcHandler | None = None,
        nonce: str | None = None,
    ):
        self.req_w, self.resp_r, out_r, err_r = fds
        self.nonce = nonce
        self.outcome = outcome
        self.deadline = deadline
        self.read_limit = read_limit
        self.dead = dead
        self.on_rpc = on_rpc
        self.pending: memoryview | None = None
        self.buffer = bytearray()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.resp_r, selectors.EVENT_READ, "resp")
        self.sel.register(out_r, selectors.EVENT_READ, outcome.stdout)
        self.sel.register(err_r, selectors.EVENT_READ, outcome.stderr)

    def run(self, request: bytes | None, tree: ProcessTree | None = None, cpu_limit: float | None = None) -> None:
        """Send ``request`` (None: only wait, e.g. for the ready message) and pump until the exchange ends."""
        try:
            if request:
                self._send(request)
            # the baseline is read while the worker already runs the block (it costs a few tens of microseconds)
            meter = CpuMeter(tree, cpu_limit) if tree is not None and cpu_limit is not None else None
            self._pump(meter)
        finally:
            self.sel.close()

    def _pump(self, meter: CpuMeter | None) -> None:
        outcome = self.outcome
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                outcome.timed_out = True
                return
            if self.dead():  # killed from another thread (session closed)
                outcome.closed = True
                return
            if meter is not None and meter.exceeded():
                outcome.cpu_limit = True
                return
            for key, _ in self.sel.select(min(remaining, 0.25)):
                if key.data == "req":
                    self._write_pending()
                elif key.data == "resp":
                    if self._read_reply():
                        return
                elif self._read_stream(key):
                    return

    def _send(self, data: bytes) -> None:
        """Queue ``data`` and write what the pipe takes at once."""
        if self.pending is None:
            self.pending = memoryview(data)
            self.sel.register(self.req_w, selectors.EVENT_WRITE, "req")
        else:
            self.pending = memoryview(bytes(self.pending) + data)
        self._write_pending()

    def _write_pending(self) -> None:
        try:
            self.pending = self.pending[os.write(self.req_w, self.pending) :]
        except BlockingIOError:
            return
        except OSError:  # the worker is gone: the reply pipe will say so
            self.pending = memoryview(b"")
        if not self.pending:
            self.pending = None
            self.sel.unregister(self.req_w)

    def _read_reply(self) -> bool:
        chunk = read_chunk(self.resp_r)
        if chunk is None:
            return False
        if chunk == b"":
            self.outcome.eof = True
            return True
        self.buffer += chunk
        while True:
            message = pop_message(self.buffer)
            if message is None:
                return False
            if message is BAD:
                self.outcome.protocol_error = True
                return True
            if message.get("nonce") != self.nonce:  # written by the program, not the worker: never a reply
                self.outcome.forged += 1
                continue
            if self.on_rpc is not None and "rpc" in message:
                self._send(frame({"rpc_reply": self.on_rpc(message["rpc"], self.deadline)}))
                continue
            self.outcome.message = message
            return True

    def _read_stream(self, key: Any) -> bool:
        chunk = read_chunk(key.fd)
        if chunk is None:
            return False
        if chunk == b"":
            self.sel.unregister(key.fd)
            return False
        key.data.feed(chunk)
        if self.outcome.stdout.total + self.outcome.stderr.total > self.read_limit:
            self.outcome.output_limit = True
            return True
        return False
