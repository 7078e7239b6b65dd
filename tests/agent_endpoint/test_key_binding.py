"""A key is bound to its trajectory's conversation (hostile tests, written first). A request with another live
trajectory's key that carries no proof of its sender (a raw HTTP request, a client built from a base URL and key) is
refused with 409 when it does not continue the conversation recorded for that key, and never becomes a segment of it;
the refusal points to the client the agent was handed. The trajectory whose key it was keeps its record and trains;
only the sender's own trajectory can suffer. Through the real server and SDK, on a scripted generator.

The agents coordinate here with ``threading.Event`` (plain ``def`` agents run on threads of their own)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from test_endpoint_hostile import rollout

pytestmark = pytest.mark.adversarial

PROTECTED = "the client the agent receives"


def rows(kinds):
    return [{"kind": kind, "question": f"What is {i} plus 3?"} for i, kind in enumerate(kinds)]


async def wait(event):
    assert await asyncio.to_thread(event.wait, 10), "the other agent never got there"


async def ask(client, messages):
    r = await client.chat.completions.create(model="p", messages=messages)
    return r.choices[0].message.content


async def two_turns(client, question, between=None):
    """A conversation of two turns on ``client``, ``between()`` awaited after the first."""
    messages = [{"role": "user", "content": question}]
    messages.append({"role": "assistant", "content": await ask(client, messages)})
    if between is not None:
        await between()
    messages.append({"role": "user", "content": "Are you sure?"})
    return await ask(client, messages)


def assert_clean(trajectory, tok, question):
    """Terminated, one segment, two requests, only its own question in it."""
    assert trajectory.stop_reason == "terminated", (trajectory.stop_reason, trajectory.error)
    assert len(trajectory.segments) == 1 and trajectory.requests == 2, trajectory.requests
    text = tok.decode(trajectory.segments[0].prompt_ids + trajectory.segments[0].completion_ids)
    assert question in text and "Intruder" not in text and text.count("<|im_start|>user") == 2, text


def assert_refused(status, error):
    assert status == 409 and error["code"] == "unproven_sender", (status, error)
    assert PROTECTED in error["message"] and "\n" not in error["message"], error["message"]


@pytest.mark.parametrize("when", ["after its first turn", "before its first turn"])
def test_a_raw_request_with_another_live_trajectorys_key_is_refused(qwen, when):
    shared, sent, intruded = {}, threading.Event(), threading.Event()

    async def agent(client, question, kind, **row):
        if kind == "victim":
            shared["url"], shared["key"] = str(client.base_url), client.api_key
            if when == "before its first turn":
                sent.set()
                await wait(intruded)
                return await two_turns(client, question)

            async def between():
                sent.set()
                await wait(intruded)

            return await two_turns(client, question, between)
        if kind == "intruder":  # a key read from a shared object, sent with a plain HTTP client
            await wait(sent)
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(shared["url"].rstrip("/") + "/chat/completions", json={
                    "model": "p", "messages": [{"role": "user", "content": "Intruder: what is 9 plus 9?"}]},
                    headers={"Authorization": f"Bearer {shared['key']}"})
            intruded.set()
            return r.status_code, r.json().get("error")
        return await two_turns(client, question)

    ro, tok, gen = rollout(qwen, agent)
    kinds = ["victim", "intruder", "own"]
    out = ro.run(rows(kinds), gen)
    assert_refused(*out[1].agent_output)
    assert_clean(out[0], tok, "What is 0 plus 3?")
    assert_clean(out[2], tok, "What is 2 plus 3?")
    assert out[1].requests == 0 and not out[1].segments  # refused: recorded nowhere
    ro.close()


def ask_sync(client, messages):
    r = client.chat.completions.create(model="p", messages=messages)
    return r.choices[0].message.content


def two_turns_sync(client, question, between=lambda: None):
    messages = [{"role": "user", "content": question}]
    messages.append({"role": "assistant", "content": ask_sync(client, messages)})
    between()
    messages.append({"role": "user", "content": "Are you sure?"})
    return ask_sync(client, messages)


def test_a_hand_built_client_kept_from_an_earlier_row_is_refused(qwen):
    """Row 0 keeps the client it built from its endpoint in a module-level variable; row 1, in the same round, reuses
    it instead of building its own (plain ``def`` agents, as smolagents' are)."""
    kept, sent, borrowed = {}, threading.Event(), threading.Event()

    def agent(endpoint, question, kind, **row):
        if kind == "keeps":
            kept["client"] = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)

            def between():
                sent.set()
                assert borrowed.wait(10)

            return two_turns_sync(kept["client"], question, between)
        if kind == "own":
            return two_turns_sync(openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key), question)
        assert sent.wait(10)
        try:
            return two_turns_sync(kept["client"], question)
        finally:
            borrowed.set()

    ro, tok, gen = rollout(qwen, agent)
    out = ro.run(rows(["keeps", "reuses", "own"]), gen)
    assert_clean(out[0], tok, "What is 0 plus 3?")
    assert_clean(out[2], tok, "What is 2 plus 3?")
    assert out[1].stop_reason == "env_error" and "ConflictError" in out[1].error and PROTECTED in out[1].error
    assert out[1].requests == 0
    ro.close()


def test_two_agents_sharing_one_hand_built_client(qwen):
    """One client built from the first agent's endpoint, shared through a module-level variable by every agent:
    the first agent's conversation is recorded, the others' requests through its key are refused."""
    shared, sent = {}, threading.Event()

    def agent(endpoint, question, kind, **row):
        if kind == "builds":
            shared["client"] = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)

            def between():  # the others send through its client now
                sent.set()
                time.sleep(0.5)

            return two_turns_sync(shared["client"], question, between)
        assert sent.wait(10)
        try:
            return ask_sync(shared["client"], [{"role": "user", "content": question}])
        except openai.ConflictError as exc:
            return exc.status_code, exc.body.get("error", exc.body)

    ro, tok, gen = rollout(qwen, agent)
    out = ro.run(rows(["builds", "shares", "shares"]), gen)
    assert_clean(out[0], tok, "What is 0 plus 3?")
    for t in out[1:]:
        assert_refused(*t.agent_output)
        assert t.stop_reason == "terminated" and t.requests == 0
    ro.close()
