"""OpenAI's Responses API (``POST /v1/responses``), served over the same records as chat completions.

A Responses request is read into a :class:`~trl_agentic.agents.protocol.ChatRequest` (its ``input`` items become chat
messages, its function tools chat tools), so it is placed, generated and recorded exactly as the same conversation sent
to ``/v1/chat/completions`` (:mod:`~trl_agentic.agents.session`): the same recorded ids whichever API an agent uses,
and one trajectory may mix both. The reply is answered as a ``response`` object, or as the Responses event stream.

What is read (the rest, ``temperature``, ``top_p``, ``reasoning``, ``truncation``, ``parallel_tool_calls``,
``metadata``, ``user``, ``prompt_cache_key``, ``client_metadata``, ``store``, ..., is accepted and ignored, as for chat
completions):

- ``input``: a string (one user message) or a list of items: messages (``{"role", "content"}``, with or without
  ``"type": "message"``; content a string or ``input_text`` / ``output_text`` parts), ``function_call`` (``call_id``,
  ``name``, ``arguments``, ``namespace``) and ``custom_tool_call`` (``call_id``, ``name``, ``input``), each joined
  to the assistant message before it as a chat message's ``tool_calls``, ``function_call_output`` and
  ``custom_tool_call_output`` (``call_id``, ``output``: a string or text parts; a tool message), and ``reasoning``
  items (dropped: the chat templates served here render no earlier reasoning). Items' ``id`` and ``status`` are
  ignored.
- ``instructions``: a system message before the input (not carried over by ``previous_response_id``, as OpenAI).
- ``previous_response_id``: the id of a response this endpoint gave *in this trajectory*; its conversation (input and
  output) comes before the new input. Any other id is refused (400): send the whole conversation in ``input``.
  Nothing is stored beyond the trajectory, whatever ``store`` says.
- ``tools``: ``function``, ``namespace`` and ``custom`` tools, as chat functions
  (:mod:`~trl_agentic.agents.response_tools`, which also answers each call as the item its tool type expects); other
  tool types are refused. ``tool_choice``: as for chat completions (``"auto"``, ``"none"``, ``"required"``,
  ``{"type": "function" | "custom", "name"}``).
- ``max_output_tokens``, ``stream``, ``text.format`` (``text`` only), ``include`` (``message.output_text.logprobs``;
  ``reasoning.encrypted_content`` asks for nothing here: no reasoning item is given), ``model``.

The response carries ``token_ids``: the sampled ids kept for the turn, exactly the ids recorded and trained on.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .auxiliary import auxiliary_kind
from .protocol import (
    ChatRequest,
    Limits,
    Reply,
    RequestError,
    check_request,
    load_json,
    normalize_message,
    token_logprobs,
)
from .response_tools import ToolKinds, chat_tools, history_call, output_item

LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass
class ResponsesRequest:
    """One checked Responses request.

    Attributes:
        chat: The request as chat completions read it (instructions, earlier conversation and input as messages).
        history: Its conversation without the instructions: what a later ``previous_response_id`` continues.
        instructions: The ``instructions`` sent.
        previous_response_id: The ``previous_response_id`` sent.
        tools: The tools as sent (echoed in the response).
        tool_choice: The ``tool_choice`` as sent (echoed).
        max_output_tokens: The ``max_output_tokens`` sent.
        kinds: Which chat functions stand for namespaced functions and custom tools (how calls are answered).
    """

    chat: ChatRequest
    history: list[dict[str, Any]]
    instructions: str | None
    previous_response_id: str | None
    tools: list[dict[str, Any]]
    tool_choice: Any
    max_output_tokens: int | None
    kinds: ToolKinds


def _fail(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, param)


def parse_responses(body: bytes, limits: Limits,
                    recall: Callable[[str], list[dict[str, Any]] | None]) -> ResponsesRequest:
    """Read and check a Responses request body; ``recall`` gives the conversation of a response this trajectory was
    given (``None`` for an id it was not). :class:`RequestError` (400) naming the field at the first problem."""
    data = load_json(body)
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _fail("'instructions' must be a string", "instructions")
    previous = data.get("previous_response_id")
    earlier: list[dict[str, Any]] = []
    if previous is not None:
        recalled = recall(previous) if isinstance(previous, str) else None
        if recalled is None:
            raise _fail(f"previous_response_id {str(previous)[:64]!r} was not given in this trajectory: send the whole "
                        "conversation in 'input' (nothing is stored beyond a trajectory)", "previous_response_id")
        earlier = recalled
    history = earlier + _messages(data.get("input"), limits)
    system = [{"role": "system", "content": instructions}] if instructions is not None else []
    text = data.get("text")
    if text is not None and (not isinstance(text, dict) or text.get("format", {"type": "text"}) != {"type": "text"}):
        raise _fail("only text.format {'type': 'text'} is supported: sampling is not constrained; describe the format "
                    "in the prompt and parse the text", "text")
    include = data.get("include") or []
    if not isinstance(include, list):
        raise _fail("'include' must be a list", "include")
    limit = data.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise _fail("'max_output_tokens' must be an integer >= 1", "max_output_tokens")
    tools, kinds = chat_tools(data.get("tools"))
    tool_choice = data.get("tool_choice")
    if isinstance(tool_choice, dict) and tool_choice.get("type") in ("function", "custom") and "name" in tool_choice:
        tool_choice = {"type": "function", "function": {"name": tool_choice["name"]}}
    chat = check_request({"messages": system + history, "tools": tools or None, "tool_choice": tool_choice,
                          "max_tokens": limit, "stream": data.get("stream"),
                          "logprobs": LOGPROBS_INCLUDE in include, "model": data.get("model")}, limits)
    chat.auxiliary = auxiliary_kind(data)
    return ResponsesRequest(chat, chat.messages[len(system):], instructions, previous, list(data.get("tools") or []),
                            data.get("tool_choice", "auto"), chat.max_tokens, kinds)


def _messages(value: Any, limits: Limits) -> list[dict[str, Any]]:
    """``input`` as chat messages (module docstring), each checked and named by its item."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _fail("'input' must be a string or a non-empty list of items", "input")
    if len(value) > limits.max_messages:
        raise _fail(f"at most {limits.max_messages} input items per request, got {len(value)}", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _fail(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(normalize_message({"role": item.get("role"), "content": item.get("content")}, where))
        elif kind in ("function_call", "custom_tool_call"):
            call = normalize_message({"role": "assistant", "tool_calls": [history_call(item, where)]},
                                     where)["tool_calls"][0]
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the turn's text and its calls: one chat message
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise _fail(f"{where}.call_id must be a string", f"{where}.call_id")
            messages.append(normalize_message({"role": "tool", "tool_call_id": item["call_id"],
                                               "content": item.get("output")}, where))
        elif kind != "reasoning":
            raise _fail(f"{where}: items of type {str(kind)[:40]!r} are not served (message, function_call, "
                        "function_call_output, custom_tool_call, custom_tool_call_output, reasoning)", f"{where}.type")
    return messages


def reply_message(reply: Reply) -> dict[str, Any]:
    """The assistant message a reply stands for, as a conversation holds it."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def _output(reply: Reply, request: ResponsesRequest, done: bool = True) -> list[dict[str, Any]]:
    """The output items: a ``message`` (when there is text, or nothing else), then one item per call
    (:func:`~trl_agentic.agents.response_tools.output_item`)."""
    status = "completed" if done else "in_progress"
    items: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        logprobs = token_logprobs(reply) if request.chat.logprobs else []
        part = {"type": "output_text", "text": reply.content, "annotations": [], "logprobs": logprobs}
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": status, "role": "assistant",
                      "content": [part] if done else []})
    items += [output_item(call, request.kinds, done) for call in reply.tool_calls]
    return items


def response_body(reply: Reply, request: ResponsesRequest, model: str, rid: str,
                  output: list[dict[str, Any]] | None = None, status: str | None = None) -> dict[str, Any]:
    """The ``response`` object (``status`` and ``output`` given while streaming)."""
    incomplete = reply.finish_reason == "length"
    status = status or ("incomplete" if incomplete else "completed")
    completed = status in ("completed", "incomplete")
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
            "completed_at": int(time.time()) if completed else None, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete and completed else None,
            "instructions": request.instructions, "max_output_tokens": request.max_output_tokens, "model": model,
            "output": _output(reply, request) if output is None else output, "parallel_tool_calls": True,
            "previous_response_id": request.previous_response_id, "store": False, "temperature": None,
            "text": {"format": {"type": "text"}}, "tool_choice": request.tool_choice, "tools": request.tools,
            "top_p": None, "truncation": "disabled", "metadata": {},
            "usage": {"input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": len(reply.token_ids), "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": reply.prompt_tokens + len(reply.token_ids)} if completed else None,
            "token_ids": reply.token_ids if completed else None}


def response_events(reply: Reply, request: ResponsesRequest, model: str, rid: str) -> Iterator[str]:
    """The same answer as the Responses event stream (``response.created`` ... ``response.completed``, or
    ``response.incomplete``). The turn is generated whole before the first event (turns are generated in batches),
    so each text and each call's arguments come in one delta."""
    sequence = iter(range(1 << 30))

    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    final = response_body(reply, request, model, rid)
    yield event("response.created", response=response_body(reply, request, model, rid, [], "in_progress"))
    yield event("response.in_progress", response=response_body(reply, request, model, rid, [], "in_progress"))
    for index, (item, started) in enumerate(zip(final["output"], _output(reply, request, done=False))):
        started["id"] = item["id"]
        yield event("response.output_item.added", output_index=index, item=started)
        place = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.content_part.added", **place, content_index=0,
                        part={**part, "text": "", "logprobs": []})
            yield event("response.output_text.delta", **place, content_index=0, delta=part["text"],
                        logprobs=part["logprobs"])
            yield event("response.output_text.done", **place, content_index=0, text=part["text"],
                        logprobs=part["logprobs"])
            yield event("response.content_part.done", **place, content_index=0, part=part)
        elif item["type"] == "custom_tool_call":
            yield event("response.custom_tool_call_input.delta", **place, delta=item["input"])
            yield event("response.custom_tool_call_input.done", **place, input=item["input"])
        else:
            yield event("response.function_call_arguments.delta", **place, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **place, name=item["name"],
                        arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event(f"response.{final['status']}", response=final)
