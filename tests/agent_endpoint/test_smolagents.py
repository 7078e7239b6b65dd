"""smolagents' ``ToolCallingAgent`` (it sends ``tool_choice="required"`` on every step) trains unchanged: under the
default forcing each turn opens with a call (:mod:`trl_agentic.agents.forcing`); unforced, the policy writes the
call itself. Needs ``smolagents`` (the ``frameworks`` extra); skipped without it."""

from __future__ import annotations

import pytest
from agent_helpers import agent_trainer, call
from helpers import ScriptedGenerator
from test_endpoint_hostile import rollout

from trl_agentic.agents import Agent, AgentEndpoint

smolagents = pytest.importorskip("smolagents")


def smolagents_agent(endpoint: AgentEndpoint, question, **row):
    """A ToolCallingAgent as smolagents' docs write it, on the endpoint's base URL and key."""
    from smolagents import OpenAIModel, ToolCallingAgent, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    model = OpenAIModel(model_id=endpoint.model, api_base=endpoint.base_url, api_key=endpoint.api_key)
    return ToolCallingAgent(tools=[add], model=model, max_steps=3, verbosity_level=0).run(question)


def completing_script(tok):
    """A model that completes the call its turn was opened with: add, then final_answer once it saw the result."""
    def script(ids):
        text = tok.decode(ids)
        if not text.endswith('{"name": "'):
            return "No call.<|im_end|>"
        if text.count("<|im_start|>assistant") > 1:  # a call was made before
            return 'final_answer", "arguments": {"answer": "The answer is 5."}}\n</tool_call><|im_end|>'
        return 'add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    return script


def test_a_tool_calling_agent_gets_its_calls_opened(qwen):
    ro, tok, _ = rollout(qwen, Agent(smolagents_agent, max_prompt_tokens=100_000), max_completion_length=4096)
    out = ro.run([{"question": "What is 2 plus 3?"}] * 2, ScriptedGenerator(tok, completing_script(tok)))
    for t in out:
        assert t.stop_reason == "terminated" and t.agent_output == "The answer is 5.", t.error
        assert t.requests == 2 and t.events["forced_call"] == 2 and not t.events.get("bad_request")
    ro.close()


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_a_tool_calling_agent_trains_two_steps_unforced(qwen, tmp_path, trainer_name):
    agent = Agent(smolagents_agent, max_prompt_tokens=100_000, force_tool_choice=False)
    trainer, runs = agent_trainer(qwen, tmp_path, trainer_name, agent,
                                  [call("add", a=1, b=3), call("final_answer", answer="4")], max_completion_length=1024)
    trainer.train()
    assert trainer.state.global_step == 2 and len(runs) == 4
    for t in runs:
        assert t.stop_reason == "terminated" and t.agent_output == "4" and t.requests == 2, t.error
