"""The HTTP side of :class:`~.server.RetrievalServer`, on FastAPI and uvicorn (Search-R1's own stack).

Two pieces, each with one job (the connection under them is :mod:`.protocol`'s):

- :func:`build_app`: the FastAPI app. ``POST /retrieve`` (Search-R1's API), ``GET /health``, the OpenAPI page at
  ``/docs``. Every error is a one-line ``{"error": ...}`` with a 4xx/5xx status. A request's queries are searched
  :data:`CHUNK_QUERIES` at a time; one whose client disconnects stops at the next chunk.
- :class:`BodyGuard`: ASGI middleware that reads each request body before the app sees it, within a size limit
  (413 past it, after reading and discarding up to ``drain_bytes`` more so that the client gets the answer
  instead of a reset while it is still sending) and an idle timeout (408 when the body stalls).

Imported only when a server is built: ``import trl_agentic.tools`` never loads fastapi or uvicorn.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

__all__ = ["build_app", "BodyGuard", "error_body", "MAX_QUERIES", "MAX_TOPK", "DRAIN_BYTES"]

MAX_QUERIES = 4096
MAX_TOPK = 1000
DRAIN_BYTES = 64 << 20
CHUNK_QUERIES = 64
"""Queries searched per worker call: between chunks the lock is free for other requests, and a request whose client
has disconnected is abandoned."""


class _Owner(Protocol):
    """What the app needs from :class:`~.server.RetrievalServer`."""

    default_topk: int
    num_documents: int | None

    def retrieve(self, queries: list[str], topk: int, return_scores: bool) -> list[list[Any]]: ...


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class RetrieveRequest(BaseModel):
    """The body of ``POST /retrieve`` (Search-R1's ``QueryRequest``), validated strictly."""

    queries: Annotated[list[StrictStr], Field(max_length=MAX_QUERIES), BeforeValidator(_as_list)] = Field(
        description=f"The queries (a single string is accepted too), at most {MAX_QUERIES}."
    )
    topk: Annotated[StrictInt, Field(ge=0)] | None = Field(
        None, description=f"Passages per query; missing or 0: the server's default; at most {MAX_TOPK}."
    )
    return_scores: StrictBool = Field(
        False, description="true: hits {document, score}; false (Search-R1's default): the documents themselves."
    )


class Document(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    contents: str


class Hit(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    result: list[list[Hit] | list[Document]] = Field(description="One list per query, best first.")


class Health(BaseModel):
    status: str
    documents: int | None


def _one_line(exc: ValidationError) -> str:
    """The first few validation errors as ``field: message; ...``."""
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts).replace("\n", " ") + more


def _json(status: int, payload: Any) -> Response:
    return Response(json.dumps(payload, ensure_ascii=False).encode("utf-8"), status, media_type="application/json")


def build_app(owner: _Owner, path: str = "/retrieve") -> FastAPI:
    """The FastAPI app serving ``owner`` (``retrieve``, ``num_documents``, ``default_topk``) at ``path``."""
    app = FastAPI(
        title="trl-agentic retrieval server",
        description="Search-R1's retrieval API: `POST /retrieve` with `{queries, topk, return_scores}`.",
        version="1",
    )
    request_schema = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": RetrieveRequest.model_json_schema()}},
        }
    }

    async def retrieve(request: Request) -> Response:
        # The body is read and parsed here (not by FastAPI) so that any content type is accepted, as Search-R1
        # clients and ``urllib`` send various ones, and every error is a 400 with one line.
        try:
            query = RetrieveRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            return _json(400, {"error": f"bad request: {_one_line(exc)}"})
        topk = min(query.topk or owner.default_topk, MAX_TOPK)
        result: list[list[Any]] = []
        for start in range(0, len(query.queries), CHUNK_QUERIES):
            if await request.is_disconnected():  # the client gave up: the rest would never be read
                return _json(499, {"error": "the client closed the connection"})
            try:
                result += await run_in_threadpool(owner.retrieve, query.queries[start: start + CHUNK_QUERIES], topk,
                                                  query.return_scores)
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                return _json(500, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"})
        return _json(200, {"result": result})

    def health() -> dict[str, Any]:
        return {"status": "ok", "documents": owner.num_documents}

    summary = "Top-k passages for each query (Search-R1's API)"
    for route, shown in ((path, True), (path.rstrip("/") + "/", False)):
        app.add_api_route(
            route,
            retrieve,
            methods=["POST"],
            response_model=RetrieveResponse,
            openapi_extra=request_schema,
            summary=summary,
            include_in_schema=shown,
        )
    app.add_api_route("/health", health, methods=["GET"], response_model=Health, summary="Liveness and corpus size")
    app.add_api_route("/", health, methods=["GET"], include_in_schema=False)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = str(exc.detail)
        if exc.status_code in (404, 405):
            message = f"{request.method} {request.url.path}: {message.lower()}; use POST {path} or GET /health"
        return _json(exc.status_code, {"error": message})

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Response:
        return _json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    return app


def error_body(message: str) -> bytes:
    """The body of every error answer: ``{"error": message}`` in one line of JSON."""
    return json.dumps({"error": message}).encode("utf-8")


async def _send_error(send: Any, status: int, message: str) -> None:
    body = error_body(message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyGuard:
    """ASGI middleware: read the whole request body within ``max_bytes`` and ``idle_timeout``, then hand it on.

    Past ``max_bytes`` the rest of the body is read and discarded (at most ``drain_bytes`` more, or none when
    ``Content-Length`` already says that it would be more) and the answer is 413, so that a client that is still
    sending reads the answer instead of a reset. A body that stalls for ``idle_timeout`` seconds gets 408. Both close
    the connection.
    """

    def __init__(self, app: Any, max_bytes: int, idle_timeout: float, drain_bytes: int = DRAIN_BYTES):
        self.app, self.max_bytes, self.idle_timeout, self.drain_bytes = app, max_bytes, idle_timeout, drain_bytes

    def _too_large(self, size: int | str) -> str:
        return (
            f"request body of {size} bytes is larger than this server's limit of {self.max_bytes} bytes; "
            "send fewer queries per request"
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and int(declared) > self.max_bytes + self.drain_bytes:  # h11 checked the digits
            await _send_error(send, 413, self._too_large(int(declared)))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.idle_timeout)
            except asyncio.TimeoutError:
                await _send_error(send, 408, f"the request body stalled for {self.idle_timeout:g} s")
                return
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size <= self.max_bytes:
                chunks.append(body)
            if not message.get("more_body", False) or size > self.max_bytes + self.drain_bytes:
                break
        if size > self.max_bytes:
            await _send_error(send, 413, self._too_large(f"at least {size}" if message.get("more_body") else size))
            return
        whole = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # the body is over: only a disconnect can come

        await self.app(scope, replay, send)
