"""The requests Codex CLI (0.169.0) and Claude Code (2.1.197) send, as logged from the real CLIs and trimmed
(``tests/fixtures/cli_requests/``), posted through the real server: each served as sent, its tool calls answered as
the CLI reads them, its re-sent history extending the recorded segment token for token, its auxiliary calls kept
apart, and every shape the endpoint cannot honour refused in one line naming the field. No CLI is needed here;
``test_codex_cli.py`` and ``test_claude_code.py`` run the CLIs themselves."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from helpers import ScriptedGenerator

from trl_agentic.agents import Agent, AgentRollout
from trl_agentic.agents.auxiliary import auxiliary_kind
from trl_agentic.agents.metrics import agent_sums
from trl_agentic.agents.prompt import encode_conversation
from trl_agentic.agents.response_tools import chat_tools
from trl_agentic.rollout.audit import unsampled_trained
from trl_agentic.rollout.config import RolloutConfig

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cli_requests"
EXEC = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}\n</tool_call>'
CLOSE_AGENT = '<tool_call>\n{"name": "multi_agent_v1.close_agent", "arguments": {"target": "nobody"}}\n</tool_call>'
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"
APPLY_PATCH = '<tool_call>\n' + json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}}) + '\n</tool_call>'
BASH = ('<tool_call>\n{"name": "Bash", "arguments": {"command": "echo hi > hello.txt", "description": "create file"}}'
        '\n</tool_call>')


def fixture(name: str) -> dict:
    """A logged request body."""
    return json.loads((FIXTURES / f"{name}.json").read_text())["body"]


def without_web_search(body: dict) -> dict:
    """Codex's request as it sends it with ``web_search = "disabled"``."""
    return {**body, "tools": [tool for tool in body["tools"] if tool["type"] != "web_search"]}


def scripted_rollout(qwen, agent, first_turn: str, **options):
    """A rollout whose model writes ``first_turn`` until a tool result is in its prompt, then ``Done.``."""
    tok = qwen.load_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(ids):
        text = tok.decode(ids)
        if "sentence-case title" in text:
            return '{"title": "Create hello file"}<|im_end|>'
        return ("Done." if "<tool_response>" in text else first_turn) + "<|im_end|>"

    config = RolloutConfig(max_turns=6, max_tokens_per_turn=128, max_completion_length=4096, env_timeout=30)
    return AgentRollout(Agent(agent, **options), tok, config, [end]), tok, ScriptedGenerator(tok, script), end


