"""OpenAI's legacy completions (``POST /v1/completions``): a prompt string in, the text that continues it out.

Agents that write their own prompt (ReAct in text, a base model's format) send the whole text each time, the last
completion included. The session (:mod:`~trl_agentic.agents.session`) extends a segment only when the new prompt's
ids, tokenized on their own, *begin with* every id the segment holds, token for token (its prompt, the sampled ids,
the text added between): then the model continues from those ids and only the new text is appended, masked. When the
text joins but the tokens do not (a word the agent completed, ``" us" + "e"`` tokenized as ``" use"``; a stop string or
end token the agent left out), the request starts a new segment, counted ``text_join_mismatch``: the recorded ids are
never silently re-tokenized.

What is read: ``prompt`` (a string, or a list of one string; every control-token string in it is tokenized as plain
text, as in a tool result: a conversation with a chat template goes to ``/v1/chat/completions``), ``max_tokens`` (a
cap on this turn; absent, the training budgets alone, not OpenAI's 16), ``stop``, ``logprobs`` (0 to 5: the sampled
tokens' log-probs, no alternatives), ``stream``, ``stream_options.include_usage``, ``n`` and ``best_of`` (1 only),
``model``. ``echo`` and ``suffix`` are refused; ``temperature``, ``top_p``, ``seed``, penalties, ``user`` ... are
accepted and ignored (the training's sampling settings win).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterator

from .protocol import ChatRequest, Limits, Reply, RequestError, check_request, load_json


def _fail(message: str, param: str) -> RequestError:
    return RequestError(400, message, param)


def parse_completion(body: bytes, limits: Limits) -> ChatRequest:
    """Read and check a legacy completions body into a :class:`ChatRequest` whose ``prompt`` is set (its messages
    empty); :class:`RequestError` (400) naming the field at the first problem."""
    data = load_json(body)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _fail("'prompt' must be a non-empty string (token ids and several prompts are not accepted: each "
                    "completion is its own trajectory)", "prompt")
    if len(prompt.encode("utf-8")) > limits.max_request_bytes:
        raise _fail(f"'prompt' is over {limits.max_request_bytes} bytes", "prompt")
    for name in ("n", "best_of"):
        if data.get(name) not in (None, 1):
            raise _fail(f"only {name}=1 is supported: each completion is its own trajectory", name)
    if data.get("echo"):
        raise _fail("echo is not supported: the prompt is yours already", "echo")
    if data.get("suffix") is not None:
        raise _fail("suffix (insertion) is not supported", "suffix")
    logprobs = data.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                 or not 0 <= logprobs <= 5):
        raise _fail("'logprobs' must be an integer from 0 to 5", "logprobs")
    chat = {"messages": [{"role": "user", "content": "."}], "max_tokens": data.get("max_tokens"),
            "stop": data.get("stop"), "logprobs": logprobs is not None, "stream": data.get("stream"),
            "stream_options": data.get("stream_options"), "model": data.get("model")}
    request = check_request(chat, limits)
    request.messages, request.prompt = [], prompt
    return request


def _logprobs(reply: Reply, request: ChatRequest) -> dict[str, Any] | None:
    if not request.logprobs or reply.logprobs is None:
        return None
    offsets, at = [], 0
    for token in reply.tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": reply.tokens, "token_logprobs": reply.logprobs, "top_logprobs": None, "text_offset": offsets}


def _usage(reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": len(reply.token_ids),
            "total_tokens": reply.prompt_tokens + len(reply.token_ids)}


def text_completion_body(reply: Reply, request: ChatRequest, model: str) -> dict[str, Any]:
    """The ``text_completion`` object; the choice also carries ``token_ids`` (the ids recorded for training)."""
    choice = {"index": 0, "text": reply.content, "finish_reason": "length" if reply.finish_reason == "length" else "stop",
              "logprobs": _logprobs(reply, request), "token_ids": reply.token_ids}
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": model,
            "system_fingerprint": None, "choices": [choice], "usage": _usage(reply)}


def text_completion_events(reply: Reply, request: ChatRequest, model: str) -> Iterator[str]:
    """The same answer as server-sent events: the text in one chunk (turns are generated whole), then the finish
    reason, then ``[DONE]``."""
    body = text_completion_body(reply, request, model)
    choice = body["choices"][0]
    base = {k: body[k] for k in ("id", "object", "created", "model", "system_fingerprint")}
    yield f"data: {json.dumps({**base, 'choices': [{**choice, 'finish_reason': None, 'token_ids': None}]})}\n\n"
    yield f"data: {json.dumps({**base, 'choices': [{**choice, 'text': '', 'logprobs': None}]})}\n\n"
    if request.include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': body['usage']})}\n\n"
    yield "data: [DONE]\n\n"
