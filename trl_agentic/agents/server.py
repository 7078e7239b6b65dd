"""The OpenAI-compatible endpoint: a FastAPI app served by uvicorn on 127.0.0.1, on a thread of its own.

Routes (each under ``/v1`` and under ``/t/<key>/v1``, the per-trajectory base URL):

- ``POST .../chat/completions``: one model call of the trajectory the key names (:mod:`trl_agentic.agents.session`),
  generated in a batch with the other agents' calls (:mod:`trl_agentic.agents.bridge`); JSON, or server-sent events
  with ``"stream": true``;
- ``POST .../responses``: the same, asked and answered in the Responses API's shapes
  (:mod:`trl_agentic.agents.responses`);
- ``POST .../completions``: legacy completions, a prompt string continued (:mod:`trl_agentic.agents.completions`);
- ``POST .../messages``: Anthropic's Messages API (:mod:`trl_agentic.agents.messages`), and
  ``POST .../messages/count_tokens``: the tokens of such a request's conversation as the chat template renders it;
- ``GET .../models``: the one model served;
- ``GET`` / ``HEAD`` ``/`` (and ``/t/<key>``): a health check that needs no key (Claude Code sends one first).

The key is the path's (``/t/<key>/v1``), else the ``Authorization: Bearer <key>`` header's (or ``x-api-key``'s): a base URL that names its
trajectory works for agents that share one process-wide API key. Answers, with OpenAI's error body: 400 malformed
request (the field named), 401 unknown key, 404 unknown route, 409 the trajectory has ended, or the request was sent
by another trajectory's agent, or it carries no proof of its sender and does not continue the conversation its key
recorded (:mod:`trl_agentic.agents.ownership`), 413 body over ``max_request_bytes``. None of them touches another
trajectory, the batch or the server.

Security: the socket is bound to 127.0.0.1 only (nothing off the machine can connect); keys are 32 random bytes
(``secrets``), one per trajectory, so an agent can write only into its own trajectory; the body is read with a cap
before it is parsed; every string of a request is untrusted text (:mod:`trl_agentic.agents.prompt`).
"""

import asyncio
import logging
import re
import secrets
import threading
from collections import OrderedDict
from typing import Any, Callable

from .bridge import GenerationBridge
from .completions import parse_completion, text_completion_body, text_completion_events
from .loopback import LOOPBACK, LoopbackServer
from .messages import message_body, message_events, parse_messages
from .ownership import CALLER_HEADER, MIXED
from .protocol import (
    ChatRequest,
    Limits,
    Reply,
    RequestError,
    completion_body,
    error_body,
    models_body,
    parse_request,
    stream_events,
)
from .responses import ResponsesRequest, parse_responses, reply_message, response_body, response_events, response_id
from .session import Session, Turn

logger = logging.getLogger(__name__)

ROUTES = (("POST", "/chat/completions"), ("POST", "/responses"), ("POST", "/completions"), ("POST", "/messages"),
          ("POST", "/messages/count_tokens"), ("GET", "/models"))
"""The routes (method, path after ``/v1``)."""
SERVED = tuple(f"{method} /v1{path}" for method, path in ROUTES)
"""The routes, as an unserved path's error lists them."""
KEYED_PATH = re.compile(r"/t/[^/]*/")
CLOSED_KEYS_KEPT = 65536
"""Keys of ended trajectories remembered (their late requests answer 409 instead of 401)."""


def new_key() -> str:
    """An unguessable per-trajectory key (256 random bits)."""
    return "tak-" + secrets.token_urlsafe(32)


