"""Codex CLI (``@openai/codex@0.169.0``, ``codex exec``) run unchanged against the endpoint, one process per row of
one round, its model scripted: it runs the shell command the model calls in its working directory, calls a
namespaced function and its freeform ``apply_patch`` tool, compacts its history when told its context is full, and
shows the endpoint's refusal when it sends a tool the endpoint does not run. Each trajectory is token-exact (the mask
audit is 0). Skipped when ``codex`` is not on ``PATH`` (:mod:`cli_runs`)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runs import made, needs_codex, run_codex, scratch_workdir
from helpers import ScriptedGenerator
from test_cli_requests import APPLY_PATCH, CLOSE_AGENT, EXEC, assert_token_exact

from trl_agentic.agents import AgentRollout
from trl_agentic.rollout.config import RolloutConfig

CATALOG = {"slug": "policy", "display_name": "policy", "description": None, "supported_reasoning_levels": [],
           "shell_type": "shell_command", "visibility": "list", "supported_in_api": True, "priority": 1,
           "upgrade": None, "base_instructions": "You are a coding agent. Use the tools.",
           "supports_reasoning_summaries": False, "support_verbosity": False, "default_verbosity": None,
           "apply_patch_tool_type": "freeform", "truncation_policy": {"mode": "bytes", "limit": 10000},
           "supports_parallel_tool_calls": False, "context_window": 200000, "experimental_supported_tools": []}
"""Codex's model metadata for ``policy`` (``model_catalog_json``): short instructions, the freeform ``apply_patch``
tool, and the context size its compaction reads."""
TURNS = {"shell": EXEC, "namespace": CLOSE_AGENT, "patch": APPLY_PATCH, "compaction": EXEC, "refused": EXEC}


def catalog(path: Path, **fields) -> str:
    """A ``model_catalog_json`` line for Codex's ``config.toml``, the catalog written to ``path``."""
    path.write_text(json.dumps({"models": [{**CATALOG, **fields}]}))
    return f"model_catalog_json = {json.dumps(str(path))}"


async def codex_agent(endpoint, case, **row):
    workdir = scratch_workdir("codex-")
    root = workdir.parent
    extra, web_search = "", "disabled"
    if case == "patch":
        extra = catalog(root / "catalog.json")
    elif case == "compaction":  # every turn past the limit: Codex summarises before its next request
        extra = catalog(root / "catalog.json", auto_compact_token_limit=1000)
    elif case == "refused":
        web_search = "live"
    status, output = await run_codex(endpoint, workdir, f"[{case}] Create hello.txt containing hi", extra, web_search)
    return status, output, made(workdir / "hello.txt")


@needs_codex
def test_codex_runs_the_scripted_calls_in_its_working_directory(qwen):
    tok = qwen.load_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(ids):
        text = tok.decode(ids)
        if "CONTEXT CHECKPOINT COMPACTION" in text:  # Codex's summary request
            return "Summary: the file is created.<|im_end|>"
        if "<tool_response>" in text or "Summary: the file" in text:
            return "Done.<|im_end|>"
        return next(turn for case, turn in TURNS.items() if f"[{case}]" in text) + "<|im_end|>"

    config = RolloutConfig(max_turns=6, max_tokens_per_turn=128, max_completion_length=4096, env_timeout=90)
    ro = AgentRollout(codex_agent, tok, config, [end])
    runs = dict(zip(TURNS, ro.run([{"case": case} for case in TURNS], ScriptedGenerator(tok, script))))
    ro.close()
    for case in ("shell", "namespace", "patch"):
        t = runs[case]
        status, output, written = t.agent_output
        assert status == 0 and t.refusal is None and "Done." in output, (case, output[-2000:])
        assert len(t.segments) == 1 and t.num_turns == 2 and not t.auxiliary, case
        assert written == (None if case == "namespace" else "hi\n"), case
        assert_token_exact(t, end)
    assert "Process exited with code 0" in runs["shell"].observations[0]
    assert "invalid agent id nobody" in runs["namespace"].observations[0]  # Codex ran multi_agent_v1.close_agent
    assert "A hello.txt" in runs["patch"].observations[0]
    compacted = runs["compaction"]
    status, output, written = compacted.agent_output
    assert status == 0 and written == "hi\n" and "context compacted" in output, output[-2000:]
    # the summary call is auxiliary; the conversation Codex opens after it carries the proof headers, so it starts a
    # segment of its own (without them: 409 unproven_sender)
    assert compacted.events["auxiliary"] == 1 and len(compacted.auxiliary) == 1 and len(compacted.segments) == 2
    for segment in compacted.segments:
        assert_token_exact(segment, end)
    refused = runs["refused"]
    status, output, written = refused.agent_output
    assert status != 0 and written is None and "'web_search' tools are not served" in output
    assert refused.refusal.startswith("tools[8]: 'web_search' tools are not served") and not refused.segments
