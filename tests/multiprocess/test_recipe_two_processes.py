"""A recipe launched as documented, ``accelerate launch --config_file recipes/accelerate/<x>.yaml recipes/<recipe>.py
--config ...``, with two CPU processes: it trains, evaluates and saves once."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import accelerate_launch

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("launch_config", ["multi_gpu.yaml", "fsdp.yaml"])  # DDP and FSDP2, over gloo
def test_gsm8k_recipe_two_processes(tmp_path, tiny_model_dir, launch_config):
    out = tmp_path / "out"
    # as tests/multiprocess/test_two_ranks.py: accelerate's torchrun launcher starts two processes, which use gloo
    # on CPU because the trainer config says use_cpu; the launch config's bf16 is overridden for the CPU
    cmd = [*accelerate_launch(), "--config_file", str(REPO / "recipes/accelerate" / launch_config),
           "--num_processes", "2", "--mixed_precision", "no",
           str(REPO / "recipes/gsm8k_tools.py"), "--config", str(REPO / "recipes/configs/gsm8k_tools_grpo.yaml"),
           "--model_name_or_path", tiny_model_dir,
           "--dataset_name", str(REPO / "tests/recipes/fixtures/gsm8k_small.jsonl"),
           "--tool", "calculator", "--use_cpu", "--bf16", "false", "--dtype", "float32", "--use_peft", "false",
           "--max_steps", "1", "--num_generations", "2", "--per_device_train_batch_size", "2",
           "--max_completion_length", "48", "--max_tokens_per_turn", "16", "--max_turns", "2",
           "--max_eval_samples", "4", "--per_device_eval_batch_size", "2", "--save_strategy", "no",
           "--gradient_checkpointing", "false", "--output_dir", str(out), "--trajectory_dir", str(out / "traj")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()
    assert proc.stdout.count("saved to") == 1  # printed by the main process only
    for rank in range(2):  # each process rolled out its share of the batches (2 of 4 completions per round)
        rows = [json.loads(line) for line in (out / "traj" / f"trajectories-rank{rank}.jsonl").read_text().splitlines()]
        assert len(rows) % 2 == 0 and rows and all("advantage" in row for row in rows)
    assert proc.stdout.count("'eval_reward'") == 2  # before and after training
