"""An HTTP retrieval server speaking Search-R1's API, on the standard library (``http.server``).

``POST /retrieve`` with ``{"queries": ["..."], "topk": 3, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": 1.23}, ...], ...]}`` (one list per query, best first).
With ``return_scores`` false (Search-R1's default) each inner list holds the documents themselves:
``{"result": [[{"id", "contents"}, ...], ...]}``. A missing or zero ``topk`` uses the server's default, as in
Search-R1's ``retrieval_server.py``. ``GET /health`` answers ``{"status": "ok", "documents": N}``.

Bound to 127.0.0.1 by default: the server has no authentication, do not expose it.

Command line::

    python -m trl_agentic.tools.retrieval.server --index indexes/wiki-bm25 --port 8000
    python -m trl_agentic.tools.retrieval.server --corpus corpus.jsonl --port 8000        # BM25 built at start
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["RetrievalServer", "serve", "main"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 << 20
MAX_QUERIES = 4096
MAX_TOPK = 1000


class _BadRequest(ValueError):
    pass


def _parse_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _BadRequest("body must be a JSON object")
    queries = payload.get("queries")
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise _BadRequest("'queries' must be a list of strings")
    if len(queries) > MAX_QUERIES:
        raise _BadRequest(f"at most {MAX_QUERIES} queries per request")
    topk = payload.get("topk")
    if topk in (None, 0):
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise _BadRequest("'topk' must be a non-negative integer")
    topk = min(topk, MAX_TOPK)
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise _BadRequest("'return_scores' must be a boolean")
    return queries, topk, return_scores


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


class _Handler(BaseHTTPRequestHandler):
    server: "RetrievalServer._HTTPServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s - %s", self.address_string(), format % args)

    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path.split("?")[0] in ("/health", "/"):
            owner = self.server.owner
            self._send_json(200, {"status": "ok", "documents": owner.num_documents})
        else:
            self._send_json(404, {"error": f"unknown path {self.path}; use POST /retrieve"})

    def do_POST(self) -> None:  # noqa: N802
        owner = self.server.owner
        if self.path.split("?")[0].rstrip("/") != owner.path.rstrip("/"):
            self._send_json(404, {"error": f"unknown path {self.path}; use POST {owner.path}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._send_json(400, {"error": "bad Content-Length"})
            return
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send_json(413, {"error": f"body larger than {MAX_BODY_BYTES} bytes"})
            return
        body = self.rfile.read(length) if length else b""
        try:
            queries, topk, return_scores = _parse_request(body, owner.default_topk)
        except _BadRequest as exc:
            self._send_json(400, {"error": str(exc)})
            return
        try:
            result = owner.retrieve(queries, topk, return_scores)
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            logger.exception("retrieval failed")
            self._send_json(500, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"})
            return
        self._send_json(200, {"result": result})


class RetrievalServer:
    """Serves a retriever over HTTP (Search-R1's ``/retrieve`` API) from a background thread or the foreground.

    Args:
        retriever: Anything with ``search(queries, topk) -> list[list[{"document", "score"}]]``.
        host: Interface to bind (default 127.0.0.1; the API has no authentication).
        port: TCP port; 0 picks a free one (see :attr:`port` / :attr:`url`).
        default_topk: Used when a request has no (or a zero) ``topk``.
        path: The retrieval endpoint.

    Use as a context manager in tests: ``with RetrievalServer(bm25, port=0) as server: server.url``.
    Requests are handled in threads; searches are serialised by a lock (retrievers need not be thread-safe).
    """

    class _HTTPServer(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        owner: "RetrievalServer"

    def __init__(
        self,
        retriever: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        default_topk: int = 3,
        path: str = "/retrieve",
    ):
        self.retriever = retriever
        self.default_topk = int(default_topk)
        self.path = path
        self._lock = threading.Lock()
        self._httpd = self._HTTPServer((host, int(port)), _Handler)
        self._httpd.owner = self
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

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
        if not queries:
            return []
        with self._lock:
            hits = self.retriever.search(queries, topk)
        if return_scores:
            return [[{"document": _jsonable(h["document"]), "score": float(h["score"])} for h in row] for row in hits]
        return [[_jsonable(h["document"]) for h in row] for row in hits]

    def start(self) -> "RetrievalServer":
        """Serve from a daemon thread and return at once."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True, name="retrieval-server"
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted."""
        try:
            self._httpd.serve_forever(poll_interval=0.5)
        finally:
            self._httpd.server_close()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "RetrievalServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve(
    retriever: Any, host: str = "127.0.0.1", port: int = 8000, *, default_topk: int = 3, block: bool = True
) -> RetrievalServer:
    """Serve ``retriever`` with Search-R1's API. ``block=True`` serves until interrupted; ``block=False`` returns
    the started :class:`RetrievalServer` (call ``stop()`` when done)."""
    server = RetrievalServer(retriever, host, port, default_topk=default_topk)
    if block:
        logger.info("retrieval server listening on %s", server.url)
        print(f"retrieval server listening on {server.url}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        return server
    return server.start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a retrieval index with Search-R1's HTTP API.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--index", help="directory written by BM25Retriever.save or DenseRetriever.save")
    source.add_argument("--corpus", help="JSONL corpus ({'id','contents'} rows) to index with BM25 at start-up")
    parser.add_argument("--encoder", default=None, help="encoder path for a dense index (overrides the saved one)")
    parser.add_argument("--save-index", default=None, help="with --corpus: also save the built BM25 index here")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=3, help="default topk when a request has none")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.index:
        from .loader import load_retriever

        kwargs = {"encoder": args.encoder} if args.encoder else {}
        retriever = load_retriever(args.index, **kwargs)
    else:
        from .bm25 import BM25Retriever

        retriever = BM25Retriever.from_jsonl(args.corpus)
        if args.save_index:
            retriever.save(args.save_index)
    serve(retriever, args.host, args.port, default_topk=args.topk, block=True)


if __name__ == "__main__":
    main()
