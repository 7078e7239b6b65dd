"""recipes/rft.py: TRL's parser over the YAML config, and rounds of rejection sampling then SFTTrainer (tiny random
Qwen2 and the toy tokenizer, CPU, the GSM8K fixture with the calculator)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from test_recipes import FIXTURES, RECIPES, REPO, _command_lines, load_recipe

CONFIG = RECIPES / "configs" / "rft_gsm8k_tools.yaml"


def test_config_keys_are_flags_and_parse():
    recipe = load_recipe("rft")
    parser = recipe.make_parser()
    flags = {name.lstrip("-") for name in parser._option_string_actions}
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert set(config) <= flags, set(config) - flags
    script_args, gsm8k_args, _, sft_args, model_args = parser.parse_args_and_config(
        args=["--config", str(CONFIG), "--rounds", "3", "--use_cpu", "--bf16", "false"])
    assert (script_args.rounds, script_args.samples_per_row, gsm8k_args.tool) == (3, 8, "python")  # flag over YAML
    assert model_args.use_peft and sft_args.learning_rate == 1e-4
    assert {f.name for f in dataclasses.fields(recipe.RFTScriptArguments)} >= {"success_threshold", "max_per_row"}


def test_documented_commands_parse():
    sources = [load_recipe("rft").__doc__, (REPO / "docs" / "sft.md").read_text(encoding="utf-8"),
               (REPO / "docs" / "guide.md").read_text(encoding="utf-8")]
    commands = [c for text in sources for c in _command_lines(text, "rft")]
    assert len(commands) >= 4
    for argv in commands:
        argv = [a.replace("recipes/", str(RECIPES) + "/", 1) for a in argv]
        load_recipe("rft").make_parser().parse_args_and_config(args=[*argv, "--use_cpu", "--bf16", "false"])


def _argv(model_dir: str, out: Path, *extra: str) -> list[str]:
    return [
        "--config", str(CONFIG), "--model_name_or_path", model_dir, "--output_dir", str(out),
        "--dataset_name", str(FIXTURES / "gsm8k_small.jsonl"), "--tool", "calculator", "--max_train_samples", "2",
        "--use_cpu", "--bf16", "false", "--dtype", "float32", "--gradient_checkpointing", "false",
        "--lora_target_modules", "q_proj", "v_proj", "--lora_r", "4", "--lora_alpha", "8",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--learning_rate", "1e-2",
        "--samples_per_row", "2", "--rounds", "2", "--max_turns", "2", "--max_tokens_per_turn", "8",
        "--max_completion_length", "24", "--max_observation_tokens", "16", "--rollout_batch_size", "4", *extra,
    ]


def _lora_b(out: Path) -> list:
    from safetensors.torch import load_file

    weights = load_file(str(out / "adapter_model.safetensors"))
    return [w for name, w in weights.items() if "lora_B" in name]


def test_rounds_train_on_the_accepted_trajectories(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "rft"
    # threshold 0: every scored trajectory of the random model is accepted (the task's success is 0 or 1)
    assert load_recipe("rft").run(_argv(tiny_model_dir, out, "--success_threshold", "0")) == 0
    log = capsys.readouterr().out
    assert log.count("kept 2") == 2  # one per row (max_per_row 1), in each round
    assert (out / "round-0").is_dir() and (out / "round-1").is_dir()
    lora_b = _lora_b(out)
    assert lora_b and any(w.abs().sum() > 0 for w in lora_b)  # B starts at zero: it trained


def test_nothing_accepted_trains_nothing(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "rft"
    # the random model never answers right: nothing passes threshold 1, no round trains
    assert load_recipe("rft").run(_argv(tiny_model_dir, out, "--rounds", "1")) == 0
    assert "kept 0" in capsys.readouterr().out
    assert not (out / "round-0").exists()
    assert all(w.abs().sum() == 0 for w in _lora_b(out))


@pytest.mark.skipif(torch.cuda.is_available(), reason="8-bit quantization runs on a CUDA GPU")
def test_quantization_is_one_line_error(tiny_model_dir, tmp_path, capsys):
    """8-bit needs CUDA (4-bit runs on bitsandbytes' CPU backend: tests/trainers/test_qlora.py)."""
    assert load_recipe("rft").run(_argv(tiny_model_dir, tmp_path, "--load_in_8bit")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --load_in_8bit") and "\n" not in err
