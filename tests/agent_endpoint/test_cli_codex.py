"""Codex CLI (0.169.0, ``codex exec``, unchanged) trained two steps with both trainers on a coding task: the
scripted model writes its ``exec_command`` call, Codex runs it in its working directory (under bubblewrap when it
works here), the row's tests pass there, token-exact. Codex's own instructions, skills and tools are over 26,000
tokens of the tiny model's tokenizer: ``short_prompt=True`` brings them to about 4,800 (``docs/agents.md``). Skipped, with the command, when ``codex`` is not on ``PATH``."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_training import FIX, check_trained, cli_trainer

from trl_agentic.cli_agents import codex
from trl_agentic.cli_agents.presets import CODEX_VERSION

pytestmark = pytest.mark.skipif(shutil.which("codex") is None, reason=(
    f"codex is not installed: npm install --prefix DIR @openai/codex@{CODEX_VERSION}, DIR/node_modules/.bin on PATH"))

EXEC = "<tool_call>\n" + json.dumps({"name": "exec_command", "arguments": {"cmd": FIX}}) + "\n</tool_call>"


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_codex_trains_two_steps(qwen, tmp_path, trainer_name):
    agent = codex(short_prompt=True, timeout=300)
    trainer, runs, recording = cli_trainer(qwen, tmp_path, trainer_name, agent, [EXEC, "Done."], positions=8192)
    trainer.train()
    check_trained(trainer, runs, recording, requests=2)
    assert all(t.agent_output.exit_code == 0 and t.agent_output.stdout.strip() == "Done." for t in runs)
