"""An agent's first parameter receives its client: one written the other way round is told so, in one line, when
the trainer is built (not asked to rename a dataset column)."""

from __future__ import annotations

import openai
import pytest

from trl_agentic.agents.runner import Agent, AgentEndpoint


async def swapped(prompt, client, **row):
    return ""


async def swapped_endpoint(question: str, endpoint: AgentEndpoint) -> str:
    return ""


def swapped_annotated(prompt, sdk: openai.OpenAI):
    return ""


@pytest.mark.parametrize("agent, message", [
    (swapped, "write def agent(client, prompt, ...)"),
    (swapped_endpoint, "write def agent(endpoint, question, ...)"),
    (swapped_annotated, "write def agent(sdk, prompt, ...)"),
])
def test_a_client_that_is_not_first_is_named(agent, message):
    with pytest.raises(TypeError, match=r"the agent's client comes first: its parameter '\w+' is not its first; "
                       + message.replace("(", r"\(").replace(")", r"\)")):
        Agent(agent)


def test_the_trainer_says_it_before_the_columns(tmp_path):
    from agent_helpers import add_dataset, answer_reward, config
    from conventions import build_convention

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    qwen = build_convention("qwen2.5-instruct")
    with pytest.raises(TypeError, match="the agent's client comes first") as error:
        AgenticGRPOTrainer(model=qwen.model_dir, reward_funcs=answer_reward, train_dataset=add_dataset(),
                           agent=swapped, args=config(AgenticGRPOConfig, tmp_path))
    assert "rename the column" not in str(error.value)


def test_a_column_named_like_a_client_after_the_client_is_a_column():
    async def agent(client, endpoint_url, **row):
        return ""

    assert Agent(agent).signature() == (False, None, ["endpoint_url"])
