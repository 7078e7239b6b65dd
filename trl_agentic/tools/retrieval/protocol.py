"""The HTTP/1.1 connection of :class:`~.serving.RetrievalServer`: uvicorn's h11 protocol with three guards.

- An idle timer that also runs before a connection's first request and while a request head arrives (uvicorn arms
  it only after a response): a connection that sends nothing, or half a head, is closed after
  ``timeout_keep_alive`` seconds.
- A limit on the request head (request line and headers, :data:`MAX_HEAD_BYTES`) however the head arrives. h11
  enforces its own limit only on a head still incomplete after a read, so a longer head sent in one write was
  served.
- Requests h11 cannot read (a bad ``Content-Length``, bad chunk framing, a bad request line or header) get the
  one-line JSON 400 of the app's other errors, naming the fault, instead of uvicorn's plain-text "Invalid HTTP
  request received.".

After such an answer the connection reads and discards what the client still sends (at most
:data:`~.app.DRAIN_BYTES`, for at most ``timeout_keep_alive`` seconds) before it closes, so that a client still
sending its request reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import re
import sys

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .app import DRAIN_BYTES, error_body

__all__ = ["GuardedH11Protocol", "MAX_HEAD_BYTES"]

MAX_HEAD_BYTES = 16 << 10
"""Largest request head (request line, headers and the blank line after them), in bytes: h11's default limit."""

_HEAD_END = re.compile(rb"\n\r?\n")  # the blank line that ends a head, as h11 finds it


def _oversized_head(buffer: bytes) -> str | None:
    """What is wrong with the request head at the start of ``buffer`` (up to its blank line, or all of ``buffer``
    while it is incomplete) when it is over :data:`MAX_HEAD_BYTES`; ``None`` when it is not."""
    end = _HEAD_END.search(buffer)
    size = end.end() if end else len(buffer)
    if size <= MAX_HEAD_BYTES:
        return None
    return (f"request head of {'' if end else 'at least '}{size} bytes is over this server's limit of "
            f"{MAX_HEAD_BYTES} bytes; send shorter headers")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the guards of the module docstring."""

    _discarded: int | None = None  # bytes read and dropped since a connection-level error was answered

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        if self._discarded is not None:
            self._discarded += len(data)
            if self._discarded > DRAIN_BYTES:
                self.transport.close()
            return
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and self._discarded is None and not self.transport.is_closing():
            self._arm_idle_timer()

    def handle_events(self) -> None:
        """h11's events, as uvicorn handles them, once the head waiting in the buffer is within the limit."""
        problem = _oversized_head(self.conn.trailing_data[0]) if self.conn.their_state is h11.IDLE else None
        if problem is not None:
            self._refuse(problem)
            return
        super().handle_events()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot read, which it calls while handling h11's
        ``RemoteProtocolError``: the app's one-line JSON error, naming h11's reason."""
        error = sys.exc_info()[1]
        reason = " ".join(str(error).split())[:200] if isinstance(error, h11.RemoteProtocolError) else msg
        self._refuse(f"malformed HTTP/1.1 request: {reason}")

    def _refuse(self, message: str) -> None:
        """Answer 400 ``{"error": message}`` and close: at once when a response has begun, else once the client
        stops sending (see the module docstring)."""
        if self.cycle is not None and not self.cycle.response_complete:  # the app's request ends here
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):  # the app has begun its answer
            self.transport.close()
            return
        body = error_body(message)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self._discarded = 0
        self.flow.resume_reading()
        self._arm_idle_timer()

    def shutdown(self) -> None:
        """Close at once when the server stops, as uvicorn does with an idle connection (it would wait for the
        answer of a request refused here)."""
        if self._discarded is not None:
            self.transport.close()
            return
        super().shutdown()

    def _arm_idle_timer(self) -> None:
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
