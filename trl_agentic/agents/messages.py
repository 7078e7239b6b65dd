"""Anthropic's Messages API (``POST /v1/messages``), served over the same records as chat completions, so that agents
written with the Anthropic SDK (or a gateway's ``base_url``) train too.

A request is read into a :class:`~trl_agentic.agents.protocol.ChatRequest` (``system`` a system message, content
blocks chat messages, tools chat tools): the same recorded ids as the same conversation sent to
``/v1/chat/completions``. The reply is answered as a ``message`` object (``text`` and ``tool_use`` content blocks), or
as the Messages event stream. The key is the path's (``/t/<key>``, the Anthropic SDK's ``base_url`` is the endpoint
without ``/v1``), else the ``x-api-key`` header's.

What is read: ``system`` (a string or text blocks), ``messages`` (``user``: ``text`` and ``tool_result`` blocks, each
result a tool message, its content a string or text blocks; ``assistant``: ``text`` and ``tool_use`` blocks, as one
assistant message with its calls, ``thinking`` blocks dropped; ``system``: text, a system message where it stands, as
Claude Code sends its agent and skill lists; other blocks refused; ``cache_control`` ignored), ``tools`` (client
tools: ``name``, ``description``, ``input_schema``; server tools refused), ``tool_choice`` (``auto``, ``any`` as
``"required"``, ``tool`` as a named function, ``none``; see :mod:`~trl_agentic.agents.forcing`), ``max_tokens``,
``stop_sequences``, ``stream``, ``model``; ``context_management`` (its ``clear_thinking_*`` edits only: earlier
thinking is never rendered here; other edits, which would rewrite the history, are refused), ``output_config``
(``effort`` ignored; a ``format`` is not enforced and makes the request an auxiliary call,
:mod:`~trl_agentic.agents.auxiliary`). ``temperature``, ``top_p``, ``top_k``, ``metadata``, ``thinking``, the
``beta`` query and the ``anthropic-beta`` header are accepted and ignored (the training's sampling settings win). A
turn that stopped at a stop sequence reports ``end_turn`` (which sequence is not tracked).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterator

from .auxiliary import auxiliary_kind
from .protocol import ChatRequest, Limits, Reply, RequestError, check_request, load_json, normalize_message

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _fail(message: str, param: str) -> RequestError:
    return RequestError(400, message, param)


def parse_messages(body: bytes, limits: Limits) -> ChatRequest:
    """Read and check a Messages request body into a :class:`ChatRequest`; :class:`RequestError` (400) naming the
    field at the first problem."""
    data = load_json(body)
    system = data.get("system")
    messages = [] if system is None else [normalize_message({"role": "system", "content": system}, "system")]
    value = data.get("messages")
    if not isinstance(value, list) or not value:
        raise _fail("'messages' must be a non-empty list", "messages")
    if len(value) > limits.max_messages:
        raise _fail(f"at most {limits.max_messages} messages per request, got {len(value)}", "messages")
    for i, message in enumerate(value):
        messages += _chat_messages(message, f"messages[{i}]")
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _fail("'tools' must be a list", "tools")
    chat_tools = [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools or [])]
    _check_context_management(data.get("context_management"))
    output = data.get("output_config")
    if output is not None and not isinstance(output, dict):
        raise _fail("'output_config' must be an object", "output_config")
    request = check_request({"messages": messages, "tools": chat_tools or None,
                             "tool_choice": _tool_choice(data.get("tool_choice")), "max_tokens": data.get("max_tokens"),
                             "stop": data.get("stop_sequences"), "stream": data.get("stream"),
                             "model": data.get("model")}, limits)
    request.auxiliary = auxiliary_kind(data)
    return request


def _check_context_management(value: Any) -> None:
    """``context_management``: only edits that clear earlier thinking (never rendered here) are served."""
    if value is None:
        return
    edits = value.get("edits", []) if isinstance(value, dict) else None
    if not isinstance(edits, list):
        raise _fail("'context_management' must be an object with a list of 'edits'", "context_management")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not isinstance(kind, str) or not kind.startswith("clear_thinking_"):
            raise _fail(f"context_management.edits[{i}]: {str(kind)[:40]!r} is not served (it would rewrite the "
                        "history the policy is trained on); only clear_thinking_* edits are (earlier thinking is "
                        "never rendered here)", f"context_management.edits[{i}]")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _fail(f"{where}.content must be a string or a list of content blocks", f"{where}.content")
    return content


def _chat_messages(message: Any, where: str) -> list[dict[str, Any]]:
    """One Messages message as chat messages: a user turn's tool results first (tool messages), then its text; a
    system message where it stands."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise _fail(f"{where} must be an object with role 'user', 'assistant' or 'system'", f"{where}.role")
    if message["role"] == "system":
        return [normalize_message({"role": "system", "content": message.get("content")}, where)]
    texts, calls, results = [], [], []
    for j, block in enumerate(_blocks(message.get("content"), where)):
        spot, kind = f"{where}.content[{j}]", block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and message["role"] == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _fail(f"{spot} needs 'id' and 'name'", spot)
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input") or {}}})
        elif kind == "tool_result" and message["role"] == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise _fail(f"{spot}.tool_use_id must be a string", f"{spot}.tool_use_id")
            results.append(normalize_message({"role": "tool", "tool_call_id": block["tool_use_id"],
                                              "content": block.get("content")}, spot))
        elif kind not in ("thinking", "redacted_thinking"):
            raise _fail(f"{spot}: {str(kind)[:40]!r} blocks are not served here (text, tool_use, tool_result)", spot)
    chat = {"role": message["role"], "content": "\n".join(texts)}
    if calls:
        chat["tool_calls"] = calls
    return results + ([normalize_message(chat, where)] if texts or calls or not results else [])


def _chat_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise _fail(f"{where}: {str(kind)[:40]!r} is not served: only client tools are ({{'name', 'description', "
                    "'input_schema'}), which the client runs; the endpoint runs no server tool", where)
    function = {"name": tool["name"]}
    if "description" in tool:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("input_schema", {})
    return {"type": "function", "function": function}


def _tool_choice(value: Any) -> Any:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": value.get("name")}}
    if kind not in _CHOICES:
        raise _fail("tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                    "tool_choice")
    return _CHOICES[kind]


def _content(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.content}] if reply.content else []
    blocks += [{"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                "input": call["function"]["arguments"]} for call in reply.tool_calls]
    return blocks


def _stop_reason(reply: Reply) -> str:
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(reply.finish_reason, "end_turn")


def message_body(reply: Reply, request: ChatRequest, model: str) -> dict[str, Any]:
    """The ``message`` object; it also carries ``token_ids`` (the ids recorded for training)."""
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model,
            "content": _content(reply), "stop_reason": _stop_reason(reply), "stop_sequence": None,
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": len(reply.token_ids)},
            "token_ids": reply.token_ids}


def message_events(reply: Reply, request: ChatRequest, model: str) -> Iterator[str]:
    """The same answer as the Messages event stream (``message_start``, each block's start, one delta and stop,
    ``message_delta``, ``message_stop``); the turn is generated whole before the first event."""
    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    body = message_body(reply, request, model)
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"], "output_tokens": 0}}
    yield event("message_start", message=start)
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": block["text"]})
        else:
            yield event("content_block_start", index=index, content_block={**block, "input": {}})
            yield event("content_block_delta", index=index,
                        delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
        yield event("content_block_stop", index=index)
    yield event("message_delta", delta={"stop_reason": body["stop_reason"], "stop_sequence": None},
                usage={"output_tokens": body["usage"]["output_tokens"]})
    yield event("message_stop")
