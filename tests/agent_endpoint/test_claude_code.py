"""Claude Code (``@anthropic-ai/claude-code@2.1.197``, ``claude -p``) run unchanged against the endpoint, one process
per row of one round, its model scripted: its health check, its message layout (the mid-conversation system message,
cached blocks, tool results), its Bash tool run through the model's call in its working directory, and, with its
non-essential traffic on, its session-title call answered as an auxiliary call. Each trajectory is token-exact (the
mask audit is 0). Skipped when ``claude`` is not on ``PATH`` (:mod:`cli_runs`)."""

from __future__ import annotations

import json

from cli_runs import made, needs_claude, run_claude, scratch_workdir
from helpers import ScriptedGenerator
from test_cli_requests import BASH, assert_token_exact

from trl_agentic.agents import AgentRollout
from trl_agentic.rollout.config import RolloutConfig


async def claude_agent(endpoint, nonessential, **row):
    workdir = scratch_workdir("claude-")
    status, output = await run_claude(endpoint, workdir, "Create a file hello.txt containing hi", nonessential)
    return status, output, made(workdir / "hello.txt")


@needs_claude
def test_claude_code_runs_its_bash_tool_through_the_scripted_call(qwen):
    tok = qwen.load_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(ids):
        text = tok.decode(ids)
        if "sentence-case title" in text:  # Claude Code's session title, asked beside the task
            return '{"title": "Create hello file"}<|im_end|>'
        return ("Done." if "<tool_response>" in text else BASH) + "<|im_end|>"

    config = RolloutConfig(max_turns=6, max_tokens_per_turn=128, max_completion_length=4096, env_timeout=90)
    ro = AgentRollout(claude_agent, tok, config, [end])
    quiet, chatty = ro.run([{"nonessential": False}, {"nonessential": True}], ScriptedGenerator(tok, script))
    ro.close()
    for t in (quiet, chatty):
        status, output, written = t.agent_output
        result = json.loads(output[output.index("{"):output.rindex("}") + 1])
        assert status == 0 and result["result"] == "Done." and result["num_turns"] == 2, output[-2000:]
        assert written == "hi\n" and t.refusal is None
        assert len(t.segments) == 1 and t.num_turns == 2 and t.observations[0]
        assert_token_exact(t, end)
    assert not quiet.auxiliary and quiet.events.get("auxiliary", 0) == 0
    [title] = chatty.auxiliary
    assert chatty.events["auxiliary"] == 1 and "sentence-case title" in tok.decode(title.prompt_ids)
