"""Token exactness with prefix reuse, segments, streaming and batching, through the real server and SDK."""

from __future__ import annotations

import json
import time

from agent_helpers import TOOLS
from helpers import ScriptedGenerator
from test_endpoint_hostile import answer_script, rollout

from trl_agentic.agents import Agent
from trl_agentic.agents.prompt import encode_conversation


async def tool_loop(client, question="2+3?", stream=False):
    messages = [{"role": "user", "content": question}]
    replies = []
    for _ in range(3):
        if stream:
            content, calls, finish, ids = "", {}, None, None
            async for chunk in await client.chat.completions.create(model="p", messages=messages, tools=TOOLS,
                                                                    stream=True, stream_options={"include_usage": True}):
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    for c in choice.delta.tool_calls or []:
                        calls[c.index] = {"id": c.id, "type": "function",
                                          "function": {"name": c.function.name, "arguments": c.function.arguments}}
                    finish = choice.finish_reason or finish
                    ids = (choice.model_extra or {}).get("token_ids", ids)
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            r = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
            message, finish = r.choices[0].message.model_dump(exclude_none=True), r.choices[0].finish_reason
            ids = r.choices[0].model_extra["token_ids"]
        replies.append((message, finish, ids))
        messages.append(message)
        if not message.get("tool_calls"):
            return replies
        for call in message["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])})
    return replies


def test_later_requests_reuse_the_recorded_ids(qwen):
    ro, tok, gen = rollout(qwen, tool_loop)
    [t] = ro.run([{}], gen)
    replies = t.agent_output
    assert [f for _, f, _ in replies] == ["tool_calls", "stop"] and len(t.segments) == 1
    assert t.agent_segments() == [ids for _, _, ids in replies]  # the ids answered are the ids recorded
    # the prompt is the template's rendering; after it, only the tool message's delta, masked
    first = encode_conversation(ro.encoder, [{"role": "user", "content": "2+3?"}], TOOLS)
    assert t.prompt_ids == first
    start, end = t.turn_spans[1]
    delta = t.completion_ids[t.turn_spans[0][1]:start]
    assert t.env_mask == [1] * t.turn_spans[0][1] + [0] * len(delta) + [1] * (end - start)
    assert tok.decode(delta) == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert t.messages[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    ro.close()


def test_streaming_answers_what_the_plain_call_answers(qwen):
    async def both(client, **row):
        return await tool_loop(client), await tool_loop(client, stream=True)

    ro, _, gen = rollout(qwen, both)
    [t] = ro.run([{}], gen)
    plain, streamed = t.agent_output
    assert [(m["content"] or "", f, ids) for m, f, ids in streamed] == [(m.get("content") or "", f, ids)
                                                                         for m, f, ids in plain]
    assert [m.get("tool_calls", [{}])[0].get("function") for m, _, _ in streamed][0]["name"] == "add"
    ro.close()


def test_rewritten_history_starts_a_segment_and_each_segment_grows_on_its_own(qwen):
    async def agent(client, **row):
        main = await tool_loop(client)  # segment 1
        summary = [{"role": "user", "content": "Summary: 2+3 is 5. Say it."}]
        r = await client.chat.completions.create(model="p", messages=summary)  # segment 2 (a rewrite)
        summary += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
        await client.chat.completions.create(model="p", messages=summary)  # extends segment 2
        return main

    ro, _, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    assert len(t.segments) == 2 and [s.num_turns for s in t.segments] == [2, 2] and t.requests == 4
    assert t.completion_ids == t.segments[1].completion_ids  # the main segment: the one of the last call
    for s in t.segments:
        assert [s.completion_ids[a:b] for a, b in s.turn_spans] == [g[: b - a] for (a, b), g in
                                                                      zip(s.turn_spans, s.generated_ids)]
    ro.close()


def test_interleaved_sub_agent_keeps_two_segments(qwen):
    async def agent(client, **row):
        main = [{"role": "user", "content": "Plan."}]
        sub = [{"role": "user", "content": "Sub-task."}]
        for _ in range(2):
            for conv in (main, sub):
                r = await client.chat.completions.create(model="p", messages=conv)
                conv += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
        return "ok"

    ro, _, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    assert [s.num_turns for s in t.segments] == [2, 2] and t.requests == 4
    ro.close()


def test_concurrent_agents_share_one_generation_call(qwen):
    class Counting(ScriptedGenerator):
        def generate(self, prompts, *args):
            self.sizes = getattr(self, "sizes", []) + [len(prompts)]
            return super().generate(prompts, *args)

    async def agent(client, **row):
        r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "2+3?"}])
        return r.choices[0].message.content

    ro, tok, _ = rollout(qwen, Agent(agent, batch_window=30.0))  # the round starts when all 16 wait, not later
    gen = Counting(tok, answer_script(tok))
    started = time.monotonic()
    out = ro.run([{}] * 16, gen)
    assert gen.sizes == [16] and all(t.agent_output == "The answer is 5." for t in out)
    assert time.monotonic() - started < 30
    ro.close()


