"""OpenAI's chat-completions shapes: a request read and checked into :class:`ChatRequest`, the response, its
server-sent-event stream, and the error body.

Everything a request carries is untrusted: the body is parsed here by hand (not by a validation model) so that every
problem answers HTTP 400 with OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``) naming the
field, and so that the caps (:class:`Limits`) hold before anything is rendered or tokenized.

What is read (the rest of OpenAI's fields, ``temperature``, ``top_p``, ``seed``, penalties, ``user``, ``metadata``,
``parallel_tool_calls``, ..., is accepted and ignored: the training's sampling settings win, so that the samples are
the policy's):

- ``messages``: roles ``system`` (``developer`` reads as ``system``), ``user``, ``assistant`` (``content`` and
  ``tool_calls``), ``tool`` (``content``, ``tool_call_id``); content a string or a list of text parts. The last
  message may not be an assistant message (continuing one is not supported).
- ``tools`` (functions only), ``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function",
  "function": {"name"}}``: the last two open the turn with a call, :mod:`~trl_agentic.agents.forcing`), ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``logprobs`` /
  ``top_logprobs``, ``n`` (1 only), ``stream`` and ``stream_options.include_usage``, ``response_format`` (``text``).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

ROLES = ("system", "user", "assistant", "tool")
NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
"""A function name as OpenAI accepts it (plus ``.`` and ``:``, which MCP tool names use)."""


@dataclass(frozen=True)
class Limits:
    """Caps on one request, checked before anything is rendered.

    Attributes:
        max_request_bytes: Largest request body (HTTP 413 above it).
        max_messages: Most messages in one request.
        max_tools: Most tools in one request.
        max_stop: Most stop strings in one request (each at most 256 characters).
    """

    max_request_bytes: int = 4 * 1024 * 1024
    max_messages: int = 512
    max_tools: int = 128
    max_stop: int = 16


class RequestError(Exception):
    """A request the endpoint refuses: HTTP ``status`` and OpenAI's error body."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             409: "conflict_error", 413: "invalid_request_error", 500: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.TYPES.get(self.status, "invalid_request_error"), self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class ChatRequest:
    """One checked chat-completions request.

    Attributes:
        messages: The messages in the form chat templates read (:func:`normalize_message`).
        tools: The tools' JSON schemas, ``{"type": "function", "function": {...}}``.
        tool_calls_allowed: ``False`` for ``tool_choice="none"``: the reply is text, never parsed into calls.
        forced_call: The function a call must be opened with: ``""`` for ``tool_choice="required"`` (any), its name
            for a named function, ``None`` otherwise.
        max_tokens: The request's own cap on sampled tokens (``None``: the training's budgets alone).
        stop: The request's stop strings.
        logprobs: Return the log-prob of each sampled token (when the generation backend reports them).
        stream: Answer with server-sent events.
        include_usage: With ``stream``, end with a chunk carrying ``usage``.
        model: The model name the client sent (echoed back; any name is served by the policy).
        prompt: Legacy completions only (:mod:`~trl_agentic.agents.completions`): the prompt text, ``messages``
            then empty.
        auxiliary: The kind of auxiliary call the request is (:mod:`~trl_agentic.agents.auxiliary`: a title, a
            summary, a quota check beside the task's conversation; read from Messages and Responses requests),
            ``None`` for the task's conversation.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_calls_allowed: bool = True
    forced_call: str | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    prompt: str | None = None
    auxiliary: str | None = None


def _fail(message: str, param: str | None = None, code: str | None = None) -> RequestError:
    return RequestError(400, message, param, code)


def parse_request(body: bytes, limits: Limits) -> ChatRequest:
    """Read and check a request body; raises :class:`RequestError` (400) naming the field at the first problem."""
    return check_request(load_json(body), limits)


def load_json(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object (400 otherwise)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise _fail("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise _fail("the request body must be a JSON object")
    return data


def check_request(data: dict[str, Any], limits: Limits) -> ChatRequest:
    """Check a chat-completions request (a JSON object) into a :class:`ChatRequest`; :class:`RequestError` (400)
    naming the field at the first problem."""
    for legacy in ("functions", "function_call"):
        if data.get(legacy) is not None:
            raise _fail(f"{legacy!r} is not supported; pass 'tools' instead", legacy)
    n = data.get("n")
    if n is not None and n != 1:
        raise _fail("only n=1 is supported: each completion is its own trajectory", "n")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list", "messages")
    if len(messages) > limits.max_messages:
        raise _fail(f"at most {limits.max_messages} messages per request, got {len(messages)}", "messages")
    normalized = [normalize_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    if normalized[-1]["role"] == "assistant":
        raise _fail("the last message may not be an assistant message (continuing one is not supported)", "messages")
    request = ChatRequest(messages=normalized, model=str(data.get("model") or ""))
    request.tools = _tools(data.get("tools"), limits)
    request.tool_calls_allowed, request.forced_call = _tool_choice(data.get("tool_choice"), request.tools)
    request.max_tokens = _max_tokens(data)
    request.stop = _stop(data.get("stop"), limits)
    request.logprobs = _boolean(data, "logprobs")
    top = data.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= 20):
        raise _fail("'top_logprobs' must be an integer from 0 to 20", "top_logprobs")
    request.stream = _boolean(data, "stream")
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _fail("'stream_options' must be an object", "stream_options")
        request.include_usage = bool(options.get("include_usage"))
    response_format = data.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise _fail("only response_format {'type': 'text'} is supported: sampling is not constrained; describe the "
                    "format in the prompt and parse the text", "response_format")
    return request


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _boolean(data: dict[str, Any], name: str) -> bool:
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise _fail(f"'{name}' must be true or false", name)
    return bool(value)


def _max_tokens(data: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = data.get(name)
        if value is not None:
            if not _is_int(value) or value < 1:
                raise _fail(f"'{name}' must be an integer >= 1", name)
            return value
    return None


def _stop(value: Any, limits: Limits) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > limits.max_stop or \
            not all(isinstance(s, str) and 0 < len(s) <= 256 for s in stops):
        raise _fail(f"'stop' must be a string or a list of at most {limits.max_stop} non-empty strings of at most 256 "
                    "characters", "stop")
    return list(dict.fromkeys(stops))


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> tuple[bool, str | None]:
    """(whether the reply is parsed into calls, the call forced: see :attr:`ChatRequest.forced_call`)."""
    if value is None or value == "auto":
        return True, None
    if value == "none":
        return False, None
    names = [tool["function"]["name"] for tool in tools]
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if value != "required" and not isinstance(name, str):
        raise _fail("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
                    "tool_choice")
    if not names:
        raise _fail("tool_choice asks for a call but the request offers no tools", "tool_choice")
    if name is not None and name not in names:
        raise _fail(f"tool_choice names {name[:64]!r}, which is not among the tools ({', '.join(names)[:200]})",
                    "tool_choice")
    return True, name or ""


def _tools(value: Any, limits: Limits) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limits.max_tools:
        raise _fail(f"'tools' must be a list of at most {limits.max_tools} tools", "tools")
    tools = []
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise _fail(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]")
        name, parameters = function.get("name"), function.get("parameters", {})
        if not isinstance(name, str) or not NAME.match(name):
            raise _fail(f"tools[{i}].function.name must match {NAME.pattern}", f"tools[{i}].function.name")
        if not isinstance(parameters, dict) or not isinstance(function.get("description", ""), str):
            raise _fail(f"tools[{i}].function needs 'parameters' as an object and 'description' as a string",
                        f"tools[{i}].function")
        tools.append({"type": "function", "function": dict(function)})  # rendered as sent, as vLLM does
    return tools


def _content(value: Any, where: str) -> str:
    """A message's content as text: a string, ``None`` (empty) or a list of text parts (joined by newlines)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") \
                    and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise _fail(f"{where}.content: only text parts are supported", f"{where}.content")
        return "\n".join(texts)
    raise _fail(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def _arguments(value: Any, where: str) -> Any:
    """A call's arguments as a JSON value (sent as a JSON string, or already decoded)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            raise _fail(f"{where}.function.arguments must be JSON", f"{where}.function.arguments") from None
    return value


def normalize_message(message: Any, where: str) -> dict[str, Any]:
    """A message as chat templates read it: ``role``, ``content`` (text), and ``tool_calls`` (assistant:
    ``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments decoded from JSON) or
    ``tool_call_id`` (tool)."""
    if not isinstance(message, dict):
        raise _fail(f"{where} must be an object", where)
    role = message.get("role")
    role = "system" if role == "developer" else role
    if role not in ROLES:
        raise _fail(f"{where}.role must be one of {', '.join(ROLES)} (or developer), got {role!r}", f"{where}.role")
    out: dict[str, Any] = {"role": role, "content": _content(message.get("content"), where)}
    if role == "assistant" and message.get("tool_calls"):
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            raise _fail(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        out["tool_calls"] = []
        for j, call in enumerate(calls):
            spot = f"{where}.tool_calls[{j}]"
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise _fail(f"{spot} must have function.name", spot)
            out["tool_calls"].append({"id": str(call.get("id") or ""), "type": "function", "function": {
                "name": function["name"], "arguments": _arguments(function.get("arguments"), spot)}})
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise _fail(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
        out["tool_call_id"] = call_id or ""
    return out


def same_message(recorded: dict[str, Any], sent: dict[str, Any]) -> bool:
    """Whether a message the client sent stands for one the trajectory holds: same role, same text (ends'
    whitespace aside) and, for an assistant message, the same calls (names and arguments; call ids aside, since
    clients may rename them and chat templates mostly do not render them)."""
    if recorded["role"] != sent["role"] or recorded["content"].strip() != sent["content"].strip():
        return False
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in recorded.get("tool_calls", [])]
    return calls == [(c["function"]["name"], c["function"]["arguments"]) for c in sent.get("tool_calls", [])]


# -- responses --------------------------------------------------------------------------------------------------
@dataclass
class Reply:
    """One assistant turn to answer with.

    Attributes:
        content: The text of the turn (stop string removed, as OpenAI does).
        tool_calls: ``{"id", "type", "function": {"name", "arguments": dict}}`` each.
        finish_reason: ``"stop"``, ``"length"`` or ``"tool_calls"``.
        token_ids: The sampled ids kept for the turn: exactly the ids recorded and trained on.
        logprobs: Their sampling log-probs, when the generation backend reports them.
        tokens: Their text pieces (for ``logprobs``).
        prompt_tokens: Tokens the model conditioned on.
    """

    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    token_ids: list[int]
    logprobs: list[float] | None
    tokens: list[str]
    prompt_tokens: int


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or (None if reply.tool_calls else "")}
    if reply.tool_calls:
        message["tool_calls"] = [_wire_call(call) for call in reply.tool_calls]
    return message


def _wire_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {"id": call["id"], "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(function["arguments"], ensure_ascii=False)}}


def token_logprobs(reply: Reply) -> list[dict[str, Any]]:
    """Each sampled token's text and log-prob, as OpenAI lists them (no alternatives)."""
    return [{"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
            for token, logprob in zip(reply.tokens, reply.logprobs or [])]


def _logprobs(reply: Reply, wanted: bool) -> dict[str, Any] | None:
    if not wanted or reply.logprobs is None:
        return None
    return {"content": token_logprobs(reply), "refusal": None}


def _usage(reply: Reply) -> dict[str, int]:
    completion = len(reply.token_ids)
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": completion,
            "total_tokens": reply.prompt_tokens + completion}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion_body(reply: Reply, request: ChatRequest, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object; the choice also carries ``token_ids`` (the ids recorded for training)."""
    choice = {"index": 0, "message": _message(reply), "finish_reason": reply.finish_reason,
              "logprobs": _logprobs(reply, request.logprobs), "token_ids": reply.token_ids}
    return {"id": completion_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
            "system_fingerprint": None, "choices": [choice], "usage": _usage(reply)}


def stream_events(reply: Reply, request: ChatRequest, model: str) -> Iterator[str]:
    """The same answer as server-sent events (``chat.completion.chunk`` objects, then ``[DONE]``). The turn is
    generated whole before the first event (turns are generated in batches), so the content comes in one chunk."""
    base = {"id": completion_id(), "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "system_fingerprint": None}

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
        return f"data: {json.dumps({**base, 'choices': [choice]}, ensure_ascii=False)}\n\n"

    yield event({"role": "assistant", "content": ""})
    if reply.content:
        yield event({"content": reply.content}, logprobs=_logprobs(reply, request.logprobs))
    for index, call in enumerate(reply.tool_calls):
        yield event({"tool_calls": [{"index": index, **_wire_call(call)}]})
    yield event({}, reply.finish_reason, token_ids=reply.token_ids)
    if request.include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': _usage(reply)})}\n\n"
    yield "data: [DONE]\n\n"


def models_body(model: str) -> dict[str, Any]:
    """``/v1/models``: the one model served (the policy)."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "trl-agentic"}]}
