"""TRL's GRPO script with our trainers: run as TRL ships it with ``trl.GRPOTrainer`` reassigned, and through our
``trl-agentic grpo`` / ``trl-agentic ppo`` command (``trl_agentic/cli.py``): TRL's flags and ``--config`` YAML plus
ours, end to end on a tiny local model and a local dataset file."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trl

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
