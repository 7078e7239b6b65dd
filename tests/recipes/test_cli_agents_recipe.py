"""recipes/cli_agents.py: its documented commands parse, a CLI that is not installed is one line, and it trains a
step with mini-swe-agent on the tiny Qwen2.5 model (random: its runs fail the tests), evaluating before and
after."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_recipes import CONFIGS, RECIPES, REPO, _command_lines, load_recipe

from trl_agentic.cli_agents.presets import mini_script
from trl_agentic.scripts import parse_args


def test_the_documented_commands_parse():
    commands = _command_lines(load_recipe("cli_agents").__doc__, "cli_agents")
    assert len(commands) == 3
    for argv in commands:
        argv = [a.replace("recipes/", str(RECIPES) + "/", 1) for a in argv]
        script_args, training, _ = parse_args(load_recipe("cli_agents").CLIAgentsScriptArguments, [*argv, "--use_cpu"])
        assert script_args.cli in ("mini-swe-agent", "codex", "claude-code") and training.max_turns == 10


def test_a_cli_that_is_not_installed_is_one_line(tmp_path):
    argv = [sys.executable, str(RECIPES / "cli_agents.py"), "--config", str(CONFIGS / "cli_agents_grpo.yaml"),
            "--model_name_or_path", "Qwen/Qwen2.5-1.5B-Instruct", "--cli", "codex", "--cli_executable",
            str(tmp_path / "codex"), "--output_dir", str(tmp_path / "out"), "--use_cpu", "--bf16", "false"]
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: Codex CLI is not installed at {tmp_path / 'codex'}: npm install --prefix DIR @openai/codex@0.169.0 "
        "(DIR/node_modules/.bin on PATH)")


@pytest.mark.skipif(mini_script() is None, reason="mini-swe-agent is not installed: pip install "
                    "mini-swe-agent==2.4.6")
def test_one_step_with_mini_swe_agent(tmp_path, capsys):
    from conventions import build_convention

    from trl_agentic.scripts import run

    qwen = build_convention("qwen2.5-instruct")

    out = tmp_path / "out"
    argv = ["--config", str(CONFIGS / "cli_agents_grpo.yaml"), "--model_name_or_path", qwen.model_dir,
            "--output_dir", str(out), "--use_cpu", "--bf16", "false", "--dtype", "float32", "--use_peft", "false",
            "--gradient_checkpointing", "false", "--max_steps", "1", "--num_tasks", "1", "--eval_tasks", "1",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_turns", "2",
            "--max_tokens_per_turn", "16", "--max_completion_length", "256"]
    recipe = load_recipe("cli_agents")
    assert run(recipe.main, recipe.CLIAgentsScriptArguments, argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary == {"cli": "mini-swe-agent", "steps": 1, "solved_before": 0.0, "solved_after": 0.0}
    printed = capsys.readouterr().out
    assert "before   accuracy 0.000" in printed and "after    accuracy 0.000" in printed
