"""Trajectories never mix (hostile tests, written first): an agent that reaches the policy through another
trajectory's client fails with one line naming the cause and the fix, and costs its own trajectory; the trajectories
whose records stayed clean are not blamed. Through the real server, the real OpenAI SDK and the real OpenAI Agents
SDK, on a scripted generator. (Requests that carry no proof of their sender: ``test_key_binding.py``.) The agents
coordinate with ``threading`` objects, so that the order of their requests is the test's, not the scheduler's."""

from __future__ import annotations

import asyncio
import threading
import time

import agents  # noqa: F401 - imported once here, not inside each agent
import pytest
from test_endpoint_hostile import rollout

pytestmark = pytest.mark.adversarial

FIX = "pass the client the agent receives"


@pytest.fixture
def sdk_defaults():
    """The Agents SDK's process-wide settings, restored after the test."""
    from agents.models import _openai_shared

    yield
    _openai_shared.set_default_openai_client(None)
    _openai_shared.set_use_responses_by_default(True)


def rows(kinds):
    return [{"kind": kind, "question": f"What is {i} plus 3?"} for i, kind in enumerate(kinds)]


def own_conversations_only(trajectory, tok, questions, mine):
    """Every segment of a trajectory holds its own row's question and no other row's."""
    for segment in trajectory.segments:
        text = tok.decode(segment.prompt_ids)
        assert mine in text and not any(q in text for q in questions if q != mine), text


def assert_mixed(trajectory):
    assert trajectory.stop_reason == "env_error", (trajectory.stop_reason, trajectory.error)
    assert trajectory.error.startswith("trajectories mixed:") and FIX in trajectory.error, trajectory.error
    assert "\n" not in trajectory.error


SETTERS = {}


async def agents_sdk_agent(client, question, kind, **row):
    """The Agents SDK as its docs write it for other providers (process-wide), or given the client (per run). The
    agents that set the process-wide client wait for each other (``SETTERS["barrier"]``) before running: the last to
    set it is the one whose client every one of them uses."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIProvider,
        RunConfig,
        Runner,
        function_tool,
        set_default_openai_api,
        set_default_openai_client,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    run_config = None
    if kind == "process-wide":
        set_default_openai_client(client)
        set_default_openai_api("chat_completions")
        await asyncio.to_thread(SETTERS["barrier"].wait, 10)
        model = "policy"
    elif kind == "run-config":  # a model name, the client given for this run
        model = "policy"
        run_config = RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=False))
    else:
        model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", instructions="Use the add tool, then answer.", tools=[add], model=model)
    return (await Runner.run(agent, question, max_turns=4, run_config=run_config)).final_output


def test_a_process_wide_client_fails_the_agents_that_used_another_trajectorys(qwen, sdk_defaults):
    ro, tok, gen = rollout(qwen, agents_sdk_agent)
    kinds = ["process-wide", "process-wide", "own", "process-wide", "run-config"]
    SETTERS["barrier"] = threading.Barrier(3)
    out = ro.run(rows(kinds), gen)
    questions = [r["question"] for r in rows(kinds)]
    mixed = [i for i, t in enumerate(out) if t.stop_reason != "terminated"]
    assert len(mixed) == 2 and set(mixed) <= {0, 1, 3}  # the last agent to set the default client used its own
    for i, t in enumerate(out):
        if i in mixed:
            assert_mixed(t)
            assert "set_default_openai_client" in t.error
        else:  # clean records, kept: the well-behaved agents and the process-wide client's own agent
            assert t.agent_output == "The answer is 5." and len(t.segments) == 1 and t.requests == 2
            own_conversations_only(t, tok, questions, questions[i])
    ro.close()


def test_a_client_kept_from_another_trajectory_fails_its_user_only(qwen):
    kept, stored = {}, threading.Event()

    async def agent(client, question, kind, **row):
        if kind == "keeps":  # e.g. a module-level client set on the first call
            kept["client"] = client
            stored.set()
        elif kind == "reuses":
            await asyncio.to_thread(stored.wait, 10)
            await asyncio.sleep(0.5)  # the first agent has returned by now: its key has ended
            client = kept["client"]
        r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": question}])
        return r.choices[0].message.content

    ro, tok, gen = rollout(qwen, agent)
    out = ro.run(rows(["keeps", "reuses", "own"]), gen)
    assert out[0].stop_reason == "terminated" and out[0].requests == 1  # its own client, its own requests
    assert_mixed(out[1])
    assert out[1].requests == 0  # refused: recorded nowhere
    assert out[2].stop_reason == "terminated" and out[2].agent_output == "The answer is 5."
    ro.close()


def test_a_sync_agent_on_another_trajectorys_client_is_caught_too(qwen):
    kept, first_done = {}, threading.Event()

    def agent(client, question, kind, **row):
        if kind == "first":
            kept["client"] = client
            r = client.chat.completions.create(model="p", messages=[{"role": "user", "content": question}])
            first_done.set()
            time.sleep(0.3)  # still running: the key is live, the foreign request is refused
            return r.choices[0].message.content
        first_done.wait(10)
        r = kept["client"].chat.completions.create(model="p", messages=[{"role": "user", "content": question}])
        return r.choices[0].message.content

    ro, tok, gen = rollout(qwen, agent)
    out = ro.run(rows(["first", "borrower"]), gen)
    assert out[0].stop_reason == "terminated" and out[0].requests == 1 and len(out[0].segments) == 1
    assert_mixed(out[1])
    ro.close()


def test_sub_agents_and_an_agent_without_model_calls_are_not_mixing(qwen):
    """Not mixing: parallel conversations of one agent on its own client, beside an agent that answers without the
    model."""
    async def agent(client, question, kind, **row):
        if kind == "silent":
            return "no model needed"

        async def ask(text):
            r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": text}])
            return r.choices[0].message.content

        return await asyncio.gather(ask(question), ask("Sub-task: " + question))

    ro, tok, gen = rollout(qwen, agent)
    out = ro.run(rows(["silent", "parallel", "parallel"]), gen)
    assert [t.stop_reason for t in out] == ["terminated"] * 3, [t.error for t in out]
    assert [len(t.segments) for t in out] == [0, 2, 2]
    ro.close()


def test_the_handed_clients_proof_goes_to_the_endpoint_only():
    """The hook of a handed client: the owner's sender id on requests to the endpoint, from the owner's agent or from
    a thread no agent started; a request another trajectory's agent sends is stopped and its sender blamed; other
    hosts are untouched."""
    import contextvars

    import httpx

    from trl_agentic.agents.ownership import CALLER_HEADER, TrajectoriesMixed, request_hooks, running_as

    blamed = []
    [stamp] = request_hooks("http://127.0.0.1:1", "owner", blamed.append, asynchronous=False)["request"]

    def stamped(url):
        request = httpx.Request("POST", url, headers={CALLER_HEADER: "forged"})
        stamp(request)
        return request.headers.get(CALLER_HEADER)

    def as_agent(caller):
        running_as(caller)
        return [stamped(u) for u in ("http://127.0.0.1:1/v1/chat/completions", "http://127.0.0.1:10/v1/x",
                                     "https://example.com/v1")]

    assert contextvars.copy_context().run(as_agent, "owner") == ["owner", "forged", "forged"]
    assert stamped("http://127.0.0.1:1/v1/chat/completions") == "owner"  # a thread no agent started
    with pytest.raises(TrajectoriesMixed, match="trajectories mixed"):
        contextvars.copy_context().run(as_agent, "another")
    assert blamed == ["another"]
