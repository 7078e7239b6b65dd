"""Agents written with two agent frameworks from PyPI, unchanged, train two steps through both trainers: the OpenAI
Agents SDK (``openai-agents``, given the client: its chat-completions model, and its default model, which talks the
Responses API) and LangGraph's ReAct agent over ``langchain-openai``'s ChatOpenAI
(given the base URL and key). Each framework re-sends its history in its own message format; every trajectory must
still be one segment (the history matched what was recorded, so the ids were reused, not re-rendered), its sampled
ids must be the ids generated, and the mask audit 0."""

from __future__ import annotations

import pytest
from agent_helpers import agent_trainer, call
from test_agent_training import recorded_generator

from trl_agentic.agents import AgentEndpoint


async def openai_agents_agent(client, question, **row):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # nothing leaves the machine

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    agent = Agent(name="calculator", instructions="Use the add tool, then answer.", tools=[add],
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client))
    result = await Runner.run(agent, question, max_turns=4)
    return result.final_output


async def openai_agents_default_agent(client, question, **row):
    """The Agents SDK's default model (the Responses API), given the client for this run."""
    from agents import Agent, OpenAIProvider, RunConfig, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = Agent(name="calculator", instructions="Use the add tool, then answer.", tools=[add], model="policy")
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
    return (await Runner.run(agent, question, max_turns=4, run_config=config)).final_output


async def langgraph_agent(endpoint: AgentEndpoint, question, **row):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = ChatOpenAI(model=endpoint.model, base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    graph = create_react_agent(model, [add])
    state = await graph.ainvoke({"messages": [("user", question)]}, {"recursion_limit": 10})
    return state["messages"][-1].content


AGENTS = {"openai-agents": openai_agents_agent, "openai-agents-responses": openai_agents_default_agent,
          "langgraph": langgraph_agent}


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
@pytest.mark.parametrize("framework", sorted(AGENTS))
def test_framework_agent_trains_two_steps(qwen, tmp_path, framework, trainer_name):
    trainer, runs = agent_trainer(qwen, tmp_path, trainer_name, AGENTS[framework],
                                  [call("add", a=1, b=3), "The answer is 4."])
    recordings = recorded_generator(trainer)
    trainer.train()
    assert trainer.state.global_step == 2 and len(runs) == 4
    generated = [ids for rec in recordings for batch in rec.outputs for ids in batch]
    for t in runs:
        assert t.stop_reason == "terminated", t.error
        assert len(t.segments) == 1 and t.requests == 2 and "4" in t.agent_output
        assert [m["role"] for m in t.messages] == ["assistant", "tool", "assistant"]
        for ids, raw in zip(t.agent_segments(), t.generated_ids):
            assert raw in generated and ids == raw[: len(ids)]
    rewards = [e["rewards/answer_reward/mean"] for e in trainer.state.log_history if "rewards/answer_reward/mean" in e]
    # the reward read the agent's answer, 4: right for the row "1 plus 3" only
    right = [float(any("1 plus 3" in m["content"] for m in t.prompt)) for t in runs]
    assert rewards == [sum(right[:2]) / 2, sum(right[2:]) / 2]
