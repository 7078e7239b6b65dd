"""The parent's side of the pipes to a worker: length-prefixed JSON messages (a 4-byte big-endian size, then
UTF-8 JSON), non-blocking reads, and a stream capture that keeps the head and the tail of each output stream."""

from __future__ import annotations

import json
import os
import struct
from collections import deque
from typing import Any

MAX_MESSAGE_BYTES = 4 << 20
BAD = object()
"""What :func:`pop_message` returns for a frame that is too large, not JSON, or not a JSON object."""


def frame(message: dict[str, Any]) -> bytes:
    """``message`` as one frame."""
    payload = json.dumps(message).encode("utf-8", "surrogatepass")
    return struct.pack(">I", len(payload)) + payload


def pop_message(buffer: bytearray) -> Any:
    """Take the first message out of ``buffer``: a dict, None while incomplete (``buffer`` unchanged), or
    :data:`BAD` (a frame too large, not JSON, or not a JSON object)."""
    if len(buffer) < 4:
        return None
    (size,) = struct.unpack(">I", bytes(buffer[:4]))
    if size > MAX_MESSAGE_BYTES:
        return BAD
    if len(buffer) < 4 + size:
        return None
    payload = bytes(buffer[4 : 4 + size])
    del buffer[: 4 + size]
    try:
        message = json.loads(payload.decode("utf-8", errors="replace"))
    except ValueError:
        return BAD
    return message if isinstance(message, dict) else BAD


def read_chunk(fd: int | None) -> bytes | None:
    """Up to 64 KiB from non-blocking ``fd``: None when nothing is ready, ``b""`` at end of file or on error."""
    if fd is None:
        return b""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def close_fd(fd: int) -> None:
    """Close ``fd``, ignoring errors."""
    try:
        os.close(fd)
    except OSError:
        pass


class ByteHeadTail:
    """Keeps the first and the last ``limit`` bytes of a stream, counting what is dropped in between."""

    def __init__(self, limit: int):
        self.limit = limit
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.dropped = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_size += len(data)
            while self.tail and self.tail_size - len(self.tail[0]) >= self.limit:
                old = self.tail.popleft()
                self.tail_size -= len(old)
                self.dropped += len(old)

    def text(self) -> tuple[str, int]:
        """The kept bytes decoded (invalid UTF-8 replaced), with a marker where bytes were dropped; and that count."""
        tail = b"".join(self.tail)
        dropped = self.dropped
        if len(tail) > self.limit:
            dropped += len(tail) - self.limit
            tail = tail[len(tail) - self.limit :]
        head = bytes(self.head).decode("utf-8", errors="replace")
        if dropped:
            return head + f"\n... [{dropped} bytes truncated] ...\n" + tail.decode("utf-8", errors="replace"), dropped
        return (bytes(self.head) + tail).decode("utf-8", errors="replace"), 0
