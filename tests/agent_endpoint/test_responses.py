"""The Responses API (``POST /v1/responses``) through the real server and the real OpenAI SDK: token-exact with chat
completions (the same recorded ids whichever API the agent uses), streaming that the SDK parses, stateless use and
``previous_response_id`` within a trajectory, and bad requests that answer 400 naming the field."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from agent_helpers import RESPONSES_TOOLS
from test_endpoint_hostile import rollout
from test_sessions import tool_loop


def tool_outputs(response):
    """The ``function_call_output`` items answering a response's calls (the add tool)."""
    return [{"type": "function_call_output", "call_id": item.call_id,
             "output": str(sum(json.loads(item.arguments).values()))}
            for item in response.output if item.type == "function_call"]


async def streamed(client, **kwargs):
    """A streamed response as the SDK parses it: the event types, and the response of the last event."""
    kinds, final = [], None
    async for event in await client.responses.create(stream=True, **kwargs):
        kinds.append(event.type)
        final = getattr(event, "response", final)
    return kinds, final


async def responses_loop(client, question="2+3?", stream=False, stateless=True):
    """The add-tool loop on the Responses API: the whole conversation each time, or ``previous_response_id``."""
    items, replies, previous = [{"role": "user", "content": question}], [], None
    for _ in range(3):
        kwargs = dict(model="p", input=items, tools=RESPONSES_TOOLS)
        if previous is not None:
            kwargs["previous_response_id"] = previous
        response = (await streamed(client, **kwargs))[1] if stream else await client.responses.create(**kwargs)
        replies.append(response)
        outputs = tool_outputs(response)
        if not outputs:
            return replies
        if stateless:
            items = items + [item.model_dump(exclude_none=True) for item in response.output] + outputs
        else:
            items, previous = outputs, response.id
    return replies


def test_the_responses_api_records_the_ids_chat_completions_record(qwen):
    async def agent(client, api, **row):
        if api == "chat":
            return await tool_loop(client)
        return await responses_loop(client, stream=api == "streamed", stateless=api != "previous_response_id")

    ro, tok, gen = rollout(qwen, agent)
    apis = ["chat", "responses", "streamed", "previous_response_id"]
    chat, *others = ro.run([{"api": api} for api in apis], gen)
    assert chat.stop_reason == "terminated" and chat.num_turns == 2 and len(chat.segments) == 1
    for api, t in zip(apis[1:], others):
        assert t.stop_reason == "terminated" and len(t.segments) == 1, (api, t.error)
        assert (t.prompt_ids, t.completion_ids, t.env_mask, t.turn_spans) == (
            chat.prompt_ids, chat.completion_ids, chat.env_mask, chat.turn_spans), api
        first, last = t.agent_output
        assert [item.type for item in first.output] == ["function_call"] and first.output[0].name == "add"
        assert last.output_text == "The answer is 5." and last.status == "completed"
        assert [r.model_extra["token_ids"] for r in t.agent_output] == t.agent_segments()
        assert last.usage.output_tokens == len(t.agent_segments()[1])
    ro.close()


def test_streamed_responses_follow_the_event_sequence_the_sdks_parse(qwen):
    async def agent(client, **row):
        items = [{"role": "user", "content": "2+3?"}]
        kinds, first = await streamed(client, model="p", input=items, tools=RESPONSES_TOOLS)
        items += [item.model_dump(exclude_none=True) for item in first.output] + tool_outputs(first)
        text_kinds, last = await streamed(client, model="p", input=items, tools=RESPONSES_TOOLS, max_output_tokens=3)
        return kinds, first, text_kinds, last

    ro, tok, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    kinds, first, text_kinds, last = t.agent_output
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert json.loads(first.output[0].arguments) == {"a": 2, "b": 3}
    assert text_kinds == ["response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                          "response.content_part.done", "response.output_item.done", "response.incomplete"]
    assert last.status == "incomplete" and last.incomplete_details.reason == "max_output_tokens"
    assert last.output_text == tok.decode(last.model_extra["token_ids"]) and len(last.model_extra["token_ids"]) == 3
    ro.close()


def post(endpoint, body):
    return httpx.post(endpoint.base_url + "/responses", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {endpoint.api_key}"})


BAD = {
    "input not a list": ({"input": 3}, "input"),
    "empty input": ({"input": []}, "input"),
    "unknown item": ({"input": [{"type": "computer_call", "action": {}}]}, "input[0].type"),
    "bad role": ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    "image part": ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                   "input[0].content"),
    "call without id": ({"input": [{"type": "function_call", "name": "add", "arguments": "{}"}]}, "input[0].call_id"),
    "hosted tool": ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    "json schema": ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text"),
    "bad max_output_tokens": ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    "unknown previous": ({"input": "hi", "previous_response_id": "resp_0"}, "previous_response_id"),
}


def test_bad_responses_requests_answer_400_naming_the_field(qwen):
    answers, kept = {}, {}

    async def agent(endpoint, kind, **row):
        if kind == "first":
            r = await asyncio.to_thread(post, endpoint, {"input": "2+3?"})
            kept["id"] = r.json()["id"]
            return r.json()["output"][0]["content"][0]["text"]
        while "id" not in kept:
            await asyncio.sleep(0.01)
        for name, (body, _) in BAD.items():
            answers[name] = (await asyncio.to_thread(post, endpoint, body))
        # another trajectory's response id is not this trajectory's conversation
        answers["another trajectory's id"] = await asyncio.to_thread(
            post, endpoint, {"input": "hi", "previous_response_id": kept["id"]})
        return (await asyncio.to_thread(post, endpoint, {"input": "2+3?"})).json()["output"][0]["content"][0]["text"]

    ro, tok, gen = rollout(qwen, agent, env_timeout=60)
    first, second = ro.run([{"kind": "first"}, {"kind": "bad"}], gen)
    for name, (_, param) in {**BAD, "another trajectory's id": (None, "previous_response_id")}.items():
        r = answers[name]
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (name, r.json())
    assert first.agent_output == second.agent_output == "The answer is 5."
    assert second.stop_reason == "terminated" and second.events["bad_request"] == len(BAD) + 1
    ro.close()


@pytest.mark.parametrize("stream", [False, True])
def test_the_agents_sdk_default_model_talks_the_responses_api(qwen, stream):
    """``Agent(model="policy")`` with the client given per run: the Agents SDK's default, the Responses API."""
    from agents import Agent, OpenAIProvider, RunConfig, Runner, function_tool, set_tracing_disabled

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def agent(client, question, **row):
        set_tracing_disabled(True)
        calculator = Agent(name="calculator", instructions="Use the add tool, then answer.", tools=[add],
                           model="policy")
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
        if stream:
            result = Runner.run_streamed(calculator, question, max_turns=4, run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(calculator, question, max_turns=4, run_config=config)
        return result.final_output

    from agents.models import _openai_shared

    assert _openai_shared.get_use_responses_by_default()  # the SDK's default API: Responses
    ro, tok, gen = rollout(qwen, agent)
    out = ro.run([{"question": f"What is {i} plus 3?"} for i in range(2)], gen)
    for t in out:
        assert t.stop_reason == "terminated" and t.agent_output == "The answer is 5.", t.error
        assert len(t.segments) == 1 and t.requests == 2 and [m["role"] for m in t.messages] == [
            "assistant", "tool", "assistant"]
    ro.close()
