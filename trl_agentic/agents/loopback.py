"""An ASGI app served by uvicorn on a free port of 127.0.0.1, on a daemon thread of its own: the agents' endpoint
(:mod:`~trl_agentic.agents.server`) and the seats' server (:mod:`~trl_agentic.integrations.seat_server`). Bound to
the loopback address only: nothing off the machine can connect."""

from __future__ import annotations

import socket
import threading
from typing import Any

LOOPBACK = "127.0.0.1"


class LoopbackServer:
    """``app`` on 127.0.0.1, on a free port (:attr:`port`), served by uvicorn on a daemon thread named ``name``;
    :meth:`stop` ends it. ``options`` are more ``uvicorn.Config`` settings. Raises ``RuntimeError`` when the server
    does not start (uvicorn's own log says why)."""

    def __init__(self, app: Any, name: str, **options: Any) -> None:
        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((LOOPBACK, 0))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", **options)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, name=name,
                                        daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"{name} did not start (see the log above)")
            threading.Event().wait(0.005)

    def stop(self) -> None:
        """Ask uvicorn to exit, wait for its thread (10 s at most), close the socket."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