class Registry:
    """The sessions of the running rollout, by key and by sender id, and the keys of ended ones."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.callers: dict[str, Session] = {}
        self.closed: "OrderedDict[str, None]" = OrderedDict()
        self._lock = threading.Lock()

    def add(self, sessions: "list[Session]") -> None:
        with self._lock:
            self.sessions.update({s.key: s for s in sessions})
            self.callers.update({s.caller_id: s for s in sessions})

    def retire(self, sessions: "list[Session]") -> None:
        with self._lock:
            for s in sessions:
                self.sessions.pop(s.key, None)
                self.callers.pop(s.caller_id, None)
                self.closed[s.key] = None
            while len(self.closed) > CLOSED_KEYS_KEPT:
                self.closed.popitem(last=False)

    def blame(self, caller: str) -> None:
        """The agent of trajectory ``caller`` (its sender id) sent a request through another trajectory's client: its
        trajectory fails (:data:`~trl_agentic.agents.ownership.MIXED`)."""
        with self._lock:
            sender = self.callers.get(caller)
        if sender is not None:
            sender.fail(("env_error", MIXED))

    def get(self, key: str | None, caller: str | None = None) -> Session:
        """The session ``key`` names. ``caller``: the sender id a request carries (:mod:`.ownership`); a request
        sent by another trajectory's agent is refused and fails the sender's trajectory (the key's record stays
        clean)."""
        with self._lock:
            session = self.sessions.get(key or "")
            if caller is not None and (session is None or caller != session.caller_id):
                sender = self.callers.get(caller)
                if sender is not None or session is not None:
                    if sender is not None:
                        sender.fail(("env_error", MIXED))
                    raise RequestError(409, MIXED, code="trajectory_mixed")
            if session is None and key in self.closed:
                raise RequestError(409, "this trajectory has ended; its key takes no more requests",
                                   code="trajectory_closed")
        if session is None:
            raise RequestError(401, "unknown API key: each trajectory has its own key, given with its client "
                               "(or its base URL /t/<key>/v1)", code="invalid_api_key")
        return session


def build_app(registry: Registry, bridge: GenerationBridge, limits: Limits, model_name: str) -> Any:
    """The FastAPI app (module docstring). FastAPI reads the handlers' annotations, so they are objects here (this
    module does not postpone annotations) and fastapi is imported only when an app is built (an optional extra)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """An unserved path or method: what is served instead, the path's key never echoed."""
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        path = KEYED_PATH.sub("/t/<key>/", request.url.path)[:200]
        message = (f"{request.method} {path} is not served; served: {', '.join(SERVED)} (each also under "
                   "/t/<key>/v1, the trajectory's base URL)")
        return JSONResponse(error_body(message, kind), status_code=exc.status_code)

    def key_of(request: Request, path_key: str | None) -> str | None:
        if path_key:
            return path_key
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key")

    async def body_of(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        too_large = RequestError(413, f"the request body is over {limits.max_request_bytes} bytes")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_request_bytes:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_request_bytes:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    async def place(request: Request, path_key: str | None,
                    parse: Callable[[bytes, Session], tuple[Any, ChatRequest]]) -> Any:
        """One model call, whichever API asks: ``(session, parsed request, chat request, reply)``, or the error
        response."""
        session: Session | None = None
        try:
            caller = request.headers.get(CALLER_HEADER)
            session = registry.get(key_of(request, path_key), caller)
            parsed, chat = parse(await body_of(request), session)
            placed = session.begin(chat, proven=caller == session.caller_id)
            reply = placed if isinstance(placed, Reply) else await generate(session, placed)
        except RequestError as exc:
            if session is not None and exc.status in (400, 413):
                session.refuse(exc.message)
            return error(exc)
        return session, parsed, chat, reply


    def read_responses(body: bytes, session: Session) -> tuple[ResponsesRequest, ChatRequest]:
        parsed = parse_responses(body, limits, session.recall)
        return parsed, parsed.chat

    def answering(parse: Callable[[bytes, Limits], ChatRequest], body: Callable[[Reply, ChatRequest, str], Any],
                  events: Callable[[Reply, ChatRequest, str], Any]) -> Callable[[Request, str | None], Any]:
        """The handler of an API whose request is a :class:`ChatRequest`: chat or legacy completions."""
        async def handle(request: Request, path_key: str | None) -> Any:
            placed = await place(request, path_key, lambda data, session: (None, parse(data, limits)))
            if not isinstance(placed, tuple):
                return placed
            _, _, chat, reply = placed
            if chat.stream:
                return StreamingResponse(events(reply, chat, model_name), media_type="text/event-stream")
            return JSONResponse(body(reply, chat, model_name))

        return handle

    async def respond(request: Request, path_key: str | None) -> Any:
        placed = await place(request, path_key, read_responses)
        if not isinstance(placed, tuple):
            return placed
        session, parsed, chat, reply = placed
        rid = response_id()
        session.remember(rid, parsed.history + [reply_message(reply)])
        if chat.stream:
            return StreamingResponse(response_events(reply, parsed, model_name, rid), media_type="text/event-stream")
        return JSONResponse(response_body(reply, parsed, model_name, rid))

    async def generate(session: Session, turn: Turn) -> Reply:
        future = bridge.submit(session.key, turn.prompt_ids, turn.max_new_tokens, turn.stop)
        try:
            generation = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            session.abandon(turn)
            if future.cancelled():  # the agent ended while its call waited
                raise RequestError(409, "this trajectory has ended; its key takes no more requests",
                                   code="trajectory_closed") from None
            raise
        except Exception as exc:  # noqa: BLE001 - the generator failed: the rollout stops and says why
            session.abandon(turn)
            raise RequestError(500, f"generation failed: {type(exc).__name__}") from None
        return session.finish(turn, generation)

    async def count_tokens(request: Request, path_key: str | None) -> Any:
        session: Session | None = None
        try:
            session = registry.get(key_of(request, path_key), request.headers.get(CALLER_HEADER))
            tokens = session.prompt_tokens(parse_messages(await body_of(request), limits))
        except RequestError as exc:
            if session is not None and exc.status in (400, 413):
                session.refuse(exc.message)
            return error(exc)
        return JSONResponse({"input_tokens": tokens})

    async def models(request: Request, path_key: str | None) -> Any:
        try:
            registry.get(key_of(request, path_key), request.headers.get(CALLER_HEADER))
        except RequestError as exc:
            return error(exc)
        return JSONResponse(models_body(model_name))

    handlers = {"/chat/completions": answering(parse_request, completion_body, stream_events), "/responses": respond,
                "/completions": answering(parse_completion, text_completion_body, text_completion_events),
                "/messages": answering(parse_messages, message_body, message_events),
                "/messages/count_tokens": count_tokens, "/models": models}
    for method, path in ROUTES:  # each under /v1 and under the trajectory's own /t/<key>/v1
        add_routes(app, method, path, handlers[path])

    async def health() -> Any:
        return JSONResponse({})

    for path in ("/", "/t/{key}", "/t/{key}/"):
        app.add_api_route(path, health, methods=["GET", "HEAD"])
    return app


def add_routes(app: Any, method: str, path: str, handler: Callable[[Any, str | None], Any]) -> None:
    """``method /v1<path>`` (the key in the header) and ``method /t/<key>/v1<path>`` (the key in the path), both
    served by ``handler(request, path_key)``."""
    from fastapi import Request

    async def bare(request: Request) -> Any:
        return await handler(request, None)

    async def keyed(key: str, request: Request) -> Any:
        return await handler(request, key)

    app.add_api_route(f"/v1{path}", bare, methods=[method])
    app.add_api_route(f"/t/{{key}}/v1{path}", keyed, methods=[method])


class AgentServer:
    """The app on 127.0.0.1, on a free port, served by uvicorn on a daemon thread
    (:class:`~trl_agentic.agents.loopback.LoopbackServer`); :meth:`stop` ends it."""

    def __init__(self, registry: Registry, bridge: GenerationBridge, limits: Limits, model_name: str) -> None:
        self._served = LoopbackServer(build_app(registry, bridge, limits, model_name), "the agent endpoint",
                                      timeout_keep_alive=30, backlog=4096, limit_concurrency=None)
        self.port = self._served.port

    def base_url(self, key: str | None = None) -> str:
        """``http://127.0.0.1:<port>/v1``, or with ``key`` the trajectory's own ``.../t/<key>/v1``."""
        return f"http://{LOOPBACK}:{self.port}" + (f"/t/{key}/v1" if key else "/v1")

    def stop(self) -> None:
        self._served.stop()
