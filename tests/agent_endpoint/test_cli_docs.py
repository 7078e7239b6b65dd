"""docs/agents.md, "Train the CLI agent you already use": each of its blocks (one per CLI, fenced ```py so that the
docs' shared runner, tests/test_readme_blocks.py, which cannot install a CLI, leaves them here) runs as written, in
a fresh directory, offline, and trains two steps; a block whose CLI is not installed is skipped, naming the command
that installs it. Every ```py block of the file is one of these."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from trl_agentic.cli_agents.presets import CLAUDE_CODE_VERSION, CODEX_VERSION, MINI_VERSION

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
BLOCK = re.compile(r"^```py\n(.*?)^```", re.S | re.M)
CLIS = {"mini_swe_agent": ("mini", f"pip install mini-swe-agent=={MINI_VERSION}"),
        "codex": ("codex", f"npm install --prefix DIR @openai/codex@{CODEX_VERSION}, DIR/node_modules/.bin on PATH"),
        "claude_code": ("claude", f"npm install --prefix DIR @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}, "
                                  "DIR/node_modules/.bin on PATH")}


def blocks() -> dict[str, str]:
    """The section's blocks, by the preset each imports."""
    found = {}
    for block in BLOCK.findall(DOC.read_text(encoding="utf-8")):
        preset = re.search(r"from trl_agentic\.cli_agents import (\w+)", block).group(1)
        found[preset] = block
    return found


def test_each_cli_has_one_block():
    assert list(blocks()) == list(CLIS)


@pytest.mark.parametrize("preset", list(CLIS))
def test_the_block_runs_as_written(preset, tmp_path, monkeypatch):
    executable, install = CLIS[preset]
    if shutil.which(executable) is None:
        pytest.skip(f"{executable} is not installed: {install}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__agents__"}
    exec(compile(blocks()[preset], f"docs/agents.md, the {preset} block", "exec"), namespace)  # noqa: S102 - our docs
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    logged = [e for e in trainer.state.log_history if "rewards/tests_pass/mean" in e]
    assert logged and all(e["rewards/tests_pass/mean"] == 0.0 for e in logged)  # the random model fixes nothing
    assert all(e["agentic/env_error_per_trajectory"] == e["agentic/env_timeout_per_trajectory"] == 0 for e in logged)
