"""The host's end of a sandboxed CLI's way to the endpoint: a Unix socket whose connections are carried, byte for
byte, to the endpoint's TCP port on 127.0.0.1 (:class:`Relay`). The sandbox's launcher relays its own loopback port
to this socket (:mod:`~trl_agentic.cli_agents.sandbox`): a Unix socket in a directory bound into the sandbox is the
one thing that crosses its network namespace."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

CHUNK = 65536


class Relay:
    """Serves ``path`` on the running event loop, each connection carried to ``127.0.0.1:port``; :meth:`close` ends
    the server and every connection it carries."""

    def __init__(self, path: Path, port: int) -> None:
        self.path, self.port = path, port
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._carry, path=str(self.path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until either end closes, then half-close ``writer``."""
    with contextlib.suppress(OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
