"""Claude Code (2.1.197, ``claude -p``, unchanged) trained two steps with both trainers on a coding task: the
scripted model writes its ``Bash`` call, Claude Code runs it in its working directory (under bubblewrap when it
works here), the row's tests pass there, token-exact. Its own system prompt and tools are over 57,000 tokens of the
tiny model's tokenizer: ``short_prompt=True`` (a short system prompt, the Bash tool alone) brings them to about
2,700 (``docs/agents.md``). Skipped, with the command, when ``claude`` is not on ``PATH``."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_training import FIX, check_trained, cli_trainer

from trl_agentic.cli_agents import claude_code
from trl_agentic.cli_agents.presets import CLAUDE_CODE_VERSION

pytestmark = pytest.mark.skipif(shutil.which("claude") is None, reason=(
    f"claude is not installed: npm install --prefix DIR @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}, "
    "DIR/node_modules/.bin on PATH"))

BASH = "<tool_call>\n" + json.dumps({"name": "Bash", "arguments": {"command": FIX, "description": "fix"}}) + \
    "\n</tool_call>"


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_claude_code_trains_two_steps(qwen, tmp_path, trainer_name):
    agent = claude_code(short_prompt=True, timeout=300)
    trainer, runs, recording = cli_trainer(qwen, tmp_path, trainer_name, agent, [BASH, "Done."])
    trainer.train()
    check_trained(trainer, runs, recording, requests=2)
    for t in runs:
        result = json.loads(t.agent_output.stdout)
        assert t.agent_output.exit_code == 0 and result["result"] == "Done." and result["num_turns"] == 2