def test_each_request_keeps_its_own_budget_and_stop_strings_in_a_shared_call(qwen):
    async def agent(client, kind, **row):
        extra = {"max_tokens": 2} if kind == "short" else {"stop": ["answer"]} if kind == "stop" else {}
        r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "2+3?"}], **extra)
        return r.choices[0].finish_reason, r.choices[0].message.content, r.choices[0].model_extra["token_ids"]

    ro, tok, gen = rollout(qwen, agent)
    short, stop, full = (t.agent_output for t in ro.run([{"kind": k} for k in ("short", "stop", "full")], gen))
    assert short[0] == "length" and len(short[2]) == 2
    assert stop[0] == "stop" and stop[1] == "The " and tok.decode(stop[2]).endswith("answer")
    assert full == ("stop", "The answer is 5.", full[2]) and short[2] == full[2][:2]
    ro.close()


def test_logprobs_come_back_when_the_backend_reports_them(qwen):
    async def agent(client, **row):
        r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "2+3?"}],
                                                 logprobs=True)
        return [(c.token, c.logprob) for c in r.choices[0].logprobs.content]

    ro, tok, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    assert [lp for _, lp in t.agent_output] == [-0.5] * len(t.completion_ids) == t.logprobs
    assert "".join(tok for tok, _ in t.agent_output) == "The answer is 5.<|im_end|>"
    ro.close()


def test_an_agent_records_what_the_engine_records_for_the_same_task(qwen):
    """The same tool task as a ToolCallEnvironment through the engine and as an SDK agent through the endpoint: the
    same prompt ids, completion ids and masks, token for token."""
    from trl_agentic.environments.native_tools import ToolCallEnvironment
    from trl_agentic.rollout.config import RolloutConfig
    from trl_agentic.rollout.engine import RolloutEngine

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    from transformers.utils import get_json_schema

    schema = get_json_schema(add)

    async def agent(client, **row):
        messages = [{"role": "user", "content": "2+3?"}]
        while True:
            r = await client.chat.completions.create(model="p", messages=messages, tools=[schema])
            message = r.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": str(add(**json.loads(call.function.arguments)))})

    ro, tok, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    config = RolloutConfig(max_turns=4, max_tokens_per_turn=64, max_completion_length=256, rollout_mode="chat")
    engine = RolloutEngine(gen, tok, lambda: ToolCallEnvironment([add]), config,
                           eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    [e] = engine.run([[{"role": "user", "content": "2+3?"}]])
    assert (t.prompt_ids, t.completion_ids, t.env_mask, t.turn_spans) == (e.prompt_ids, e.completion_ids, e.env_mask,
                                                                          e.turn_spans)
    assert t.num_turns == 2 and e.stop_reason == t.stop_reason == "terminated"
    ro.close()