async def post(endpoint, path: str, body: dict) -> httpx.Response:
    """``body`` posted to the trajectory's ``/v1<path>`` as a CLI sends it: key and proof headers."""
    headers = {**endpoint.headers, "authorization": f"Bearer {endpoint.api_key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        return await http.post(endpoint.base_url + path, json=body)


def sse(response: httpx.Response) -> list[dict]:
    """The events of a streamed answer."""
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def assert_token_exact(trajectory, end: int) -> None:
    """Every trained position holds a token the model sampled there (the mask audit is 0), and some are trained."""
    sampled = sum(stop - start for start, stop in trajectory.turn_spans)
    assert sampled > 0 and sum(trajectory.env_mask) == sampled
    assert unsampled_trained(trajectory, trajectory.env_mask, [end]) == 0


def test_codex_turn_is_served_and_its_history_extends_the_segment_token_for_token(qwen):
    async def agent(endpoint, **row):
        refused = await post(endpoint, "/responses", fixture("codex_turn"))  # web_search left on: refused
        first = await post(endpoint, "/responses", without_web_search(fixture("codex_turn")))
        second = await post(endpoint, "/responses", without_web_search(fixture("codex_tool_output")))
        return refused, sse(first), sse(second)

    ro, tok, gen, end = scripted_rollout(qwen, agent, EXEC)
    [t] = ro.run([{}], gen)
    refused, first, second = t.agent_output
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools[8]"
    assert "'web_search' tools are not served" in refused.json()["error"]["message"]
    assert [e["sequence_number"] for e in first] == list(range(len(first)))
    assert [e["type"] for e in first] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    call = first[-2]["item"]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == (
        "function_call", "exec_command", {"cmd": "echo hi > hello.txt"})
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "Done."
    assert t.stop_reason == "terminated" and len(t.segments) == 1 and t.num_turns == 2 and not t.auxiliary
    assert "Process exited with code 0" in t.observations[0]
    assert_token_exact(t, end)
    # the recorded ids are the chat template's own rendering of the whole conversation Codex sent, and the reply
    tools, _ = chat_tools(without_web_search(fixture("codex_tool_output"))["tools"])
    rendered = encode_conversation(ro.encoder, t.prompt + t.messages, tools)
    assert t.prompt_ids + t.completion_ids == rendered[:len(t.prompt_ids) + len(t.completion_ids)]
    ro.close()


def test_codex_namespace_functions_are_rendered_and_their_calls_answered_with_the_namespace(qwen):
    turn = without_web_search(fixture("codex_turn"))
    answered = fixture("codex_namespace_output")["input"][4:]  # Codex's namespaced call and its output, as it sent them
    assert [item["type"] for item in answered] == ["function_call", "function_call_output"]

    async def agent(endpoint, **row):
        first = await post(endpoint, "/responses", turn)
        second = await post(endpoint, "/responses", {**turn, "input": turn["input"] + answered})
        return sse(first), sse(second)

    ro, tok, gen, end = scripted_rollout(qwen, agent, CLOSE_AGENT)
    [t] = ro.run([{}], gen)
    first, _ = t.agent_output
    added, done = first[2]["item"], first[-2]["item"]
    assert (done["namespace"], done["name"], json.loads(done["arguments"])) == (
        "multi_agent_v1", "close_agent", {"target": "nobody"})
    assert (added["namespace"], added["name"], added["arguments"]) == ("multi_agent_v1", "close_agent", "")
    prompt = tok.decode(t.prompt_ids)
    assert '"name": "multi_agent_v1.close_agent"' in prompt and "Tools for spawning and managing sub-agents." in prompt
    assert len(t.segments) == 1 and t.num_turns == 2  # Codex's namespaced call in its history matched the record
    assert "invalid agent id nobody" in t.observations[0]
    assert_token_exact(t, end)
    ro.close()


def test_codex_custom_tool_is_a_string_function_and_its_call_a_custom_tool_call(qwen):
    async def agent(endpoint, **row):
        first = await post(endpoint, "/responses", fixture("codex_catalog_turn"))
        second = await post(endpoint, "/responses", fixture("codex_custom_tool_output"))
        return sse(first), sse(second)

    ro, tok, gen, end = scripted_rollout(qwen, agent, APPLY_PATCH)
    [t] = ro.run([{}], gen)
    first, _ = t.agent_output
    assert [e["type"] for e in first][3:5] == ["response.custom_tool_call_input.delta",
                                              "response.custom_tool_call_input.done"]
    item = first[-2]["item"]
    assert (item["type"], item["name"], item["input"]) == ("custom_tool_call", "apply_patch", PATCH)
    assert "lark grammar" in tok.decode(t.prompt_ids)  # the grammar is shown to the model, in the tool's schema
    assert len(t.segments) == 1 and t.num_turns == 2 and "A hello.txt" in t.observations[0]
    assert_token_exact(t, end)
    ro.close()


@pytest.mark.parametrize("trained", [False, True])
def test_codex_compaction_is_an_auxiliary_call_kept_out_of_training_unless_asked(qwen, trained):
    async def agent(endpoint, **row):
        return sse(await post(endpoint, "/responses", fixture("codex_compaction")))

    ro, tok, gen, end = scripted_rollout(qwen, agent, "Summary: hello.txt was created.", train_auxiliary=trained)
    [t] = ro.run([{}], gen)
    assert t.agent_output[-1]["type"] == "response.completed"
    assert t.events["auxiliary"] == 1 and agent_sums([t])["agent/auxiliary"] == 1
    assert (len(t.segments), len(t.auxiliary)) == ((1, 0) if trained else (0, 1))
    assert [len(row.turn_spans) for row in t.training_rows()] == ([1] if trained else [0])
    ro.close()


def test_claude_code_layout_is_served_and_its_history_extends_the_segment(qwen):
    async def agent(endpoint, **row):
        origin = endpoint.base_url.removesuffix("/v1")
        async with httpx.AsyncClient(timeout=30) as http:
            health = [(await http.head(origin.split("/t/")[0] + "/")).status_code, (await http.get(origin)).status_code]
        counted = (await post(endpoint, "/messages/count_tokens", fixture("claude_turn"))).json()
        first = await post(endpoint, "/messages?beta=true", fixture("claude_turn"))
        second = await post(endpoint, "/messages?beta=true", fixture("claude_tool_result"))
        return health, counted, sse(first), sse(second)

    ro, tok, gen, end = scripted_rollout(qwen, agent, BASH)
    [t] = ro.run([{}], gen)
    health, counted, first, second = t.agent_output
    assert health == [200, 200] and counted == {"input_tokens": len(t.prompt_ids)}
    assert [e["type"] for e in first] == ["message_start", "content_block_start", "content_block_delta",
                                          "content_block_stop", "message_delta", "message_stop"]
    assert first[1]["content_block"]["name"] == "Bash" and first[4]["delta"]["stop_reason"] == "tool_use"
    assert json.loads(first[2]["delta"]["partial_json"]) == {"command": "echo hi > hello.txt",
                                                            "description": "create file"}
    assert second[2]["delta"] == {"type": "text_delta", "text": "Done."}
    prompt = tok.decode(t.prompt_ids)  # the mid-conversation system message, where Claude Code put it
    assert prompt.index("Create a file hello.txt") < prompt.index("<|im_start|>system\nAvailable agent types")
    assert len(t.segments) == 1 and t.num_turns == 2 and t.observations[0] and not t.auxiliary
    assert_token_exact(t, end)
    ro.close()


def test_claude_code_title_and_quota_check_are_auxiliary(qwen):
    quota = {"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}

    async def agent(endpoint, **row):
        title = (await post(endpoint, "/messages", {**fixture("claude_title"), "stream": False})).json()
        return title, (await post(endpoint, "/messages", quota)).json()

    ro, tok, gen, end = scripted_rollout(qwen, agent, BASH)
    [t] = ro.run([{}], gen)
    title, checked = t.agent_output
    assert title["content"][0]["text"] == '{"title": "Create hello file"}'
    assert len(checked["token_ids"]) == 1 and checked["stop_reason"] == "max_tokens"
    assert t.events["auxiliary"] == 2 and len(t.auxiliary) == 2 and not t.segments
    ro.close()


def test_auxiliary_kinds_of_the_logged_requests():
    kinds = {name: auxiliary_kind(fixture(name)) for name in (
        "codex_turn", "codex_tool_output", "codex_compaction", "claude_turn", "claude_tool_result", "claude_title")}
    assert kinds == {"codex_turn": None, "codex_tool_output": None, "codex_compaction": "compaction",
                     "claude_turn": None, "claude_tool_result": None, "claude_title": "structured_output"}
    one_token = {"max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
    assert auxiliary_kind(one_token) == "quota_check"
    assert auxiliary_kind({**one_token, "tools": fixture("claude_turn")["tools"]}) is None  # an agent's own step
    assert auxiliary_kind({**one_token, "max_tokens": True, "client_metadata": {"x-codex-turn-metadata": "{"}}) is None


HOSTILE = {  # (path, body, the field named)
    "hosted tool": ("/responses", {"input": "hi", "tools": [{"type": "file_search"}]}, "tools[0]"),
    "hosted tool in a namespace": ("/responses", {"input": "hi", "tools": [
        {"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0]"),
    "empty namespace": ("/responses", {"input": "hi", "tools": [{"type": "namespace", "name": "ns", "tools": []}]},
                        "tools[0].tools"),
    "namespace name too long": ("/responses", {"input": "hi", "tools": [{"type": "namespace", "name": "n" * 40, "tools": [
        {"type": "function", "name": "f" * 40, "parameters": {}}]}]}, "tools[0].tools[0]"),
    "custom tool format": ("/responses", {"input": "hi", "tools": [
        {"type": "custom", "name": "x", "format": {"type": "regex"}}]}, "tools[0].format"),
    "a name given twice": ("/responses", {"input": "hi", "tools": [{"type": "function", "name": "x", "parameters": {}},
                                                                   {"type": "custom", "name": "x"}]}, "tools"),
    "local shell call": ("/responses", {"input": [{"type": "local_shell_call", "call_id": "c", "action": {}}]},
                         "input[0].type"),
    "custom call without input": ("/responses", {"input": [{"type": "custom_tool_call", "call_id": "c", "name": "x"}]},
                                  "input[0].input"),
    "namespace not a string": ("/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "x",
                                                         "arguments": "{}", "namespace": 5}]}, "input[0].namespace"),
    "image output": ("/responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
    "history edit": ("/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                                   "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
                     "context_management.edits[0]"),
    "tool role": ("/messages", {"max_tokens": 8, "messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
    "image tool result": ("/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]},
                          "messages[0].content[0].content"),
    "server tool": ("/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                                  "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    "output_config": ("/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                                    "output_config": "json"}, "output_config"),
}


@pytest.mark.adversarial
def test_shapes_the_endpoint_cannot_honour_are_refused_in_one_line(qwen):
    async def agent(endpoint, **row):
        return {name: await post(endpoint, path, body) for name, (path, body, _) in HOSTILE.items()}

    ro, tok, gen, end = scripted_rollout(qwen, agent, "hi")
    [t] = ro.run([{}], gen)
    for name, (_, _, param) in HOSTILE.items():
        answer = t.agent_output[name]
        assert answer.status_code == 400, (name, answer.text)
        error = answer.json()["error"]
        assert error["param"] == param and "\n" not in error["message"], (name, error)
    assert t.events["bad_request"] == len(HOSTILE) and t.requests == 0
    ro.close()
