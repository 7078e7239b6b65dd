"""pydantic-ai's default OpenAI model (``OpenAIResponsesModel``: the Responses API) runs unchanged against the
endpoint, given the client: one segment per run, its history matched what was recorded. Needs ``pydantic-ai-slim``
(the ``frameworks`` extra); skipped without it."""

from __future__ import annotations

import pytest
from test_endpoint_hostile import rollout

pytest.importorskip("pydantic_ai")


async def pydantic_ai_agent(client, question, **row):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agent = Agent(OpenAIResponsesModel("policy", provider=OpenAIProvider(openai_client=client)),
                  instructions="Use the add tool, then answer.")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return (await agent.run(question)).output


def test_a_pydantic_ai_agent_on_the_responses_api(qwen):
    ro, tok, gen = rollout(qwen, pydantic_ai_agent)
    out = ro.run([{"question": f"What is {i} plus 3?"} for i in range(2)], gen)
    for t in out:
        assert t.stop_reason == "terminated" and t.agent_output == "The answer is 5.", t.error
        assert len(t.segments) == 1 and t.requests == 2
        assert [m["role"] for m in t.messages] == ["assistant", "tool", "assistant"]
    ro.close()
