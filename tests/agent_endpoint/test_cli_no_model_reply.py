"""An agent that got no model reply because the endpoint refused its requests (a CLI whose every request is refused
exits with an error; an agent may also catch the error and return) did not attempt its task: its trajectory fails
with one line naming the refusal, rather than end ``terminated`` with zero turns (which ``evaluate`` and the
trainers' failure lines would not report)."""

from __future__ import annotations

import openai
import pytest
from helpers import ScriptedGenerator

from trl_agentic.agents import AgentRollout
from trl_agentic.rollout.config import RolloutConfig

REFUSED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a reply the agent wrote"}]


def rollout(qwen, agent):
    tok = qwen.load_tokenizer()
    ro = AgentRollout(agent, tok, RolloutConfig(max_turns=4, max_tokens_per_turn=16, max_completion_length=64),
                      [tok.convert_tokens_to_ids("<|im_end|>")])
    return ro, ScriptedGenerator(tok, lambda ids: "ok<|im_end|>")


async def catches(client, **row):
    try:
        await client.chat.completions.create(model="policy", messages=REFUSED)
    except openai.BadRequestError:
        return "gave up"


async def raises(client, **row):
    await client.chat.completions.create(model="policy", messages=REFUSED)


async def answered_then_refused(client, **row):
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    try:
        await client.chat.completions.create(model="policy", messages=REFUSED)
    except openai.BadRequestError:
        pass
    return reply.choices[0].message.content


async def never_calls(client, **row):
    return "nothing to ask"


async def title_then_refused(client, **row):
    """Claude Code's way: a session-title call (Messages with ``output_config.format``: auxiliary) is answered, the
    task's request is refused."""
    title = {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "name this session"}],
             "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}
    await client.post("/messages", body=title, cast_to=object)
    return await catches(client)


REFUSAL = "the endpoint refused its request: the last message may not be an assistant message (continuing one is not " \
          "supported)"


@pytest.mark.parametrize("agent,stop,error", [
    (catches, "env_error", f"the agent got no model reply: {REFUSAL}"),
    (raises, "env_error", "agent raised BadRequestError: "),
    (answered_then_refused, "terminated", ""),
    (never_calls, "terminated", ""),
    (title_then_refused, "env_error", f"the agent got no model reply: {REFUSAL}"),
], ids=["catches", "raises", "answered-then-refused", "never-calls", "auxiliary-answered-task-refused"])
def test_a_run_whose_every_request_was_refused_fails_naming_the_refusal(qwen, agent, stop, error):
    ro, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    ro.close()
    assert t.stop_reason == stop and t.error.startswith(error) and "\n" not in t.error
    if agent is raises:
        assert t.error.endswith(f"; {REFUSAL}")
    assert t.env_failed == (stop == "env_error")


def test_an_endpoint_agent_learns_how_many_model_replies_it_got(qwen):
    seen = []

    async def agent(endpoint, **row):
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        seen.append(endpoint.model_replies())
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        seen.append(endpoint.model_replies())
        await client.close()

    ro, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    ro.close()
    assert seen == [0, 1] and t.stop_reason == "terminated"
