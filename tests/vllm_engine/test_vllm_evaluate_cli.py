"""``python -m trl_agentic.evaluate --use_vllm`` on a real vLLM engine: greedy float32 rollouts equal the
transformers ones, trajectory for trajectory."""

import json
from pathlib import Path

import pytest

from trl_agentic.evaluate.cli import main

pytestmark = pytest.mark.vllm

FIXTURES = Path(__file__).resolve().parents[1] / "recipes" / "fixtures"


def test_use_vllm_gives_the_transformers_greedy_rollouts(vllm_model_dir, tmp_path):
    common = ["--model", vllm_model_dir, "--task", "gsm8k_tools", "--tool", "calculator", "--dataset",
              str(FIXTURES / "gsm8k_small.jsonl"), "--max_rows", "3", "--greedy", "--dtype", "float32",
              "--max_turns", "2", "--max_tokens_per_turn", "16", "--max_completion_length", "64"]
    assert main([*common, "--output_dir", str(tmp_path / "hf")]) == 0
    assert main([*common, "--use_vllm", "--output_dir", str(tmp_path / "vllm")]) == 0

    def rollouts(name):
        rows = [json.loads(line) for line in (tmp_path / name / "trajectories.jsonl").read_text().splitlines()]
        return [(r["prompt_ids"], r["completion_ids"], r["env_mask"]) for r in rows]

    hf, vllm = rollouts("hf"), rollouts("vllm")
    assert len(hf) == 3 and any(len(c) > 0 for _, c, _ in hf)
    assert vllm == hf
    report = json.loads((tmp_path / "vllm" / "report.json").read_text())
    assert report["arguments"]["use_vllm"] is True
