"""An HTTP retrieval server speaking Search-R1's API, on FastAPI and uvicorn (Search-R1's own stack).

``POST /retrieve`` with ``{"queries": ["..."], "topk": 3, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": 1.23}, ...], ...]}`` (one list per query, best first).
With ``return_scores`` false (Search-R1's default) each inner list holds the documents themselves:
``{"result": [[{"id", "contents"}, ...], ...]}``. A missing or zero ``topk`` uses the server's default, as in
Search-R1's ``retrieval_server.py``. ``GET /health`` answers ``{"status": "ok", "documents": N}``; the OpenAPI page
is at ``/docs``. Errors are one-line ``{"error": ...}`` answers: 400 for a malformed request (any content type is
read as JSON; a bad ``Content-Length`` or chunk framing, a request head over 16 KiB), 404/405 for a wrong path or
method, 408 when a body stalls, 413 past the body limit, 500 when the retriever fails, 503 past
``max_connections``.

Limits (see :class:`RetrievalServer`): request heads up to 16 KiB, bodies up to 16 MiB, at most 4096 queries and
``topk`` 1000 per request, idle connections closed after 5 s, a listen backlog of 2048. Needs
``pip install trl-agentic[retrieval]`` (fastapi, uvicorn); importing this module does not import them.

Bound to 127.0.0.1 by default: the server has no authentication, do not expose it. The command line is in
:mod:`.server` (``python -m trl_agentic.tools.retrieval.server``).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

__all__ = ["RetrievalServer", "serve"]


MAX_BODY_BYTES = 16 << 20
_HINT = "RetrievalServer needs fastapi and uvicorn: pip install trl-agentic[retrieval]"


def _jsonable(value: Any) -> Any:
    """numpy scalars and other odd values -> plain JSON types."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return str(value)


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6; port 0 picks a free one)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=backlog)


class RetrievalServer:
    """Serves a retriever over HTTP (Search-R1's ``/retrieve`` API) from a background thread or the foreground.

    Args:
        retriever: Anything with ``search(queries, topk) -> list[list[{"document", "score"}]]``.
        host: Interface to bind (default 127.0.0.1; the API has no authentication).
        port: TCP port; 0 picks a free one (see :attr:`port` / :attr:`url`). The socket is bound at once.
        default_topk: Used when a request has no (or a zero) ``topk``.
        path: The retrieval endpoint.
        max_body_bytes: Largest request body; a larger one gets 413 (naming the limit).
        idle_timeout: Seconds a connection may stay silent (before a request, inside one, or between keep-alive
            requests) before it is closed; a stalled body gets 408 first.
        backlog: Listen backlog (connections waiting to be accepted).
        max_connections: Open connections served at once; past it a request gets 503 (which clients retry).

    Use as a context manager in tests: ``with RetrievalServer(bm25, port=0) as server: server.url``.
    Requests are handled on an event loop; searches run in worker threads, serialised by a lock (retrievers need
    not be thread-safe).
    """

    def __init__(
        self,
        retriever: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        default_topk: int = 3,
        path: str = "/retrieve",
        max_body_bytes: int = MAX_BODY_BYTES,
        idle_timeout: float = 5.0,
        backlog: int = 2048,
        max_connections: int = 1024,
    ):
        try:
            import uvicorn

            from .app import BodyGuard, build_app
            from .protocol import MAX_HEAD_BYTES, GuardedH11Protocol
        except ImportError as exc:
            raise ImportError(_HINT) from exc
        self.retriever = retriever
        self.default_topk = int(default_topk)
        self.path = path
        self._lock = threading.Lock()
        self._socket = _listen(host, int(port), int(backlog))
        app = BodyGuard(build_app(self, path), max_bytes=int(max_body_bytes), idle_timeout=float(idle_timeout))
        config = uvicorn.Config(
            app,
            http=GuardedH11Protocol,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_keep_alive=float(idle_timeout),  # type: ignore[arg-type] - used as a float by call_later
            backlog=int(backlog),
            limit_concurrency=int(max_connections),
            timeout_graceful_shutdown=3,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._socket.getsockname()[0])

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        """Full endpoint URL, e.g. ``http://127.0.0.1:8000/retrieve``."""
        host = self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}{self.path}"

    @property
    def num_documents(self) -> int | None:
        try:
            return len(self.retriever)
        except TypeError:
            return None

    def retrieve(self, queries: list[str], topk: int, return_scores: bool) -> list[list[Any]]:
        """One search for ``queries`` (called by the app, in a worker thread)."""
        if not queries:
            return []
        with self._lock:
            hits = self.retriever.search(queries, topk)
        if return_scores:
            return [[{"document": _jsonable(h["document"]), "score": float(h["score"])} for h in row] for row in hits]
        return [[_jsonable(h["document"]) for h in row] for row in hits]

    def start(self, timeout: float = 30.0) -> "RetrievalServer":
        """Serve from a daemon thread; return once the server accepts requests."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True, name="retrieval-server"
            )
            self._thread.start()
            deadline = time.monotonic() + timeout
            while not self._server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the retrieval server on {self.url} did not start (see the log)")
                time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (SIGINT / SIGTERM stop it gracefully)."""
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._socket.close()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._thread = None
        self._socket.close()

    def __enter__(self) -> "RetrievalServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve(
    retriever: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    default_topk: int = 3,
    block: bool = True,
    **kwargs: Any,
) -> RetrievalServer:
    """Serve ``retriever`` with Search-R1's API. ``block=True`` serves until interrupted; ``block=False`` returns
    the started :class:`RetrievalServer` (call ``stop()`` when done). ``kwargs`` go to :class:`RetrievalServer`."""
    server = RetrievalServer(retriever, host, port, default_topk=default_topk, **kwargs)
    if block:
        print(f"retrieval server listening on {server.url}", flush=True)  # once: not also logged
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        return server
    return server.start()
