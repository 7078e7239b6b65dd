"""TRL's GRPO script with our trainers: run as TRL ships it with ``trl.GRPOTrainer`` reassigned, and through our
``trl-agentic grpo`` / ``trl-agentic ppo`` command (``trl_agentic/cli.py``): TRL's flags and ``--config`` YAML plus
ours, end to end on a tiny local model and a local dataset file."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import trl
from forkserver import run_python

ROOT = Path(__file__).resolve().parents[1]


def _dataset_dir(tmp_path: Path, conversational: bool = False, n: int = 8) -> str:
    """A local dataset folder (one JSON-lines file) that ``datasets.load_dataset(folder)`` reads as split ``train``."""
    from trl_agentic.toy import make_lookup_dataset

    folder = tmp_path / "data"
    folder.mkdir()
    with open(folder / "train.jsonl", "w", encoding="utf-8") as f:
        for row in make_lookup_dataset(n, conversational=conversational):
            f.write(json.dumps(row) + "\n")
    return str(folder)


def _small_run_flags(out: Path) -> list[str]:
    return ["--output_dir", str(out), "--per_device_train_batch_size", "4", "--num_generations", "2",
            "--max_completion_length", "32", "--logging_steps", "1", "--report_to", "none", "--use_cpu",
            "--save_strategy", "no", "--seed", "0"]


def test_trl_script_runs_with_trl_grpo_trainer_reassigned(tiny_model_dir, tmp_path, monkeypatch):
    """A user's ``trl.GRPOTrainer = AgenticGRPOTrainer`` before TRL's own script: the trainer is built (our argument
    checks bind against TRL's class, not against whatever ``trl.GRPOTrainer`` names now) and trains."""
    from trl_agentic import AgenticGRPOTrainer

    built = []

    class Recording(AgenticGRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(trl, "GRPOTrainer", Recording)
    monkeypatch.chdir(tmp_path)
    argv = ["grpo.py", "--model_name_or_path", tiny_model_dir, "--dataset_name", _dataset_dir(tmp_path),
            "--reward_funcs", "trl_agentic.toy.lookup_reward", "--max_steps", "1", *_small_run_flags(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_module("trl.scripts.grpo", run_name="__main__")
    assert len(built) == 1 and built[0].state.global_step == 1
    assert (tmp_path / "out" / "model.safetensors").exists()


def _cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    return run_python(["-m", "trl_agentic.cli", *args], env=env, cwd=cwd, timeout=timeout)


def test_console_script_is_declared():
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^trl-agentic = "trl_agentic\.cli:main"', section, re.MULTILINE), section
    from trl_agentic import cli

    assert callable(cli.main)


def test_help_lists_the_commands_and_every_flag(capsys):
    from trl_agentic import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert exit_.value.code == 0 and "usage: trl-agentic" in top and "grpo" in top and "ppo" in top
    for command, own in (("grpo", "--kl_estimator"), ("ppo", "--vf_coef")):
        with pytest.raises(SystemExit) as exit_:
            cli.main([command, "--help"])
        out = capsys.readouterr().out
        assert exit_.value.code == 0 and f"usage: trl-agentic {command}" in out
        flags = ("--config", "--model_name_or_path", "--dataset_name", "--reward_funcs", "--lora_r",  # TRL's
                 "--environment", "--tools", "--environment_factory", "--agent", "--rollout_mode", "--max_turns",
                 own)  # ours
        assert [f for f in flags if f not in out] == []


@pytest.mark.parametrize("argv, message", [
    (["grpo", "--use_cpu", "--environment", "no_such_module.Env"], "--environment no_such_module.Env: cannot import"),
    (["grpo", "--use_cpu", "--tools", "trl_agentic.toy.no_such_tool"], "module trl_agentic.toy has no"),
    (["grpo", "--use_cpu", "--environment", "Env"], "is not a dotted import path"),
    (["grpo", "--use_cpu", "--no_such_flag", "1"], "not used by the HfArgumentParser"),
    (["grpo", "--config", "missing.yaml"], "missing.yaml"),
    (["grpo", "--use_cpu", "--config", str(ROOT / "recipes" / "configs" / "gsm8k_tools_grpo.yaml")],
     "algo, max_eval_samples, tool, format_weight, tool_weight, sandbox_timeout, sandbox_pool_size are no flag of "
     "trl-agentic grpo; it is recipes/gsm8k_tools.py's: run python recipes/gsm8k_tools.py --config"),
])
def test_a_bad_setting_is_one_line_and_status_2(tmp_path, monkeypatch, capsys, argv, message):
    from trl_agentic import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_object puts the current directory on it
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    cpu_note = [line for line in err if line.startswith("no GPU: running on the CPU")]  # without --use_cpu
    assert len(err) == 1 + len(cpu_note) and err[-1].startswith("error: ") and message in err[-1], err


def test_an_unknown_command_is_refused(capsys):
    from trl_agentic import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["dpo"])
    assert exit_.value.code == 2 and "invalid choice: 'dpo'" in capsys.readouterr().err


def test_grpo_with_an_environment_from_config_and_flags(tiny_model_dir, tmp_path):
    """TRL's script trains our trainer with our environment: the YAML sets TRL's and our fields, a flag overrides one
    of them, and every trajectory follows both."""
    config = tmp_path / "grpo.yaml"
    config.write_text("\n".join([
        f"model_name_or_path: {tiny_model_dir}", f"dataset_name: {_dataset_dir(tmp_path)}",
        "reward_funcs: [trl_agentic.toy.lookup_reward]", "environment: trl_agentic.toy.LookupEnvironment",
        "max_turns: 2", "max_tokens_per_turn: 8", "kl_estimator: k2", "beta: 0.01", "max_steps: 2", ""]))
    out_dir = tmp_path / "out"
    run = _cli("grpo", "--config", str(config), "--max_tokens_per_turn", "6", "--trajectory_dir",
               str(out_dir / "traj"), *_small_run_flags(out_dir), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out_dir / "model.safetensors").exists()
    rows = [json.loads(line) for line in (out_dir / "traj" / "trajectories-rank0.jsonl").read_text().splitlines()]
    assert len(rows) == 8  # 2 steps of 4 trajectories (2 prompts x 2 generations)
    assert {row["step"] for row in rows} == {0, 1}
    assert max(row["num_turns"] for row in rows) == 2  # max_turns from the YAML; the random policy uses both
    assert all(b - a <= 6 for row in rows for a, b in row["turn_spans"])  # the flag overrode the YAML's 8
    assert any(obs and obs.startswith("<result>") for row in rows for obs in row["observations"])


def test_ppo_with_tools(tmp_path):
    """``trl-agentic ppo`` with TRL's ``tools=`` from ``--tools``: the tool's schema reaches the prompt (Qwen2.5's
    real template), the critic is trained and saved beside the model."""
    from conventions import build_convention

    qwen = build_convention("qwen2.5-instruct")
    (tmp_path / "cli_tools.py").write_text(
        'def lookup(key: str) -> str:\n    """Look up the value stored under a key.\n\n    Args:\n'
        '        key: The key to look up.\n    """\n    return "7"\n\n\n'
        "def answered(completions, **kwargs):\n    return [float('7' in str(c)) for c in completions]\n")
    out_dir = tmp_path / "out"
    run = _cli("ppo", "--model_name_or_path", qwen.model_dir, "--dataset_name", _dataset_dir(tmp_path, True),
               "--reward_funcs", "cli_tools.answered", "--tools", "cli_tools.lookup", "--rollout_mode", "chat",
               "--max_turns", "2", "--max_tokens_per_turn", "32", "--max_steps", "1", "--trajectory_dir",
               str(out_dir / "traj"), *_small_run_flags(out_dir), "--num_generations", "1",
               "--per_device_train_batch_size", "2", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out_dir / "model.safetensors").exists() and (out_dir / "critic").is_dir()
    rows = [json.loads(line) for line in (out_dir / "traj" / "trajectories-rank0.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    prompt = qwen.tokenizer.decode(rows[0]["prompt_ids"])
    assert "Look up the value stored under a key." in prompt and '"name": "lookup"' in prompt


def test_grpo_with_an_agent(tmp_path):
    """``trl-agentic grpo --agent``: the trainers' agent= from a dotted path, trained through the endpoint."""
    from conventions import build_convention

    qwen = build_convention("qwen2.5-instruct")
    (tmp_path / "cli_agent.py").write_text(
        "async def agent(client, prompt, **row):\n"
        "    response = await client.chat.completions.create(model='policy', messages=prompt, max_tokens=8)\n"
        "    return response.choices[0].message.content\n\n\n"
        "def answered(completions, agent_output, value, **kwargs):\n"
        "    return [float(str(v) in (out or '')) for out, v in zip(agent_output, value)]\n")
    out_dir = tmp_path / "out"
    run = _cli("grpo", "--model_name_or_path", qwen.model_dir, "--dataset_name", _dataset_dir(tmp_path, True),
               "--reward_funcs", "cli_agent.answered", "--agent", "cli_agent.agent", "--max_steps", "1",
               "--trajectory_dir", str(out_dir / "traj"), *_small_run_flags(out_dir), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (out_dir / "traj" / "trajectories-rank0.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(row["num_turns"] == 1 for row in rows)


def test_on_a_cpu_the_cpu_flags_are_added_and_said_in_one_line(monkeypatch, capsys):
    """Without --use_cpu on a machine with no GPU: --use_cpu true --bf16 false --dtype float32, as the recipes add
    them (TRL's bf16 default would stop on transformers' "doesn't support bf16/gpu"); each flag given is kept."""
    from trl_agentic import cli, device

    monkeypatch.setattr(device, "has_accelerator", lambda: False)
    _, training, model, _ = cli.parse_arguments("grpo", ["--model_name_or_path", "m", "--output_dir", "out"])
    assert training.use_cpu and training.bf16 is False and model.dtype == "float32"
    assert capsys.readouterr().err == ("no GPU: running on the CPU (--use_cpu true --bf16 false --dtype float32 added;"
                                       " pass --use_cpu yourself to choose)\n")
    _, training, model, _ = cli.parse_arguments("ppo", ["--model_name_or_path", "m", "--dtype", "bfloat16"])
    assert training.use_cpu and model.dtype == "bfloat16" and "(--use_cpu true --bf16 false added" in \
        capsys.readouterr().err


def test_on_a_cpu_a_typo_in_a_dotted_path_is_the_error(tmp_path, monkeypatch, capsys):
    """The CPU flags no longer hide it: a --tools typo is reported, in one line, before anything is loaded."""
    from trl_agentic import cli, device

    monkeypatch.setattr(device, "has_accelerator", lambda: False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["grpo", "--tools", "trl_agentic.toy.no_such_tool"]) == 2
    note, error = capsys.readouterr().err.splitlines()
    assert note.startswith("no GPU: running on the CPU")
    assert error == "error: --tools trl_agentic.toy.no_such_tool: module trl_agentic.toy has no 'no_such_tool'; " \
                    "pass one of its names"


def test_a_trainer_construction_check_is_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Native tool calls on a model whose chat template has no tool calls TRL can parse (the ChatML of the tests'
    tokenizer): the trainer's check, as one line and status 2, not a traceback out of TRL's script."""
    from trl_agentic import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    argv = ["grpo", "--model_name_or_path", tiny_model_dir, "--dataset_name", _dataset_dir(tmp_path, True),
            "--reward_funcs", "trl_agentic.toy.lookup_reward", "--tools", "trl_agentic.tasks.gsm8k.calculate",
            "--max_steps", "1", *_small_run_flags(tmp_path / "out")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: native tool calls need a response template"), err
    assert "Traceback" not in err
