"""Anthropic's Messages API (``POST /v1/messages``) through the real server and the real Anthropic SDK: the same
recorded ids as chat completions, streaming the SDK parses, a named ``tool_choice``, and bad blocks that answer 400.
Needs ``anthropic`` (the ``frameworks`` extra); skipped without it."""

from __future__ import annotations

import pytest
from agent_helpers import TOOLS
from helpers import ScriptedGenerator
from test_endpoint_hostile import rollout
from test_sessions import tool_loop
from test_tool_choice import continuing_script

anthropic = pytest.importorskip("anthropic")

ANTHROPIC_TOOLS = [{"name": "add", "description": "Add two integers.",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]


def anthropic_client(endpoint):
    """The Anthropic SDK on the trajectory's endpoint (its base URL is the endpoint's without ``/v1``), over the
    endpoint's HTTP client, whose requests prove their sender: an agent may then hold several conversations."""
    return anthropic.AsyncAnthropic(base_url=endpoint.base_url.removesuffix("/v1"), api_key=endpoint.api_key,
                                    max_retries=0, http_client=endpoint.http_client())


async def anthropic_loop(endpoint, stream=False):
    client, replies = anthropic_client(endpoint), []
    messages = [{"role": "user", "content": "2+3?"}]
    for _ in range(3):
        kwargs = dict(model="p", max_tokens=64, messages=messages, tools=ANTHROPIC_TOOLS)
        if stream:
            async with client.messages.stream(**kwargs) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**kwargs)
        replies.append(message)
        messages = messages + [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                  for b in message.content]}]
        uses = [block for block in message.content if block.type == "tool_use"]
        if not uses:
            return replies
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                      "content": str(use.input["a"] + use.input["b"])}
                                                     for use in uses]})
    return replies


def test_the_messages_api_records_the_ids_chat_completions_record(qwen):
    import openai

    async def agent(endpoint, api, **row):
        if api == "chat":
            return await tool_loop(openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key))
        return await anthropic_loop(endpoint, stream=api == "streamed")

    ro, tok, gen = rollout(qwen, agent)
    chat, *others = ro.run([{"api": api} for api in ("chat", "messages", "streamed")], gen)
    assert chat.stop_reason == "terminated" and len(chat.segments) == 1 and chat.num_turns == 2
    for t in others:
        assert t.stop_reason == "terminated" and len(t.segments) == 1, t.error
        assert (t.prompt_ids, t.completion_ids, t.env_mask, t.turn_spans) == (
            chat.prompt_ids, chat.completion_ids, chat.env_mask, chat.turn_spans)
        first, last = t.agent_output
        assert first.stop_reason == "tool_use" and first.content[0].input == {"a": 2, "b": 3}
        assert last.stop_reason == "end_turn" and last.content[0].text == "The answer is 5."
    assert [m.model_extra["token_ids"] for m in others[0].agent_output] == others[0].agent_segments()
    ro.close()


def test_a_named_tool_choice_opens_a_call_and_max_tokens_stops_a_turn(qwen):
    async def agent(endpoint, **row):
        client = anthropic_client(endpoint)
        short = await client.messages.create(model="p", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        forced = await client.messages.create(model="p", max_tokens=64, tools=ANTHROPIC_TOOLS,
                                              tool_choice={"type": "tool", "name": "add"},
                                              messages=[{"role": "user", "content": "hi"}])
        try:
            await client.messages.create(model="p", max_tokens=8, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "x"}}]}])
        except anthropic.BadRequestError as exc:
            return short, forced, exc.body
        return short, forced, None

    ro, tok, _ = rollout(qwen, agent)
    [t] = ro.run([{}], ScriptedGenerator(tok, continuing_script(tok)))
    short, forced, refused = t.agent_output
    assert short.stop_reason == "max_tokens" and len(short.model_extra["token_ids"]) == 2
    assert forced.stop_reason == "tool_use" and forced.content[0].name == "add" and t.events["forced_call"] == 1
    assert refused["error"]["param"] == "messages[0].content[0]"
    ro.close()
